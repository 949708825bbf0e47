"""Moved to `memlens.opfacts.signatures` (shared with the importers); this name stays importable and is that module."""
import sys

from memlens.opfacts import signatures as _moved

sys.modules[__name__] = _moved
