"""`memlens.max_batch`: the largest batch (or sequence length) that fits, by bisection on predictions."""
from __future__ import annotations

from typing import Callable

from memlens.errors import InputError


def max_batch(step_fn: Callable[[int], object], capacity="80GiB", gpu="H100", *, low: int = 1,
              high: int | None = None, limit: int = 1 << 20, **options) -> dict:
    """Largest `n` for which ``step_fn(n)`` fits in `capacity` on `gpu`, found on predictions (no GPU).

    `step_fn(n)` builds whatever it needs (model, optimizer, inputs of batch or sequence length `n`) and runs
    the step(s); each call runs under its own `memlens.predict`. Fits are monotone in `n` for ordinary
    training code, so the search doubles from `low` until a size does not fit (or `high`), then bisects.
    Returns ``{"max": n or 0, "tried": {n: device bytes needed}, "predictions": {n: Prediction}}`` where
    device bytes = peak reserved + CUDA context + NCCL buffers; ``max`` 0 means even `low` does not fit.
    With ``world_size=N`` (and the other options of `memlens.prediction.distributed`) each size is predicted
    per rank and fits only when every rank fits (a failed rank counts as not fitting).
    """
    from memlens.prediction.api import predict
    if low < 1:
        raise InputError(f"low must be >= 1, not {low}")
    tried: dict[int, int] = {}
    preds = {}

    def fits(n: int) -> bool:
        p = predict(lambda: step_fn(n), gpu=gpu, capacity=capacity, **options)
        preds[n] = p
        tried[n] = p.device_bytes_needed
        return bool(p.fits())

    if not fits(low):
        return {"max": 0, "tried": tried, "predictions": preds}
    good, bad = low, None
    n = low
    while bad is None:
        nxt = min(n * 2, high) if high is not None else n * 2
        if nxt == n or nxt > limit:
            return {"max": good, "tried": tried, "predictions": preds}
        if fits(nxt):
            good = n = nxt
        else:
            bad = nxt
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return {"max": good, "tried": tried, "predictions": preds}
