"""`memlens.predict(...)`: the one entry point, which picks a single-GPU `Prediction` or, with ``world_size``,
the per-rank prediction of `memlens.prediction.distributed` (kept apart from `memlens.prediction.predictor` so that
the distributed code, which builds on `Prediction`, is never imported back by it)."""
from __future__ import annotations

from typing import Callable

from memlens.errors import InputError
from memlens.prediction.gpus import GPUMemoryFacts
from memlens.prediction.predictor import Prediction


def predict(fn: Callable | str | GPUMemoryFacts | None = None, /, gpu: str | GPUMemoryFacts = "H100",
            capacity=None, **options) -> Prediction:
    """Predict GPU memory without a GPU.

    ``with memlens.predict(gpu="H100", capacity="80GiB") as p: ...`` runs the block on fake `cuda` tensors;
    ``memlens.predict(step_fn, gpu=..., capacity=...)`` calls ``step_fn()`` under prediction and returns the
    finished `Prediction`: once, and a second time when the first call left new blocks alive (optimizer state,
    gradients), so that the peaks include the steady-state step (`Prediction.step_peaks` has each call's;
    ``steps=N`` calls it N times; see `memlens.prediction.steps`). When the code raises, its exception propagates
    (with a note saying no prediction was made) and the `Prediction`'s results raise `PredictionFailed` naming it.
    Reading a fake tensor's value (``loss.item()``, ``bool(t)``) gives a stand-in: `memlens.prediction.standins`.
    Options: `conf` (``PYTORCH_CUDA_ALLOC_CONF``; default: the environment's), `model`
    (names modules and categorises parameters from the start), `stacks`, `nccl_bytes` (NCCL buffers, bytes),
    `cuda_context` (override the GPU table's CUDA-context bytes), `cublas_workspaces`, `kernel_scratch` (False:
    leave out the modelled kernel temporaries of `memlens.prediction.scratch.modelled`), `cudnn_workspace` (bytes, "64MiB",
    or ``fn(op_row) -> bytes``: an allowance per convolution call; default None adds none, since cuDNN's
    algorithm choice cannot be known without the GPU), `fast_cache_key` (False:
    FakeTensorMode's own dispatch-cache keys, see `memlens.prediction.fastkey`).

    ``memlens.predict(step_fn_or_script, gpu=..., world_size=N)`` predicts sharded training per rank under
    torch's fake process group (FSDP2, DDP; options `ranks`, `args`, `nccl_channels`) and returns a
    `memlens.prediction.distributed.DistributedPrediction`: see `memlens.prediction.distributed.ranks`.

    Import order does not matter: where this process cannot run fake `cuda` steps (a backward ran before
    memlens was imported into a process that had torch first), a step function or script is predicted in a child
    process and the result says so (`memlens.prediction.firstuse`).
    """
    if "world_size" in options and options["world_size"] is None:
        del options["world_size"]
    from memlens.prediction import firstuse
    reason = firstuse.blocker()     # None when this process can run it (memlens first, or no backward yet)
    if reason is not None:
        if fn is None or isinstance(fn, GPUMemoryFacts) or (isinstance(fn, str) and not fn.endswith(".py")):
            raise firstuse.refuse_block(reason)
        return firstuse.predict_in_child(fn, gpu, capacity, options, reason)
    if options.get("world_size") is not None:
        from memlens.prediction.distributed.ranks import predict_ranks
        if fn is None or (isinstance(fn, str) and not fn.endswith(".py")) or isinstance(fn, GPUMemoryFacts):
            raise InputError("memlens.predict(world_size=...) runs each rank's code: give a step function or "
                             "a script path as the first argument, not a `with` block")
        return predict_ranks(fn, gpu, capacity, **options)
    if fn is None or isinstance(fn, (str, GPUMemoryFacts)):
        if fn is not None:
            gpu = fn
        return Prediction(gpu, capacity, **options)
    if not callable(fn):
        raise InputError(f"memlens.predict takes a callable or a gpu name, not {type(fn).__name__}")
    from memlens.prediction.steps import run_steps, steps_note
    p = Prediction(gpu, capacity, **options)
    with p:
        run_steps(p, fn, p.steps)
    note = steps_note(p, p.step_peaks)
    if note is not None:
        p.trace.metadata["notes"].append(note)
        p.steps_note = note
    return p
