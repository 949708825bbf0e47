"""Moved to `memlens.opfacts.flops` (shared with the importers); this name stays importable and is that module."""
import sys

from memlens.opfacts import flops as _moved

sys.modules[__name__] = _moved
