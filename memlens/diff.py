"""`memlens.diff(a, b)`: compare two traces. The comparison lives in `memlens.analysis.diff`, beside the
analyses it draws on, so that `RunSet.diff` (an analysis) need not import a module above it; this module
keeps the public names ``memlens.diff`` and ``memlens.diff.TraceDiff`` where they have always been."""
from __future__ import annotations

import sys
import types

from memlens.analysis.diff import GROUPS, TOP, TraceDiff, diff, match_blocks, pair_devices, signature_fields

__all__ = ["GROUPS", "TOP", "TraceDiff", "diff", "match_blocks", "pair_devices", "signature_fields"]


class _CallableModule(types.ModuleType):
    """``import memlens.diff`` rebinds ``memlens.diff`` from the function to this module; calling the module
    keeps ``memlens.diff(a, b)`` working either way."""

    def __call__(self, a, b, **kwargs) -> TraceDiff:
        return diff(a, b, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
