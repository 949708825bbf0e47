"""Access time intervals (ATI): how long each block sits idle between the ops that touch it.

One definition, used by every analysis, figure, widget and command (after Li et al.,
"Pinpointing the Memory Behaviors of DNN Training"): the ATIs of a block are the intervals between its
consecutive *accesses*, each from the **end of the op** that made the earlier access to the **start of the
op** that makes the next one (an op's own run time is not idle). An access's place in time is its op's
edges (`access_op_edges`), never its own stamp: recorders stamp a read at its op's start and a write at its
op's end, and an interval ending at a write's stamp would run through the op that makes it. All accesses
of a block by one op (a read and a write: two rows) are one event, at the op's edges widened to cover every
one of their stamps (`memlens.analysis.access_events.block_events`); events are ordered by start, then end;
an op whose edges the ``ops`` table lacks spans its stamps. These
rows have kind ``access_to_access``; they are the headline distribution and the only intervals the
bandwidth filter, the outliers and the swap planner consider (a swapped block must be back by the start of
the op that next accesses it).

The lifetime edges are a different quantity, reported beside the ATI by kind and never mixed into it:
``alloc_to_first`` (alloc -> start of the first access's op; 0 when that op made the block),
``last_to_free`` (end of the last access's op -> free) and ``alloc_to_free`` (a block no op ever touched:
e.g. a temporary inside an op that only the allocator saw).

Bounds: a block allocated before recording began starts at the trace start, and one still alive when
recording stopped ends at the trace end (`Trace.time_span_ns`); its edge is then marked ``truncated`` (its
true length is unknown). An access stamped outside
its block's recorded lifetime (a recorder's clock skew) widens the lifetime rather than producing a
negative interval (``attrs["accesses_outside_lifetime"]``); an op that starts before the previous op on the
same block ended (nested or overlapping ops) gives a zero-length interval at its start
(``attrs["overlapping_ops"]``).

Steady state (``steady_state=True``; ``iteration=k``): training is cyclic, and one recorded iteration is one
period of the cycle. Iteration k is the window ``[start_k, start_k + period)``; an op belongs to the
iteration its start falls in. A block alive across the iteration boundary (parameters, optimizer state) is
idle from the end of its last access in iteration k to the start of its first access in k+1: that interval
is an ATI with ``wraps=True`` (any ATI with ``start < b <= end`` for an iteration start b). When the next
iteration was recorded, only recorded intervals wrap: a block not accessed in k+1 gets no invented one.
When it was not (k is the last one, or only one was recorded), each block alive across the whole window
(allocated before it, still alive at the end) with its last access in it gets the wrap-around interval
the next iteration would give it: to its first access in k shifted by the period; the last iteration's
period is the previous iteration's (`cycle_window`). Iterations come from
`memlens.analysis.iterations.split_iterations` (memlens.step() markers, optimizer steps, or the detected
repeating pattern). Every frame carries its clock (``attrs["clock"]``, `memlens.analysis.clock`).

This module computes the intervals (`access_intervals`); `memlens.analysis.ati` summarises them (statistics,
distributions, per group) and re-exports what is here, so ``memlens.analysis.ati`` stays the one import.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.access_events import block_events, block_rows, count_distinct
from memlens.analysis.access_events import access_op_edges, op_end_times  # noqa: F401  (re-exported)
from memlens.trace import clock_of
from memlens.errors import InputError, NeedsAccessesError


KINDS = ("alloc_to_first", "access_to_access", "last_to_free", "alloc_to_free")  # pragma: no mutate
ATI_KIND = "access_to_access"  # pragma: no mutate
EDGE_KINDS = ("alloc_to_first", "last_to_free", "alloc_to_free")  # pragma: no mutate
INTERVAL_COLUMNS = ("block_id", "device", "size", "start_ns", "end_ns", "length_ns", "kind", "ordinal",
                    "truncated", "wraps")


def require_accesses(trace, what: str = "this analysis") -> None:
    """Raise `NeedsAccessesError` explaining why `what` cannot run on a trace without accesses."""
    if not trace.has_accesses:
        source = trace.metadata.get("source_kind", "unknown")
        raise NeedsAccessesError(
            f"{what} needs per-access data (which op read or wrote each block), and this trace "
            f"(source: {source}) has none: CUDA memory snapshots, Kineto traces and memory timelines record "
            "only allocations and frees. Record the run with memlens.record (or `memlens record`) to get "
            "accesses; lifetime-based analyses (peak, iterations, fragmentation) still work on this trace.")


def access_intervals(trace, device: str | None = None, *, steady_state: bool = False,
                     iteration: int | None = None, iterations: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every interval of every block, one row per interval: the ATIs and, beside them, the lifetime edges.

    Columns: ``block_id``, ``device`` (categorical), ``size`` (bytes), ``start_ns``, ``end_ns``,
    ``length_ns`` (ns, trace-relative, on the trace's clock), ``kind`` (categorical, one of `KINDS`: only
    ``access_to_access`` rows are ATIs), ``ordinal`` (position of the interval within its block),
    ``truncated`` (bool: bounded by the trace start/end, not by a real alloc/free) and ``wraps`` (bool: an
    ATI crossing an iteration boundary, the wrap-around interval of the steady state). Rows are ordered by
    block (blocks table order) then time. Only blocks of `device` when given.

    `iteration` (k): only the intervals that begin in iteration k (and, without `steady_state`, end in it).
    `steady_state`: the recording is a cycle (see the module docstring): intervals crossing an iteration
    boundary are marked ``wraps`` and blocks still alive at the end get their wrap-around interval, with the
    period of iteration k; without `iteration`, k is the default steady iteration
    (`memlens.analysis.iterations.steady_iteration`: the last after the warm-up, ``attrs["iteration_default"]``
    True), so warm-up intervals never enter it. `iterations`: the frame from `split_iterations`, when the
    caller has it. ``attrs`` hold ``clock``, ``steady_state``, ``iteration``, ``iteration_default``,
    ``period_ns``, ``window_ns`` and ``iteration_source``. Raises `memlens.errors.NeedsAccessesError` when
    the trace records no accesses and `InputError` for an iteration the trace does not have.
    """
    require_accesses(trace, "access time interval (ATI) analysis")
    iv = _linear_intervals(trace, device)
    iv.attrs.update({"clock": clock_of(trace), "steady_state": bool(steady_state), "iteration": iteration,
                     "iteration_default": False, "period_ns": None, "window_ns": None, "iteration_source": None})
    if not steady_state and iteration is None:
        return iv
    from memlens.analysis.iterations import split_iterations, steady_iteration
    iterations = split_iterations(trace) if iterations is None else iterations
    k = steady_iteration(iterations) if iteration is None else iteration
    out = _cyclic(trace, iv, iterations, steady_state, k)
    out.attrs["iteration_default"] = iteration is None and k is not None
    return out


def period_window(trace, iterations: pd.DataFrame, iteration: int | None) -> tuple[int, int, int]:
    """(window start, window end, period) in ns of `iteration` (default: the last one); see `cycle_window`."""
    w0, w1, period, _ = cycle_window(trace, iterations, iteration)
    return w0, w1, period


def cycle_window(trace, iterations: pd.DataFrame, iteration: int | None) -> tuple[int, int, int, str]:
    """(window start, window end, period, where the period came from) in ns for `iteration` (default: the
    last one).

    A window is ``[start_k, start_{k+1})`` and its period ``start_{k+1} - start_k`` (``"next iteration"``).
    The last iteration has no recorded successor: the recording stops before the next step would start, so
    its recorded span (start to the trace's last instant, inclusive) is shorter than a period. Its period is
    the previous iteration's (``"previous iteration"``: the cycle repeats), or the recorded span when that
    is longer (``"trace end"``, also when only one iteration was recorded). Raises `InputError` when
    `iteration` is not in `iterations`.
    """
    its = iterations.sort_values("start_ns").reset_index(drop=True)
    lo, hi = trace.time_span_ns()
    if len(its) == 0:
        return int(lo), int(hi) + 1, max(int(hi - lo) + 1, 1), "trace end"
    labels = its["iteration"].to_numpy(dtype=np.int64)
    if iteration is None:
        pos = len(its) - 1
    else:
        hits = np.flatnonzero(labels == int(iteration))
        if len(hits) == 0:
            source = str(its["source"].iloc[0]) if "source" in its.columns else "split"
            raise InputError(f"iteration {iteration} is not in the trace ({len(its)} iterations, {source}: "
                             f"{', '.join(str(v) for v in labels[:10])}{'...' if len(labels) > 10 else ''})")
        pos = int(hits[0])
    starts = its["start_ns"].to_numpy(dtype=np.int64)
    w0 = int(starts[pos])
    if pos < len(its) - 1:
        period, source = int(starts[pos + 1] - w0), "next iteration"
    else:
        span = max(int(its["end_ns"].iloc[pos]), int(hi)) - w0 + 1
        previous = int(starts[pos] - starts[pos - 1]) if pos > 0 else 0
        period, source = (previous, "previous iteration") if previous > span else (span, "trace end")
    period = max(period, 1)
    return w0, w0 + period, period, source


def first_access_in_window(trace, window: tuple[int, int]) -> pd.Series:
    """Start (ns) of the first op that accesses each block within ``[w0, w1)``, by block_id (blocks not
    accessed in the window are absent). An access belongs to the window its op starts in; an op's accesses
    of one block are one event (`memlens.analysis.access_events.block_events`)."""
    w0, w1 = int(window[0]), int(window[1])
    block_ids = trace.blocks["block_id"].to_numpy(dtype=np.int64)
    events = block_events(trace, block_ids)
    inside = (events.start >= w0) & (events.start < w1)
    return pd.Series(events.start[inside]).groupby(block_ids[events.row[inside]]).min()


def _cyclic(trace, iv: pd.DataFrame, iterations: pd.DataFrame, steady_state: bool,
            iteration: int | None) -> pd.DataFrame:
    """`iv` (the linear intervals) seen as one period of a cycle: see `access_intervals`.

    An interval wraps when it crosses an iteration start b: ``start < b <= end`` (an op starting exactly at
    b belongs to the iteration b starts). In steady state, when the window's next iteration was not
    recorded, each block alive across the whole window (allocated before it, never freed) whose last access
    lies in it gets the wrap-around interval the next iteration would have: to its first access in the
    window shifted by the period. When the next iteration was recorded, only the recorded intervals wrap.
    """
    its = iterations.sort_values("start_ns").reset_index(drop=True)
    w0, w1, period, period_source = cycle_window(trace, its, iteration)
    source = str(its["source"].iloc[0]) if len(its) and "source" in its.columns else "none"
    start = iv["start_ns"].to_numpy(dtype=np.int64).copy()
    end = iv["end_ns"].to_numpy(dtype=np.int64).copy()
    kind = iv["kind"].cat.codes.to_numpy().copy()
    truncated = iv["truncated"].to_numpy().copy()
    ati = kind == KINDS.index(ATI_KIND)
    bounds = its["start_ns"].to_numpy(dtype=np.int64)[1:] if len(its) > 1 else np.zeros(0, np.int64)
    crosses = np.searchsorted(bounds, end, side="right") > np.searchsorted(bounds, start, side="right")
    wraps = ati & crosses
    invented = 0
    if steady_state and period_source != "next iteration":
        block = iv["block_id"].to_numpy(dtype=np.int64)
        blocks = trace.blocks
        rows = block_rows(blocks["block_id"].to_numpy(dtype=np.int64), block)
        alloc = blocks["alloc_ns"].to_numpy(dtype=np.float64, na_value=np.nan)[np.maximum(rows, 0)]
        alive_before = np.isnan(alloc) | (alloc < w0)
        edge = (kind == KINDS.index("last_to_free")) & truncated & alive_before & (start >= w0) & (start < w1)
        first = first_access_in_window(trace, (w0, w1))
        first_at = first.reindex(block).to_numpy(dtype=np.float64)
        edge &= ~np.isnan(first_at)
        pick = np.flatnonzero(edge)
        end[pick] = np.maximum(first_at[pick].astype(np.int64) + period, start[pick])
        kind[pick] = KINDS.index(ATI_KIND)
        truncated[pick] = False
        wraps[pick] = True
        invented = len(pick)
    keep = (start >= w0) & (start < w1) if iteration is not None else np.ones(len(iv), bool)
    if iteration is not None and not steady_state:  # intervals inside the iteration only
        keep &= (end <= w1) & ~wraps
    columns = {c: iv[c] for c in iv.columns}
    columns.update({"start_ns": start, "end_ns": end, "length_ns": end - start,
                    "kind": pd.Categorical.from_codes(kind, KINDS), "truncated": truncated, "wraps": wraps})
    out = pd.DataFrame(columns, copy=False)
    if not keep.all():
        out = out[keep].reset_index(drop=True)
    out.attrs.update(iv.attrs)
    out.attrs.update({"steady_state": bool(steady_state), "iteration": iteration, "period_ns": int(period),
                      "window_ns": (int(w0), int(w1)), "iteration_source": source,
                      "period_source": period_source, "wraps_beyond_recording": int(invented)})
    return out


def _linear_intervals(trace, device: str | None) -> pd.DataFrame:
    """The intervals of the recording as one straight line (no cycle): see `access_intervals`."""
    blocks = trace.blocks if device is None else trace.blocks[trace.blocks["device"] == device]
    lo, hi = trace.time_span_ns()

    block_ids = blocks["block_id"].to_numpy(dtype=np.int64)
    # one event per (block, op) at its op's edges: intervals run from an op's end to the next op's start
    events = block_events(trace, block_ids)
    row, acc_start, acc_end = events.row, events.start, events.end
    n_blocks = len(blocks)
    alloc_known = blocks["alloc_ns"].notna().to_numpy()
    free_known = blocks["free_ns"].notna().to_numpy()
    start = blocks["alloc_ns"].fillna(lo).to_numpy(dtype=np.int64)
    end = blocks["free_ns"].fillna(hi).to_numpy(dtype=np.int64)

    # widen lifetimes to cover their accesses' own stamps (a recorder's clock skew); an op that began
    # before the block was allocated (the op that made it) is not skew: its edge is clipped below
    counts = np.bincount(row, minlength=n_blocks).astype(np.int64)
    has_acc = counts > 0
    acc_offset = np.concatenate([[0], np.cumsum(counts)])
    first_acc = np.full(n_blocks, np.iinfo(np.int64).max)
    last_acc = np.full(n_blocks, np.iinfo(np.int64).min)
    if len(row):
        first_acc[has_acc] = np.minimum.reduceat(events.first_stamp, acc_offset[:-1][has_acc])
        last_acc[has_acc] = np.maximum.reduceat(events.last_stamp, acc_offset[:-1][has_acc])
    outside = int(((first_acc < start) & has_acc).sum() + ((last_acc > end) & has_acc).sum())
    start = np.minimum(start, first_acc)
    end = np.maximum(end, last_acc)

    # block b's intervals occupy [iv_offset[b], iv_offset[b+1]): their starts are (alloc, end of each
    # access's op), their ends (start of each access's op, free). Accesses are grouped by row, so both are
    # the op edges with one value inserted per block (np.insert copies sequentially).
    n_iv = counts + 1
    iv_offset = np.concatenate([[0], np.cumsum(n_iv)])
    total = int(iv_offset[-1])
    first_pos, last_pos = iv_offset[:-1], iv_offset[1:] - 1
    iv_start = np.insert(acc_end, acc_offset[:-1], start)
    iv_end = np.insert(acc_start, acc_offset[1:], end)
    kind_code = np.ones(total, dtype=np.int8)  # access_to_access unless first/last
    kind_code[first_pos] = 0
    kind_code[last_pos] = 2
    kind_code[first_pos[counts == 0]] = 3
    overlapping = iv_start > iv_end  # the next op began before this one ended (nested/overlapping ops)
    n_overlapping = int(np.count_nonzero(overlapping & (kind_code == 1)))
    # a first access by the op that allocated the block: no idle time after the alloc (clipped at it);
    # everywhere else an overlap is a zero-length interval at the later op's start (or at the free)
    first_edge = kind_code == 0
    np.maximum(iv_end, np.where(first_edge, iv_start, iv_end), out=iv_end)
    np.minimum(iv_start, iv_end, out=iv_start)
    truncated = np.zeros(total, dtype=bool)
    truncated[first_pos[~alloc_known]] = True
    truncated[last_pos[~free_known]] = True
    # ordinal: a running count that restarts at each block (cumsum of 1s with a reset at every block start)
    ordinal = np.ones(total, dtype=np.int64)
    if total:
        ordinal[first_pos[1:]] = 1 - n_iv[:-1]
        ordinal[0] = 0
        np.cumsum(ordinal, out=ordinal)

    devices = blocks["device"].astype("category")
    out = pd.DataFrame({
        "block_id": np.repeat(block_ids, n_iv),
        "device": pd.Categorical.from_codes(np.repeat(devices.cat.codes.to_numpy(), n_iv), devices.cat.categories),
        "size": np.repeat(blocks["size"].to_numpy(dtype=np.int64), n_iv),
        "start_ns": iv_start,
        "end_ns": iv_end,
        "length_ns": iv_end - iv_start,
        "kind": pd.Categorical.from_codes(kind_code, KINDS),
        "ordinal": ordinal,
        "truncated": truncated,
        "wraps": np.zeros(total, dtype=bool),
    }, copy=False)  # no consolidation copy: 10M-row columns stay as built
    out.attrs["accesses_outside_lifetime"] = outside
    out.attrs["overlapping_ops"] = n_overlapping
    out.attrs["accesses_of_unknown_blocks"] = events.unknown if device is None else 0
    out.attrs["trace_span_ns"] = (lo, hi)
    return out


def ati_only(intervals: pd.DataFrame) -> pd.DataFrame:
    """The ATI rows (kind ``access_to_access``, wrap-arounds included) of a frame from `access_intervals`."""
    mask = (intervals["kind"] == ATI_KIND).to_numpy()
    if mask.all():
        return intervals
    out = intervals[mask]
    out.attrs.update(intervals.attrs)
    return out
