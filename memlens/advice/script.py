"""Advice for a training script (`memlens advise -- python train.py`).

A script that defines ``build_model()`` and ``step(model, optimizer)`` at module level (its training loop
under ``if __name__ == "__main__":``) gets the whole search of `memlens.advise`: the script is loaded with
``__name__ == "__memlens_advise__"``, so its main block does not run, and those two functions are used.
Any other script is predicted as it runs (as ``__main__``), and only the allocator settings, which need no
access to the model, are searched on its predicted trace.
"""
from __future__ import annotations

import os

from memlens.advice.advisor import AdviceFailed, advise_step
from memlens.advice.plan import Plan
from memlens.advice.result import Advice
from memlens.advice.timelines import plan_trace
from memlens.errors import InputError
from memlens.script_runner import run_script

LOAD_NAME = "__memlens_advise__"
NO_HOOKS = ("the script defines no module-level build_model() and step(model, optimizer), so the model cannot be "
            "changed: only allocator settings were searched (define both, with the training loop under "
            "`if __name__ == \"__main__\":`, for checkpointing and sharding advice)")


def defines_hooks(script: str) -> bool:
    """Whether `script` defines ``build_model`` and ``step`` as module-level functions (read, not run: a
    script without them is only ever run under prediction)."""
    import ast
    try:
        with open(script, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=script)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise InputError(f"{script}: cannot be read as Python ({type(exc).__name__}: {exc})") from None
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return {"build_model", "step"} <= names


def load_functions(script: str, args: list[str]) -> dict:
    """The script's module namespace, loaded without running its main block."""
    try:
        return run_script(script, args, run_name=LOAD_NAME)
    except SystemExit as exc:
        if exc.code in (0, None):
            return {}
        raise AdviceFailed(f"no advice: {script} exited with {exc.code} while loading") from None
    except Exception as exc:
        raise AdviceFailed(f"no advice: {script} raised {type(exc).__name__}: {exc} while loading") from None


def advise_script(script: str, args: list[str] | None = None, gpu="H100", capacity="40GiB",
                  world_size: int | None = None, objective: str = "fit", **options) -> Advice:
    """`Advice` for the script at `script` run with `args` (see the module docstring). Raises
    `AdviceFailed` when the script fails, `InputError` when it does not exist."""
    if not os.path.isfile(script):
        raise InputError(f"{script}: no such script")
    args = list(args or [])
    if defines_hooks(script):
        namespace = load_functions(script, args)
        build_model, step = namespace.get("build_model"), namespace.get("step")
        return advise_step(build_model, step, gpu=gpu, capacity=capacity, world_size=world_size, objective=objective,
                      **options)
    return _allocator_only(script, args, gpu, capacity, world_size, objective, options)


def _allocator_only(script, args, gpu, capacity, world_size, objective, options) -> Advice:
    """The script as it runs, and the best allocator setting replayed on its prediction."""
    from memlens.advice.allocator import best_conf
    from memlens.advice.verify import step_ns
    from memlens.prediction.api import predict
    from memlens.prediction.distributed.ranks import _runner
    from memlens.prediction.predictor import _capacity_bytes
    cap = _capacity_bytes(capacity)
    try:
        if world_size is None:
            # run once, as `memlens predict -- python train.py` runs it: a script is its own loop, not a step
            # function to be called again for the steady state
            p = predict(gpu=gpu, capacity=cap, conf="", **options)
            with p:
                _runner(script, args)()
        else:
            p = predict(script, gpu=gpu, capacity=cap, conf="", world_size=int(world_size), args=args, **options)
    except Exception as exc:
        raise AdviceFailed(f"no advice: {script} failed under prediction ({type(exc).__name__}: {exc})") from None
    preds = p.predictions if world_size is not None else {0: p}
    if world_size is not None and p.errors:
        raise AdviceFailed("no advice: " + "; ".join(f"rank {r}: {e}" for r, e in sorted(p.errors.items())))
    times = [t for t in (step_ns(q, world_size or 1, gpu) for q in preds.values()) if t is not None]
    baseline = Plan(peak_allocated=p.peak_allocated, peak_reserved=p.peak_reserved,
                    device_bytes_needed=p.device_bytes_needed, fits=bool(p.fits()), verified=True,
                    step_ns=max(times) if times else None, trace=plan_trace(p))
    baseline.baseline_step_ns = baseline.step_ns
    plans = [baseline]
    better = best_conf(baseline, p, cap)
    if better is not None:
        plans.append(better)
    return Advice(plans, baseline, cap, objective, [NO_HOOKS])
