"""Moved to `memlens.opfacts.opinfo` (shared with the importers); this name stays importable and is that module."""
import sys

from memlens.opfacts import opinfo as _moved

sys.modules[__name__] = _moved
