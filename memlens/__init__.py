"""memlens: see what PyTorch memory does, block by block, and what it would do under another plan.

The package import is light: torch, plotly and the analyses load only when first used.
"""
from __future__ import annotations

from memlens._version import __version__
from memlens.errors import InputError, MemlensError
from memlens.trace import Trace

# name -> (module, attribute), resolved on first access so that `import memlens` stays cheap
_LAZY = {
    "load": ("memlens.io.detect", "load"),
    "record": ("memlens.recording", "record"),
    "step": ("memlens.recording", "step"),
    "report": ("memlens.reporting", "report"),
    "diff": ("memlens.analysis.diff", "diff"),
    "categorize": ("memlens.categories", "categorize"),
    "retime": ("memlens.devicetime.retiming", "retime"),
    "onto_kernel_clock": ("memlens.clock", "onto_kernel_clock"),
    "gpus": ("memlens.devicetime.gpus", "gpus"),
    "GPU": ("memlens.devicetime.gpus", "GPU"),
    "calibrate": ("memlens.devicetime.calibration", "calibrate"),
    "load_many": ("memlens.analysis.runs", "load_many"),
    "RunSet": ("memlens.analysis.runs", "RunSet"),
    "predict": ("memlens.prediction", "predict"),
    "fake": ("memlens.prediction", "fake"),
    "max_batch": ("memlens.prediction.sweep", "max_batch"),
    "predict_strategies": ("memlens.prediction.distributed.strategies", "predict_strategies"),
    "advise": ("memlens.advice", "advise"),
    "apply": ("memlens.advice", "apply"),
}

# On a CPU-only torch, `memlens.predict` needs its fake-CUDA shim loaded before torch initialises: when
# memlens is imported first, load it just before torch (cheap; see memlens.prediction.shim).
from memlens.prediction.shim import watch_torch_import as _watch_torch_import  # noqa: E402

_watch_torch_import()


# the public subpackages, imported on first attribute access (as scipy does), so that `memlens.widgets.explore`
# works after a bare `import memlens`; their modules are imported as in any package (`import memlens.analysis.ati`)
_LAZY_SUBPACKAGES = ("analysis", "devicetime", "io", "opfacts", "plan", "prediction", "reporting", "simulate", "swap",
                     "viz", "widgets", "whatif")


def __getattr__(name):
    if name in _LAZY_SUBPACKAGES:
        import importlib
        return importlib.import_module(f"memlens.{name}")
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'memlens' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """`%load_ext memlens`: register the %memlens / %%memlens magics."""
    from memlens.magics import load_ipython_extension as _load
    _load(ipython)


__all__ = ["Trace", "InputError", "MemlensError", "load", "load_many", "RunSet", "record", "step", "report", "diff",
           "categorize", "retime", "onto_kernel_clock", "gpus", "GPU", "calibrate", "predict", "fake", "max_batch", "predict_strategies", "advise", "apply", "__version__"]
