"""The steady state of a predicted step function: run it again when its first call leaves new state behind.

A training step's first call creates what later steps keep: AdamW's two moments at the first ``opt.step()``
(after that step's activations are freed), gradients that ``zero_grad()`` keeps. The second call runs with that
state already held, so its peak is the steady-state peak; a one-step prediction of such a step is too low (by
the optimizer state, for a step whose peak is in its forward or backward). `run_steps` calls the step function
under the prediction:

- ``steps=None`` (the default): once, and once more when the first call left new GPU blocks alive (blocks
  allocated during the call and still held by something outside it: state the next step starts with);
- ``steps=N``: exactly N times.

`step_peaks` gives each call's peak (allocated and reserved, from the allocator replay), so that the result can
say the steady-state peak (the last call's) beside the first step's.
"""
from __future__ import annotations

from typing import Callable

from memlens.errors import InputError


def check_steps(steps) -> int | None:
    """`steps` as given to `memlens.predict` (None or a positive int), or `InputError`."""
    if steps is None:
        return None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps must be a positive number of calls of the step function (or None), not {steps!r}")
    return steps


def run_steps(prediction, fn: Callable, steps: int | None) -> None:
    """Call `fn` under `prediction` (inside its block) `steps` times, or, for None, once plus once more when the
    first call left new GPU blocks alive. Records where each call starts and what the first call left held."""
    session = prediction._session
    calls = steps or 1
    k = 0
    while k < calls:
        before = set(session._cuda_sizes)
        prediction._step_starts.append(len(session.op_threads))
        fn()      # its return value is dropped here, as a training loop drops it
        if k == 0:
            left = [b for b in session._cuda_sizes if b not in before]
            prediction.first_step_left_bytes = sum(session._cuda_sizes[b] for b in left)
            if steps is None and prediction.first_step_left_bytes > 0:
                calls = 2
        k += 1


def step_peaks(prediction) -> list[dict]:
    """Per call of the step function: ``{"step", "peak_allocated", "peak_reserved"}`` (bytes) over the time from
    its first op to the next call's first op (the last call: to the end); [] outside `run_steps`."""
    starts = prediction._step_starts
    sim = prediction.simulate()
    if not starts or sim is None:
        return []
    ops = prediction.trace.ops
    start_of = dict(zip(ops["op_id"].to_numpy().tolist(), ops["start_ns"].to_numpy().tolist()))
    t_end = int(ops["end_ns"].max()) + 1 if len(ops) else 0
    times = [start_of.get(op, t_end) for op in starts] + [None]
    tl = sim.timeline
    out = []
    for k in range(len(starts)):
        t0, t1 = times[k], times[k + 1]
        before = tl[tl["t_ns"] < t0]
        inside = tl[(tl["t_ns"] >= t0) & ((tl["t_ns"] < t1) if t1 is not None else True)]
        row = {"step": k + 1}
        for column in ("allocated", "reserved"):
            carried = int(before[column].iloc[-1]) if len(before) else 0
            row[f"peak_{column}"] = max([carried] + inside[column].astype(int).tolist())
        out.append(row)
    return out


def steps_note(prediction, peaks: list[dict]) -> str | None:
    """The sentence that says which step's peak the answer is and what the first step's was."""
    left = prediction.first_step_left_bytes
    from memlens.units import format_bytes
    if len(peaks) >= 2:
        first, last = peaks[0], peaks[-1]
        why = (f"its first call left {format_bytes(left)} of new blocks alive (optimizer state, gradients), so "
               if prediction.steps is None else "")
        return (f"{why}the step function ran {len(peaks)} times: steady-state peak (step {last['step']}) "
                f"{format_bytes(last['peak_allocated'])} allocated, {format_bytes(last['peak_reserved'])} reserved; "
                f"first step {format_bytes(first['peak_allocated'])} allocated, "
                f"{format_bytes(first['peak_reserved'])} reserved")
    if peaks and left > 0:
        return (f"one step only (steps=1): its first call left {format_bytes(left)} of new blocks alive "
                "(optimizer state, gradients), which a second step starts with; its peak may be higher "
                "(steps=None predicts it)")
    return None
