"""Swap candidates: the idle intervals of blocks that are long enough to copy out to the host and back.

An idle interval runs from the end of the op that last touched a block to the start of the op that next
touches it (accesses are stamped with their op's start; the op holds the block until it ends). Only
intervals between two accesses qualify (the data must survive them); the interval before the first access
and after the last one are lifetime slack, not swaps. An interval of length L is swappable when
``L >= swap_out_ns(size) + swap_in_ns(size)`` (REFERENCE.md section 2); its duration of absence is
``DOA = L - swap_out_ns - swap_in_ns`` (Zhang et al.).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.ati import access_intervals

ATTRIBUTION = ("category", "op", "module")


def _op_end_at(trace, t_ns: np.ndarray) -> np.ndarray:
    """End time (ns) of the op that starts at each `t_ns` (the latest such end); `t_ns` itself if none."""
    ops = trace.ops
    if len(ops) == 0:
        return t_ns.copy()
    start = ops["start_ns"].to_numpy(np.int64)
    end = np.maximum(ops["end_ns"].to_numpy(np.int64), start)
    order = np.lexsort((end, start))
    start, end = start[order], end[order]
    pos = np.searchsorted(start, t_ns, side="right") - 1
    hit = (pos >= 0) & (start[np.clip(pos, 0, None)] == t_ns)
    return np.where(hit, end[np.clip(pos, 0, None)], t_ns)


def idle_intervals(trace, device: str) -> pd.DataFrame:
    """Every interval between two accesses of a block on `device`.

    Columns: block_id, size (bytes), idle_from_ns (end of the op of the earlier access), idle_to_ns (start of
    the op of the next access), idle_ns, plus the block's category/op/module. Raises NeedsAccessesError
    when the trace has no accesses.
    """
    iv = access_intervals(trace, device)
    iv = iv[(iv["kind"] == "access_to_access") & ~iv["truncated"]]
    t_from = _op_end_at(trace, iv["start_ns"].to_numpy(np.int64))
    t_to = iv["end_ns"].to_numpy(np.int64)
    out = pd.DataFrame({"block_id": iv["block_id"].to_numpy(np.int64), "size": iv["size"].to_numpy(np.int64),
                        "idle_from_ns": np.minimum(t_from, t_to), "idle_to_ns": t_to})
    out["idle_ns"] = out["idle_to_ns"] - out["idle_from_ns"]
    blocks = trace.blocks.set_index("block_id")
    for col in ATTRIBUTION:
        if col in blocks.columns:
            out[col] = blocks[col].reindex(out["block_id"]).to_numpy()
    return out.reset_index(drop=True)


def swap_candidates(intervals: pd.DataFrame, bandwidth, min_size: int = 0) -> pd.DataFrame:
    """The swappable intervals of at least `min_size` bytes, with transfer times and DOA (ns).

    Adds out_ns / in_ns (one transfer each way under `bandwidth`, a BandwidthModel) and doa_ns.
    """
    size = intervals["size"].to_numpy(np.int64)
    out_ns = np.ceil(np.asarray(bandwidth.swap_out_ns(size), dtype=np.float64)).astype(np.int64)
    in_ns = np.ceil(np.asarray(bandwidth.swap_in_ns(size), dtype=np.float64)).astype(np.int64)
    doa = intervals["idle_ns"].to_numpy(np.int64) - out_ns - in_ns
    keep = (doa > 0) & (size >= max(min_size, 1))
    out = intervals[keep].copy()
    out["out_ns"] = out_ns[keep]
    out["in_ns"] = in_ns[keep]
    out["doa_ns"] = doa[keep]
    return out.reset_index(drop=True)
