"""Moved to `memlens.opfacts.dtypes` (shared with the importers); this name stays importable and is that module."""
import sys

from memlens.opfacts import dtypes as _moved

sys.modules[__name__] = _moved
