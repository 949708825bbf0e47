"""The recorder's per-op cost facts: `memlens.opfacts.costs` (shared with the importers), re-exported here
with the compiled recorder's signatures (`memlens.recording.compiled_signatures.compiled_record`)."""
from memlens.opfacts.costs import *  # noqa: F401,F403
from memlens.opfacts.costs import __all__ as _shared
from memlens.recording.compiled_signatures import compiled_record  # noqa: F401

__all__ = [*_shared, "compiled_record"]
