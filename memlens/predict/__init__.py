"""Predict a run's GPU memory without the GPU: fake `cuda` tensors, memlens's recorder, the allocator simulator.

See `memlens.predict.predictor` for how, `memlens.predict.shim` for the CPU-only build of torch, and
`memlens.predict.gpus` for what is modelled explicitly.
"""
from memlens.predict.fake_model import fake
from memlens.predict.gpus import GPUMemoryFacts, gpu_facts, known_gpus
from memlens.predict.oom import OOM
from memlens.predict.api import predict
from memlens.predict.predictor import Prediction, PredictionFailed, active_prediction

__all__ = ["predict", "fake", "Prediction", "PredictionFailed", "OOM", "GPUMemoryFacts", "gpu_facts", "known_gpus",
           "active_prediction"]


import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    """``memlens.predict`` is both this package and the function: calling the package calls `predict`."""

    def __call__(self, *args, **kwargs):
        return predict(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
