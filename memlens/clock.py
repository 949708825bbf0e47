"""Which clock a trace's times are on, and moving a trace from one clock to another.

``trace.metadata["clock"] = {"kind": "host"|"cuda"|"modeled", "gpu": ..., "model": ...}``, the same keys on
every trace (`memlens.trace.schema.CLOCK_KEYS`).

Device time, one meaning on every device clock (measured, modeled, calibrated): each op has its own time,
``device_self_ns`` (what it launched itself, not what the ops nested in it launched), and its inclusive
time, ``device_ns`` (its own plus its children's, summed: `inclusive_ns`). So the top-level ops' ``device_ns``
add up to ``metadata["clock"]["device_busy_ns"]``, and so do all ops' ``device_self_ns``; summing
``device_ns`` over nested ops counts a child once per op around it. `restamp` puts a trace on a new clock given each op's new interval; `onto_kernel_clock`
does it with the measured CUDA kernel times of each op (the recorder's CUDA path). `memlens.retime`
(in `memlens.devicetime`) does it with modeled durations.

Re-stamping rules (the same for every clock): accesses move inside their op (reads at its new start,
writes at its new end); every other time (block alloc/free, allocator events, accesses without an op)
goes through one monotone map: a time inside an op keeps its relative position in the op, a time between
ops lands on the boundary between them. The map never reverses order and op boundaries map exactly, so
an access inside its block's lifetime stays inside it.
"""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd

from memlens.trace.schema import make_clock
from memlens.trace import Trace, clock_of


def clock_label(trace_or_clock) -> str:
    """A short phrase naming the clock, for titles and report sections: "host clock",
    "measured CUDA kernel clock (NVIDIA H100 80GB HBM3)", "modeled H100 SXM clock"."""
    clock = trace_or_clock if isinstance(trace_or_clock, dict) else clock_of(trace_or_clock)
    kind = clock.get("kind", "host")
    if kind == "modeled":
        return f"modeled {clock.get('gpu', 'GPU')} clock"
    if kind == "cuda":
        return "measured CUDA kernel clock" + (f" ({clock['gpu']})" if clock.get("gpu") else "")
    return "host clock"


def tf32_label(setting) -> str:
    """'TF32 matmul off, conv on (matmul assumed: PyTorch >= 1.12 defaults; ...)' for a modeled clock's
    ``tf32`` entry (the dict `memlens.retime` writes, or a bool as older traces have it); "" for None."""
    if setting is None:
        return ""
    if isinstance(setting, dict):
        matmul, conv, source = bool(setting.get("matmul")), bool(setting.get("conv")), setting.get("source") or ""
    else:
        matmul = conv = bool(setting)
        source = ""
    text = f"TF32 matmul {'on' if matmul else 'off'}, conv {'on' if conv else 'off'}"
    return text + (f" ({source})" if source else "")


class ClockMap:
    """Monotone map from the old clock to the new one, defined by op intervals old [s, e] -> new [S, E]
    (new starts non-decreasing in old-start order)."""

    def __init__(self, old_start, old_end, new_start, new_end):
        order = np.lexsort((np.arange(len(old_start)), np.asarray(old_start)))
        self.hs = np.asarray(old_start, dtype=np.int64)[order]
        self.he = np.asarray(old_end, dtype=np.int64)[order]
        self.S = np.asarray(new_start, dtype=np.int64)[order]
        self.E = np.asarray(new_end, dtype=np.int64)[order]
        # running max of the new ends: a time after a nested or overlapping op never maps backwards
        self.E_run = np.maximum.accumulate(self.E) if len(self.E) else self.E

    def __call__(self, t) -> np.ndarray:
        """Map old-clock times (int64 array, ns) to the new clock; times before the first op map to the
        first op's new start."""
        t = np.asarray(t, dtype=np.int64)
        if len(self.hs) == 0:
            return np.zeros_like(t)
        i = np.searchsorted(self.hs, t, side="right") - 1
        safe = np.clip(i, 0, None)
        hs, he, S, E = self.hs[safe], self.he[safe], self.S[safe], self.E[safe]
        span = np.maximum(he - hs, 1)
        inside = (t < he) & (i >= 0)
        frac = np.clip((t - hs) / span, 0.0, 1.0)
        mapped = np.where(inside, S + np.rint(frac * (E - S)).astype(np.int64),
                          np.maximum(self.E_run[safe], S))
        return np.where(i < 0, self.S[0], mapped).astype(np.int64)


def _map_nullable(series: pd.Series, fmap: ClockMap) -> pd.Series:
    values = series.to_numpy(dtype="float64", na_value=np.nan)
    known = ~np.isnan(values)
    out = pd.array(np.zeros(len(values), dtype=np.int64), dtype="Int64")
    if known.any():
        out[known] = fmap(values[known].astype(np.int64))
    out[~known] = pd.NA
    return pd.Series(out, index=series.index)


def restamp(trace: Trace, start, end, clock: dict, *, op_columns: dict | None = None,
            drop_columns=(), note: str | None = None) -> Trace:
    """A new Trace whose op i runs over [start[i], end[i]] (ns, aligned with `trace.ops` rows; starts
    non-decreasing in recorded order), with accesses, blocks and events re-stamped (module docstring).

    The old op interval is kept as ``recorded_start_ns`` / ``recorded_end_ns`` (the first recording's, when
    the trace was already re-stamped). `op_columns` adds columns to the ops table; `clock` becomes
    ``metadata["clock"]`` (with ``"from"``: the old clock's kind). The input trace is not modified.
    """
    ops = trace.ops
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    fmap = ClockMap(ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64), start, end)
    new_ops = ops.drop(columns=[c for c in drop_columns if c in ops.columns]).copy()
    for col, src in (("recorded_start_ns", "start_ns"), ("recorded_end_ns", "end_ns")):
        new_ops[col] = (ops[col] if col in ops.columns else ops[src]).to_numpy(np.int64)
    new_ops["start_ns"] = start
    new_ops["end_ns"] = end
    for col, values in (op_columns or {}).items():
        new_ops[col] = values

    acc = trace.accesses.copy()
    if len(acc):
        pos = pd.Index(ops["op_id"].to_numpy()).get_indexer(acc["op_id"].to_numpy())
        known = pos >= 0
        t = fmap(acc["t_ns"].to_numpy(np.int64))
        safe = np.clip(pos, 0, None)
        t = np.where(known, np.where(acc["is_write"].to_numpy(bool), end[safe], start[safe]), t)
        acc["t_ns"] = t.astype(np.int64)
    blocks = trace.blocks.copy()
    blocks["alloc_ns"] = _map_nullable(blocks["alloc_ns"], fmap)
    blocks["free_ns"] = _map_nullable(blocks["free_ns"], fmap)
    extra = {name: trace.table(name).copy() for name in ("segments", "segment_blocks", "stacks")
             if trace.table(name) is not None}
    if trace.events is not None:
        ev = trace.events.copy()
        ev["t_ns"] = fmap(ev["t_ns"].to_numpy(np.int64))
        extra["events"] = ev
    meta = copy.deepcopy(trace.metadata)
    old = clock_of(trace)
    meta["clock"] = make_clock(**{**clock, "from": old.get("kind", "host")})
    notes = list(meta.get("notes", []))
    notes.append(note or f"times are on the {clock_label(meta['clock'])} (re-stamped from the "
                         f"{old.get('kind', 'host')} clock)")
    meta["notes"] = notes
    return Trace.from_tables(blocks, acc, new_ops, metadata=meta, **extra)


def op_parents(ops: pd.DataFrame) -> np.ndarray:
    """Row of each op's parent (the op it is nested in, from ``parent_op_id``), -1 for a top-level op (and
    for every op of a table without nesting)."""
    if "parent_op_id" not in ops.columns or len(ops) == 0:
        return np.full(len(ops), -1, dtype=np.int64)
    parent_id = ops["parent_op_id"].to_numpy(dtype="float64", na_value=np.nan)
    rows = pd.Index(ops["op_id"].to_numpy()).get_indexer(np.where(np.isnan(parent_id), -1, parent_id).astype(np.int64))
    return np.where(np.isnan(parent_id), -1, rows).astype(np.int64)


def _depths(parent: np.ndarray) -> np.ndarray:
    depth = np.zeros(len(parent), dtype=np.int64)
    has = parent >= 0
    for _ in range(len(parent)):    # one level per pass; a cycle (a malformed table) stops at n passes
        new = np.where(has, depth[parent.clip(0)] + 1, 0)
        if (new == depth).all():
            break
        depth = new
    return depth


def inclusive_ns(self_ns, parent: np.ndarray) -> np.ndarray:
    """Each op's inclusive device time: its own `self_ns` plus that of every op nested in it (`parent`:
    `op_parents`), ns."""
    total = np.asarray(self_ns, dtype=np.int64).copy()
    depth = _depths(parent)
    for d in range(int(depth.max()) if len(depth) else 0, 0, -1):    # deepest first: children into parents
        kids = np.flatnonzero((depth == d) & (parent >= 0))
        np.add.at(total, parent[kids], total[kids])
    return total


def self_ns_of(inclusive, parent: np.ndarray) -> np.ndarray:
    """Each op's own device time: its `inclusive` time less its children's inclusive times, ns."""
    inclusive = np.asarray(inclusive, dtype=np.int64)
    children = np.zeros(len(inclusive), dtype=np.int64)
    kids = np.flatnonzero(parent >= 0)
    np.add.at(children, parent[kids], inclusive[kids])
    return inclusive - children


def device_time_columns(ops: pd.DataFrame, *, self_ns=None, inclusive=None) -> tuple[dict, int]:
    """({"device_self_ns", "device_ns"} columns, device_busy_ns) for `ops` given either each op's own time
    or its inclusive time (ns): the contract of the module docstring, the busy time being the top-level
    ops' inclusive sum."""
    parent = op_parents(ops)
    if inclusive is None:
        own = np.asarray(self_ns, dtype=np.int64)
        inclusive = inclusive_ns(own, parent)
    else:
        inclusive = np.asarray(inclusive, dtype=np.int64)
        own = self_ns_of(inclusive, parent)
    return {"device_self_ns": own, "device_ns": inclusive}, int(inclusive[parent < 0].sum())


def kernel_intervals(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per op (rows of `ops`), the measured device interval from its ``kernel_start_ns`` /
    ``kernel_end_ns`` (trace ns): ops that launched nothing sit at zero length where the device is at
    that point (a nested op, ``depth`` > 0 in an imported profile, where its parent's kernels began: not
    after them); starts are made non-decreasing in recorded order (one position per op even when
    kernels of different streams overlap)."""
    n = len(ops)
    order = np.lexsort((ops["op_id"].to_numpy(), ops["start_ns"].to_numpy()))
    ks = ops["kernel_start_ns"].to_numpy(dtype="float64", na_value=np.nan)[order]
    ke = ops["kernel_end_ns"].to_numpy(dtype="float64", na_value=np.nan)[order]
    nested = (ops["depth"].to_numpy() > 0)[order] if "depth" in ops.columns else np.zeros(n, dtype=bool)
    has = ~np.isnan(ks)
    first = ks[has].min() if has.any() else 0.0
    S = np.empty(n, dtype=np.int64)
    E = np.empty(n, dtype=np.int64)
    pos_s = pos_e = int(first)
    for i in range(n):           # one pass; ops are few compared with accesses (Python is fine here)
        if has[i]:
            s = max(int(ks[i]), pos_s)
            e = max(int(ke[i]), s)
            pos_s, pos_e = s, max(pos_e, e)
        else:
            s = e = pos_s if nested[i] else max(pos_s, pos_e)
            pos_s = s
        S[i], E[i] = s, e
    start, end = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    start[order], end[order] = S - int(first), E - int(first)
    return start, end


def onto_kernel_clock(trace: Trace, gpu: str | None = None) -> Trace:
    """The trace on the measured device clock: each op spans its kernels, memcpys and memsets (first start
    to last end, from the ``kernel_start_ns`` / ``kernel_end_ns`` columns that the recorder fills from CUDA
    activity and the Kineto importer from the profile's GPU events); ops that launched nothing take 0 ns.
    ``device_ns`` is each op's inclusive device time (``kernel_busy_ns`` when the trace has it: in an imported
    profile, the summed time of the activity the op and the ops nested in it launched) and ``device_self_ns``
    its own (module docstring). ``metadata["clock"]``: kind "cuda", `gpu` (default: the profile's device
    name), ``device_busy_ns`` (the top-level ops' ``device_ns`` summed: every attributed kernel, copy and
    memset once) and ``kernels``. Raises `InputError` when the trace has no kernel times."""
    from memlens.errors import InputError
    ops = trace.ops
    if "kernel_start_ns" not in ops.columns or ops["kernel_start_ns"].notna().sum() == 0:
        raise InputError("the trace has no GPU kernel times per op (record on CUDA with kernel_times=True, or "
                         "import a profile that has kernels, i.e. torch.profiler with CUDA activities)")
    start, end = kernel_intervals(ops)
    top = ops["parent_op_id"].isna().to_numpy() if "parent_op_id" in ops.columns else np.ones(len(ops), bool)
    if "kernel_busy_ns" in ops.columns:
        busy = ops["kernel_busy_ns"].to_numpy(dtype="float64", na_value=0).astype(np.int64)
        device_ns = np.where(ops["kernel_start_ns"].notna().to_numpy(), busy, end - start)
    else:
        device_ns = end - start
    kernels = int(ops["kernels"].fillna(0).to_numpy()[top].sum()) if "kernels" in ops.columns else None
    columns, busy_total = device_time_columns(ops, inclusive=device_ns)
    if gpu is None:
        props = trace.metadata.get("deviceProperties")
        gpu = props[0].get("name") if isinstance(props, list) and props and isinstance(props[0], dict) else None
    clock = make_clock("cuda", gpu=gpu, device_busy_ns=int(busy_total), kernels=kernels)
    return restamp(trace, start, end, clock, op_columns=columns,
                   note="times are on the measured device kernel clock: each op spans the kernels, copies and "
                        "memsets it launched (first start to last end); ops without any take 0 ns")
