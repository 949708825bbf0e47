"""Iteration boundaries: from explicit markers, from optimizer steps, or detected from the repeating pattern.

Training repeats the same sequence of allocations every step (Li et al.; Zhang et al. build their pool plan
on it). `split_iterations` takes the most explicit evidence the trace has:

1. ``marker``: ops carry an ``iteration`` number (``memlens.step()``); when the recorder numbered them from
   optimizer steps (``metadata["iteration_source"]`` mentions "optimizer") the source is ``optimizer``, and
   when it numbered them by this module's detection ("detected"), ``detected``.
2. ``optimizer``: otherwise, ops named like the profiler's ``Optimizer.step#Adam.step`` (one is enough);
   each iteration ends where an optimizer step ends.
2b. phases (CUDA snapshots, `memlens.io.snapshot.story`): optimizer steps seen in the stacks
   (``optimizer``), else backward passes (``backward``), else repeated calls of the model itself
   (``model calls``); without steps or backward passes, two or more zero_grad calls start iterations
   (``zero_grad``). When the stacks tell phases, step 3 is never used: a pattern that repeats inside
   them is a layer loop, not an iteration.
3. ``detected``: the period of the allocation sequence, each allocation a symbol ``(op, size)`` (or the op
   alone when sizes change every step, as with dynamic shapes), by autocorrelation
   (`memlens.analysis.period`). A step's pattern is taken from a live-bytes trough (the end
   of a step) and matched against every position; each position that matches best within half a period,
   and far better than chance, starts an iteration. Steps of slightly different length or order (a warm-up
   step that also creates optimizer state, one extra allocation) are still found.
4. ``none``: no evidence of repetition: one row covering the whole trace.

Iteration ``k`` covers ``[start_ns, end_ns)``; each ends where the next begins (the last at the trace
end). Anything before the first start (setup, a partial first step) belongs to no iteration (-1).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.live import live_curve
from memlens.analysis.period import detect_period, iteration_starts

OPTIMIZER_PATTERN = r"^Optimizer\.step#|^optimizer\.step$|^memlens\.optimizer_step$"
ANCHOR_WINDOWS = 8  # candidate iteration starts tried, spread evenly over the trace
SOURCES = ("marker", "optimizer", "backward", "zero_grad", "model calls", "detected", "none")


def _frame(starts: np.ndarray, end_of_trace: int, source: str, **extra) -> pd.DataFrame:
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.append(starts[1:], max(int(end_of_trace), int(starts[-1]) if len(starts) else 0))
    out = pd.DataFrame({"iteration": np.arange(len(starts), dtype=np.int64), "start_ns": starts,
                        "end_ns": ends.astype(np.int64), "source": source})
    for key, value in extra.items():
        out[key] = value
    return out


def _from_markers(trace) -> pd.DataFrame | None:
    """Iterations numbered on the ops (memlens.step() or the recorder's optimizer-step hook).

    The iteration opened by the last marker often holds nothing (the loop ended right after the call):
    a final iteration in which no block was allocated is dropped rather than reported as a step.
    """
    ops = trace.ops
    if len(ops) == 0 or not ops["iteration"].notna().any():
        return None
    marked = ops[ops["iteration"].notna()]
    first = marked.groupby("iteration", sort=True)["start_ns"].min()
    _, hi = trace.time_span_ns()
    recorded = str(trace.metadata.get("iteration_source", "marker"))
    # the recorder says how it numbered them: markers, optimizer steps, or this module's detection
    source = ("optimizer" if "optimizer" in recorded.lower() else
              "detected" if recorded == "detected" else "marker")
    out = _frame(first.to_numpy(dtype=np.int64), hi, source)
    out["iteration"] = first.index.to_numpy(dtype=np.int64)
    if len(out) > 1:
        alloc = trace.blocks["alloc_ns"].dropna().to_numpy(dtype=np.int64)
        if not ((alloc >= out["start_ns"].iloc[-1]) & (alloc <= out["end_ns"].iloc[-1])).any():
            out = out.iloc[:-1].copy()
            out.loc[out.index[-1], "end_ns"] = hi
    return out


def _from_optimizer_ops(trace) -> pd.DataFrame | None:
    ops = trace.ops
    if len(ops) == 0:
        return None
    is_step = ops["name"].astype(str).str.contains(OPTIMIZER_PATTERN, regex=True).to_numpy()
    if is_step.sum() < 1:
        return None
    return _iterations_ending_at(trace, ops.loc[is_step, "end_ns"].to_numpy(dtype=np.int64), "optimizer")


def _iterations_ending_at(trace, ends: np.ndarray, source: str, nested_ops: bool = True) -> pd.DataFrame:
    """Iterations that each end where one step (optimizer step, backward pass) ends; the work after the last
    one is a partial iteration when something is allocated in it. `nested_ops`: the ends come from op
    records, of which several may belong to one step."""
    ops = trace.ops
    ends = np.sort(np.asarray(ends, dtype=np.int64))
    if nested_ops:
        # nested records of one step (e.g. Optimizer.step#Adam.step around _foreach ops) end close together;
        # keep one end per step: an end that no op start separates from the previous one is the same step
        op_starts = np.sort(ops["start_ns"].to_numpy(dtype=np.int64))
        between = np.searchsorted(op_starts, ends[1:], side="left") - np.searchsorted(op_starts, ends[:-1],
                                                                                      side="right")
        ends = ends[np.concatenate([[True], between > 0])]
    lo, hi = trace.time_span_ns()
    starts = np.concatenate([[lo], ends[:-1]])
    alloc = trace.blocks["alloc_ns"].dropna().to_numpy(dtype=np.int64)
    if ends[-1] < hi and (alloc > ends[-1]).any():  # the work after the last step is a partial iteration
        starts = np.append(starts, ends[-1])
    return _frame(starts, hi, source)


def _from_phases(trace) -> pd.DataFrame | None:
    """Iterations from the phases a snapshot's stacks and annotations tell (`metadata["phases"]`): one per
    optimizer step where steps are visible; else one per backward pass; a forward-only recording has
    iterations only when the model itself is called repeatedly (``metadata["model_calls"]``), never from a
    layer pattern that repeats inside one call."""
    phases = trace.metadata.get("phases") or []
    steps = [p for p in phases if p.get("name") == "optimizer_step"]
    if steps:
        return _iterations_ending_at(trace, _merged_ends(steps), "optimizer", nested_ops=False)
    backward = [p for p in phases if p.get("name") == "backward"]
    if backward:
        return _iterations_ending_at(trace, _merged_ends(backward), "backward", nested_ops=False)
    # a training loop calls zero_grad once per step even when its update is not an optimizer step
    # (zeroth-order methods, manual updates): two or more zero_grad calls start iterations
    zero = sorted(int(p["start_ns"]) for p in phases if p.get("name") == "zero_grad")
    if len(zero) >= 2:
        _, hi = trace.time_span_ns()
        return _frame(np.asarray(zero, dtype=np.int64), hi, "zero_grad")
    calls = trace.metadata.get("model_calls") or []
    if len(calls) >= 2:
        _, hi = trace.time_span_ns()
        return _frame(np.asarray(calls, dtype=np.int64), hi, "model calls")
    return None


def _merged_ends(phases: list[dict]) -> np.ndarray:
    """End of each group of overlapping or touching ranges (an annotated step and the inferred one)."""
    spans = sorted((int(p["start_ns"]), int(p["end_ns"])) for p in phases)
    ends, cur_end = [], None
    for s, e in spans:
        if cur_end is not None and s <= cur_end:
            cur_end = max(cur_end, e)
            ends[-1] = cur_end
        else:
            cur_end = e
            ends.append(e)
    return np.asarray(ends, dtype=np.int64)


def allocation_sequence(trace) -> pd.DataFrame:
    """Allocations recorded during the trace in event order: ``block_id``, ``alloc_ns``, ``size``, ``op``,
    ``symbol`` (int code of (op, size)), ``op_symbol`` (int code of op alone) and ``live_before`` (bytes
    live on all devices just before it)."""
    b = trace.blocks
    live_after = live_after_alloc(trace)
    seen = b["alloc_ns"].notna().to_numpy()
    rows = np.flatnonzero(seen)
    order = np.lexsort((b["alloc_seq"].fillna(-1).to_numpy(dtype=np.int64)[rows],
                        b["alloc_ns"].to_numpy(dtype="float64", na_value=0)[rows]))
    rows = rows[order]
    size = b["size"].to_numpy(np.int64)[rows]
    op = b["op"].to_numpy(dtype=object)[rows]
    # symbol = code of the (op, size) pair, built from two integer factorizations (cheap on 1M rows)
    op_code, _ = pd.factorize(op)
    size_code, size_values = pd.factorize(size)
    symbol, _ = pd.factorize(op_code.astype(np.int64) * (len(size_values) + 1) + size_code)
    return pd.DataFrame({"block_id": b["block_id"].to_numpy()[rows],
                         "alloc_ns": b["alloc_ns"].to_numpy(dtype="float64", na_value=0)[rows].astype(np.int64),
                         "size": size, "op": op, "symbol": symbol.astype(np.int64),
                         "op_symbol": op_code.astype(np.int64),
                         "live_before": live_after[rows] - size}, copy=False)


def live_after_alloc(trace) -> np.ndarray:
    """Bytes live on all devices right after each block's allocation (aligned with the blocks table)."""
    frame, alloc_pos = live_curve(trace)
    return frame["live"].to_numpy()[alloc_pos] if len(frame) else np.zeros(0, dtype=np.int64)


def _detected(trace) -> pd.DataFrame | None:
    allocs = allocation_sequence(trace)
    live_before = allocs["live_before"].to_numpy(dtype=np.float64)
    keys = [("op and size", allocs["symbol"].to_numpy())]
    if allocs["op_symbol"].nunique() > 1:
        # sizes that change every step (dynamic shapes: sequence length, batch size) hide the pattern that
        # the op sequence alone still shows
        keys.append(("op", allocs["op_symbol"].to_numpy()))
    for keyed_by, symbols in keys:
        found = detect_period(symbols)
        if found is None:
            continue
        starts_idx = _pattern_starts(symbols, found, live_before)
        if len(starts_idx) < 2:
            continue
        n = len(symbols)
        _, hi = trace.time_span_ns()
        counts = np.diff(np.append(starts_idx, n))
        out = _frame(allocs["alloc_ns"].to_numpy()[starts_idx], hi, "detected", allocations=counts.astype(np.int64))
        out.attrs.update({"period_lag": int(found.period), "period_allocations": int(np.median(counts[:-1])),
                          "period_match": found.match, "keyed_by": keyed_by,
                          "chance_match": found.chance, "z_score": found.z_score})
        return out
    return None


def _pattern_starts(symbols: np.ndarray, found, live_before: np.ndarray) -> np.ndarray:
    """Allocation indices where iterations start, for a detected period.

    An iteration starts at the live-bytes trough (the end of a step). The troughs of period-long windows
    spread over the whole sequence are candidate starts, and the pattern that recurs best is kept: a
    perturbed step (one extra allocation) or a phase that does not repeat (setup, evaluation) then costs
    one candidate, not the split.
    """
    n, period = len(symbols), found.period
    window_starts = np.unique(np.linspace(0, n - period, ANCHOR_WINDOWS).astype(np.int64))
    anchors = [int(lo) + int(np.argmin(live_before[lo:lo + period])) for lo in window_starts]
    return iteration_starts(symbols, anchors, period, cost=live_before, expected_match=found.match)


def split_iterations(trace, method: str = "auto") -> pd.DataFrame:
    """Iteration boundaries of `trace`: columns ``iteration``, ``start_ns``, ``end_ns`` (ns), ``source``
    (one of `SOURCES`), plus ``allocations`` (alloc events in each) for detected ones.

    `method` forces one source ("marker", "optimizer", "detected") or takes the first that applies
    ("auto"). Works on traces without accesses: detection uses only the allocation sequence. Detected
    splits carry ``attrs``: ``period_allocations`` (median allocations per iteration), ``period_lag`` (the
    autocorrelation lag), ``period_match`` / ``chance_match`` (match rates), ``z_score`` and ``keyed_by``
    ("op and size", or "op" when only the op sequence repeats).
    """
    if method not in ("auto", "marker", "optimizer", "phases", "detected"):
        raise ValueError(f"method must be auto, marker, optimizer, phases or detected, got {method!r}")
    finders = {"marker": _from_markers, "optimizer": _from_optimizer_ops, "phases": _from_phases,
               "detected": _detected}
    order = list(finders) if method == "auto" else [method]
    if method == "auto" and trace.metadata.get("phases_from_frames"):
        # the stacks tell the phases: a pattern repeating inside them is a layer loop, not an iteration
        # (asked for explicitly, method="detected" still finds it)
        order.remove("detected")
    for name in order:
        found = finders[name](trace)
        if found is not None and len(found):
            return found
    lo, hi = trace.time_span_ns()
    return _frame(np.array([lo]), hi, "none")


def steady_iteration(iterations: pd.DataFrame) -> int | None:
    """The iteration that stands for the steady state (None when there is none).

    Not the first (a warm-up step creates the optimizer state), not much shorter than the median period
    (half of it: a partial step), and preferably one whose successor was recorded, so that its period and
    its wrap-around intervals are measured rather than estimated: the last such iteration; else the last
    iteration long enough; else the last one. A single iteration stands for itself.
    """
    its = iterations.sort_values("start_ns").reset_index(drop=True)
    n = len(its)
    if n == 0:
        return None
    if n == 1:
        return int(its["iteration"].iloc[0])
    starts = its["start_ns"].to_numpy(np.int64)
    # a period is start to next start; the last has only its recorded span
    dur = np.append(np.diff(starts), int(its["end_ns"].iloc[-1]) - int(starts[-1])).astype(np.float64)
    median = float(np.median(dur[1:]))
    long_enough = [pos for pos in range(1, n) if dur[pos] >= 0.5 * median]
    complete = [pos for pos in long_enough if pos < n - 1]
    pick = complete[-1] if complete else long_enough[-1] if long_enough else n - 1
    return int(its["iteration"].iloc[pick])
