"""Predict a run's GPU memory without the GPU: fake `cuda` tensors, memlens's recorder, the allocator simulator.

See `memlens.prediction.predictor` for how, `memlens.prediction.shim` for the CPU-only build of torch, and
`memlens.prediction.gpus` for what is modelled explicitly.
"""
from memlens.prediction.fake_model import fake
from memlens.prediction.gpus import GPUMemoryFacts, gpu_facts, known_gpus
from memlens.prediction.oom import OOM
from memlens.prediction.api import predict
from memlens.prediction.predictor import Prediction, PredictionFailed, active_prediction

__all__ = ["predict", "fake", "Prediction", "PredictionFailed", "OOM", "GPUMemoryFacts", "gpu_facts", "known_gpus",
           "active_prediction"]
