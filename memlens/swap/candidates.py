"""Swap candidates: the ATIs of blocks that are long enough to copy out to the host and back.

The intervals are the ATIs of `memlens.analysis.ati.access_intervals`, the one definition every analysis
uses: from the end of the op that last touched a block to the start of the op that next touches it. Only
intervals between two accesses qualify (the data must survive them); the lifetime edges (alloc -> first
access, last access -> free) are not swaps. In steady state the wrap-around interval of a block alive across
the iteration boundary (last access in iteration k -> first access in k+1) is a candidate like any other.
An interval of length L is swappable when ``L >= swap_out_ns(size) + swap_in_ns(size)`` (the
round trip over the host link); its duration of absence is ``DOA = L - swap_out_ns - swap_in_ns`` (Zhang et al.).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.ati import access_intervals, ati_only
from memlens.analysis.ati_intervals import first_access_in_window

ATTRIBUTION = ("category", "op", "module")


def idle_intervals(trace, device: str, *, steady_state: bool = False, iteration: int | None = None,
                   iterations: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every ATI of a block on `device` (`access_intervals`, steady state / one iteration as asked).

    Columns: block_id, size (bytes), idle_from_ns (end of the op of the earlier access), idle_to_ns (start of
    the op of the next access), idle_ns, wraps (crosses the iteration boundary), plus the block's
    category/op/module. ``attrs`` carry the intervals' clock, window and period. With `iteration`, the
    intervals are those of a period that repeats exactly: each ends by the block's first access in the
    window shifted by the period. Raises NeedsAccessesError when the trace has no accesses.
    """
    iv = ati_only(access_intervals(trace, device, steady_state=steady_state, iteration=iteration,
                                   iterations=iterations))
    out = pd.DataFrame({"block_id": iv["block_id"].to_numpy(np.int64), "size": iv["size"].to_numpy(np.int64),
                        "idle_from_ns": iv["start_ns"].to_numpy(np.int64),
                        "idle_to_ns": iv["end_ns"].to_numpy(np.int64),
                        "wraps": iv["wraps"].to_numpy(bool)})
    period = iv.attrs.get("period_ns")
    if iteration is not None and period:
        out["idle_to_ns"] = _periodic_deadline(trace, out, tuple(iv.attrs["window_ns"]), int(period))
    out["idle_ns"] = out["idle_to_ns"] - out["idle_from_ns"]
    blocks = trace.blocks.drop_duplicates("block_id").set_index("block_id")
    for col in ATTRIBUTION:
        if col in blocks.columns:
            out[col] = blocks[col].reindex(out["block_id"]).to_numpy()
    out.attrs.update(iv.attrs)
    return out.reset_index(drop=True)


def swap_candidates(intervals: pd.DataFrame, bandwidth, min_size: int = 0) -> pd.DataFrame:
    """The swappable intervals of at least `min_size` bytes, with transfer times and DOA (ns).

    Adds out_ns / in_ns (one transfer each way under `bandwidth`, a BandwidthModel, latency included) and
    doa_ns (idle - out - in, Zhang et al.'s duration of absence).
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


def _periodic_deadline(trace, iv: pd.DataFrame, window: tuple[int, int], period: int) -> np.ndarray:
    """The end of each interval when the iteration repeats exactly: a block's first access in the window
    (the start of its op) comes back one period later, so no interval may run past it (the next recorded
    iteration may have been slower), and none lasts a whole period (1 ns less: the block is back for its
    access)."""
    first = first_access_in_window(trace, window)
    again = first.reindex(iv["block_id"].to_numpy(np.int64)).to_numpy(np.float64) + period
    idle_from = iv["idle_from_ns"].to_numpy(np.int64)
    deadline = np.minimum(iv["idle_to_ns"].to_numpy(np.int64), idle_from + period - 1)
    deadline = np.where(np.isnan(again), deadline, np.minimum(deadline, np.nan_to_num(again).astype(np.int64)))
    return np.maximum(deadline, idle_from)
