"""`retime(trace, gpu="H100")`: the same trace on the modeled clock of a GPU.

What changes (and why it stays a consistent trace):
- Ops keep their recorded order and run back to back on one device stream, each for its modeled
  duration (`memlens.devicetime.costmodel`): a device that is never starved by its host. Ops that launch
  no kernel take 0 ns. New columns: ``device_ns``, ``op_class``, ``kernels``, and the old interval as
  ``recorded_start_ns`` / ``recorded_end_ns`` (the recorded clock, for side-by-side views).
- Accesses are re-stamped inside their op: reads at its start, writes at its end.
- Every other time (block alloc/free, allocator events, accesses without an op) goes through one
  monotone map from the old clock to the new: a time inside an op keeps its relative position in the
  op, a time between ops lands at the boundary between them. Because the map never reverses order and
  op boundaries map exactly, every access stays inside its block's lifetime when it was inside before.
- ``trace.metadata["clock"] = {"kind": "modeled", "gpu": ..., "model": ..., "from": <old clock kind>}``.
"""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd

from memlens.devicetime.costmodel import MODEL_NAME, device_times, has_cost_facts
from memlens.devicetime.gpus import GPU, gpu as resolve_gpu
from memlens.errors import InputError
from memlens.trace import Trace


def clock_of(trace: Trace) -> dict:
    """The clock a trace's times are on: ``{"kind": "host"|"cuda"|"modeled", ...}`` (absent means host)."""
    clock = (trace.metadata or {}).get("clock")
    return dict(clock) if isinstance(clock, dict) and clock.get("kind") else {"kind": "host"}


def clock_label(trace_or_clock) -> str:
    """A short phrase naming the clock, for titles and report sections: "host clock",
    "measured CUDA kernel clock", "modeled H100 SXM clock"."""
    clock = trace_or_clock if isinstance(trace_or_clock, dict) else clock_of(trace_or_clock)
    kind = clock.get("kind", "host")
    if kind == "modeled":
        return f"modeled {clock.get('gpu', 'GPU')} clock"
    if kind == "cuda":
        return "measured CUDA kernel clock" + (f" ({clock['gpu']})" if clock.get("gpu") else "")
    return "host clock" + (f" ({clock['device']})" if clock.get("device") else "")


def op_schedule(ops: pd.DataFrame, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Recorded order (by start, then op_id) and back-to-back (start, end) ns for ops lasting `durations`.

    Returns (order, start, end) where start/end are aligned with `ops` rows (not with `order`)."""
    n = len(ops)
    order = np.lexsort((ops["op_id"].to_numpy(), ops["start_ns"].to_numpy()))
    dur = np.asarray(durations, dtype=np.int64)[order]
    end_sorted = np.cumsum(dur)
    start_sorted = end_sorted - dur
    start = np.empty(n, dtype=np.int64)
    end = np.empty(n, dtype=np.int64)
    start[order] = start_sorted
    end[order] = end_sorted
    return order, start, end


class ClockMap:
    """Monotone map from the old clock to the new one, defined by op intervals old [s, e] -> new [S, E]."""

    def __init__(self, old_start, old_end, new_start, new_end):
        order = np.lexsort((np.arange(len(old_start)), old_start))
        self.hs = np.asarray(old_start, dtype=np.int64)[order]
        self.he = np.asarray(old_end, dtype=np.int64)[order]
        self.S = np.asarray(new_start, dtype=np.int64)[order]
        self.E = np.asarray(new_end, dtype=np.int64)[order]
        # running max of the new ends: a time after a nested/overlapping op's end never maps backwards
        self.E_run = np.maximum.accumulate(self.E) if len(self.E) else self.E

    def __call__(self, t) -> np.ndarray:
        """Map old-clock times (int64 array) to the new clock; times before the first op map to 0."""
        t = np.asarray(t, dtype=np.int64)
        if len(self.hs) == 0:
            return np.zeros_like(t)
        i = np.searchsorted(self.hs, t, side="right") - 1
        safe = np.clip(i, 0, None)
        hs, he, S, E = self.hs[safe], self.he[safe], self.S[safe], self.E[safe]
        span = np.maximum(he - hs, 1)
        inside = (t < he) & (i >= 0)
        frac = np.clip((t - hs) / span, 0.0, 1.0)
        mapped = np.where(inside, S + np.rint(frac * (E - S)).astype(np.int64), self.E_run[safe])
        return np.where(i < 0, 0, mapped).astype(np.int64)


def _map_nullable(series: pd.Series, fmap: ClockMap) -> pd.Series:
    values = series.to_numpy(dtype="float64", na_value=np.nan)
    known = ~np.isnan(values)
    out = pd.array(np.zeros(len(values), dtype=np.int64), dtype="Int64")
    if known.any():
        out[known] = fmap(values[known].astype(np.int64))
    out[~known] = pd.NA
    return pd.Series(out, index=series.index)


def retime(trace: Trace, gpu="H100", *, tf32: bool = False) -> Trace:
    """A new Trace on the modeled clock of `gpu` (a name from `memlens.gpus()` or a `memlens.GPU`).

    `tf32`: fp32 matmuls run at the TF32 tensor-core rate (``torch.backends.cuda.matmul.allow_tf32``;
    off by default in PyTorch). Needs the ops table's cost facts (recorded by memlens); raises
    `InputError` for a trace without them. The input trace is not modified.
    """
    g = resolve_gpu(gpu)
    if not isinstance(trace, Trace):
        raise InputError(f"retime needs a memlens.Trace, not {type(trace).__name__}")
    ops = trace.ops
    if not has_cost_facts(ops):
        raise InputError("the trace has no per-op cost facts (flops/bytes per op), so it cannot be put on a "
                         "device clock; record it with memlens.record (imported snapshots and profiler traces "
                         "carry no op shapes)")
    dt = device_times(ops, g, tf32=tf32)
    order, start, end = op_schedule(ops, dt["device_ns"].to_numpy())
    fmap = ClockMap(ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64), start, end)

    new_ops = ops.drop(columns=[c for c in ("kernel_start_ns", "kernel_end_ns", "kernels", "device_ns",
                                            "op_class") if c in ops.columns]).copy()
    new_ops["recorded_start_ns"] = ops["start_ns"].to_numpy(np.int64) if "recorded_start_ns" not in ops else \
        ops["recorded_start_ns"].to_numpy(np.int64)
    new_ops["recorded_end_ns"] = ops["end_ns"].to_numpy(np.int64) if "recorded_end_ns" not in ops else \
        ops["recorded_end_ns"].to_numpy(np.int64)
    new_ops["start_ns"] = start
    new_ops["end_ns"] = end
    new_ops["device_ns"] = dt["device_ns"].to_numpy()
    new_ops["op_class"] = dt["op_class"].to_numpy()
    new_ops["kernels"] = dt["kernels"].to_numpy()

    acc = trace.accesses.copy()
    if len(acc):
        pos = pd.Index(ops["op_id"].to_numpy()).get_indexer(acc["op_id"].to_numpy())
        known = pos >= 0
        t = fmap(acc["t_ns"].to_numpy(np.int64))
        write = acc["is_write"].to_numpy(bool)
        safe = np.clip(pos, 0, None)
        t = np.where(known, np.where(write, end[safe], start[safe]), t)
        acc["t_ns"] = t.astype(np.int64)

    blocks = trace.blocks.copy()
    blocks["alloc_ns"] = _map_nullable(blocks["alloc_ns"], fmap)
    blocks["free_ns"] = _map_nullable(blocks["free_ns"], fmap)
    extra = {}
    for name in ("segments", "segment_blocks", "stacks"):
        if trace.table(name) is not None:
            extra[name] = trace.table(name).copy()
    if trace.events is not None:
        ev = trace.events.copy()
        ev["t_ns"] = fmap(ev["t_ns"].to_numpy(np.int64))
        extra["events"] = ev

    meta = copy.deepcopy(trace.metadata)
    old = clock_of(trace)
    meta["clock"] = {"kind": "modeled", "gpu": g.name, "model": MODEL_NAME, "from": old.get("kind", "host"),
                     "tf32": bool(tf32), "device_busy_ns": int(dt["device_ns"].sum()),
                     "kernels": int(dt["kernels"].sum())}
    meta["gpu"] = g.to_dict()
    notes = list(meta.get("notes", []))
    notes.append(f"times are on the {clock_label(meta['clock'])} (retimed from the {old.get('kind', 'host')} "
                 f"clock: ops back to back in recorded order, durations from the per-op cost model)")
    meta["notes"] = notes
    return Trace.from_tables(blocks, acc, new_ops, metadata=meta, **extra)
