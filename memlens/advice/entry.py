"""`memlens.advise(...)`: one entry for the three kinds of input, each answered by its own module: a step
function (`memlens.advice.advisor.advise_step`, the whole search), a training script
(`memlens.advice.script`), or a recorded or imported trace (`memlens.advice.recorded`, allocator settings
only)."""
from __future__ import annotations

from memlens.advice.advisor import SHARDING, advise_step
from memlens.advice.result import Advice


def advise(build_model, step=None, gpu="H100", capacity="40GiB", world_size: int | None = None,
           objective: str = "fit", **options) -> Advice:
    """Advise changes that make a training step fit `capacity` (bytes, or "40GiB", per GPU) on `gpu`.

    `build_model` is a function returning a fresh ``nn.Module`` with `step(model, optimizer)` one training
    step (every option of `memlens.advice.advisor.advise_step` applies: `batch`, `strategies`,
    `optimizer`, `layers`, ``steps``...), or a script path ending in ``.py`` with `step` its argument list,
    or a `Trace` or a saved trace's path (allocator settings replayed on it). `objective`: ``"fit"``,
    ``"fastest_fit"`` or ``"pareto"``. Raises `memlens.advice.AdviceFailed` when the step or script fails
    as it is."""
    from memlens.trace import Trace
    if isinstance(build_model, Trace) or (isinstance(build_model, str) and not build_model.endswith(".py")):
        from memlens.advice.recorded import advise_trace
        return advise_trace(build_model, capacity, objective, **options)
    if isinstance(build_model, str):
        from memlens.advice.script import advise_script
        return advise_script(build_model, step, gpu=gpu, capacity=capacity, world_size=world_size,
                             objective=objective, **options)
    return advise_step(build_model, step, gpu=gpu, capacity=capacity, world_size=world_size,
                       objective=objective, **options)


__all__ = ["SHARDING", "advise"]
