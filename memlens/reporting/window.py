"""A smaller trace around the peak, for analyses too slow to run on a whole big trace inside a report.

The what-if simulations (allocator replay, static planning, swap planning) grow faster than linearly with
the number of blocks. On a big trace the report runs them on the window that matters most, the stretch
around the device's peak, and says so. The window is the iteration holding the peak when it is small enough,
otherwise the `max_blocks` allocations nearest to the peak. Blocks alive across a window edge are cut there:
alive at the start means allocated before recording, alive at the end means never freed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass
class Window:
    """``trace`` (times shifted so the window starts at 0), ``start_ns`` / ``end_ns`` (in the original
    trace), ``blocks`` (in the window) of ``total_blocks``, and ``how`` it was chosen (a phrase)."""

    trace: object
    start_ns: int
    end_ns: int
    blocks: int
    total_blocks: int
    how: str


def _bounds_around_peak(trace, device: str, max_blocks: int, iterations: pd.DataFrame | None) -> tuple[int, int, str]:
    curve = trace.live_bytes(device)
    i_peak = int(np.argmax(curve["live"].to_numpy()))
    t_peak = int(curve["t_ns"].iloc[i_peak])
    if iterations is not None and len(iterations) and str(iterations["source"].iloc[0]) != "none":
        # iterations are [start, end): a peak at the instant one starts is in the one it starts
        its = iterations.sort_values("start_ns", kind="stable")
        pos = int(np.searchsorted(its["start_ns"].to_numpy(np.int64), t_peak, side="right")) - 1
        hit = its.iloc[pos:pos + 1] if pos >= 0 and int(its["end_ns"].iloc[pos]) >= t_peak else its.iloc[:0]
        if len(hit):
            t0, t1 = int(hit["start_ns"].iloc[0]), int(hit["end_ns"].iloc[0])
            lt = trace.lifetimes()
            n = int(((lt["start_ns"] <= t1) & (lt["end_ns"] >= t0)).sum())
            if n <= max_blocks:
                return t0, t1, f"iteration {int(hit['iteration'].iloc[0])}, which holds the peak of {device}"
    alloc_t = np.sort(trace.blocks["alloc_ns"].dropna().to_numpy(dtype=np.int64))
    k = int(np.searchsorted(alloc_t, t_peak, side="right"))
    half = max(max_blocks // 4, 1)  # blocks alive across the edges also count: leave room for them
    lo = alloc_t[max(k - half, 0)] if len(alloc_t) else t_peak
    hi = alloc_t[min(k + half, len(alloc_t) - 1)] if len(alloc_t) else t_peak
    return int(min(lo, t_peak)), int(max(hi, t_peak)), f"the {2 * half:,} allocations around the peak of {device}"


def peak_window(trace, max_blocks: int, iterations: pd.DataFrame | None = None) -> Window:
    """The trace itself when it has at most `max_blocks` blocks, else a window around the highest peak."""
    total = len(trace.blocks)
    if total <= max_blocks:
        lo, hi = trace.time_span_ns()
        return Window(trace, lo, hi, total, total, "the whole trace")
    peaks = trace.peak_live_bytes()
    device = max(peaks, key=peaks.get)
    t0, t1, how = _bounds_around_peak(trace, device, max_blocks, iterations)
    lt = trace.lifetimes()
    keep = ((lt["start_ns"] <= t1) & (lt["end_ns"] >= t0)).to_numpy()
    return cut_window(trace.blocks[keep], trace.accesses, trace.ops, trace.metadata, t0, t1, total, how,
                      stacks=trace.stacks)


def cut_window(blocks: pd.DataFrame, accesses: pd.DataFrame, ops: pd.DataFrame, metadata: dict, t0: int, t1: int,
               total: int, how: str, **optional) -> Window:
    """The `Window` [t0, t1] (ns) made of `blocks` (those alive at some time in it), the `accesses` and `ops`
    (filtered here to the window), times shifted so it starts at 0 and blocks cut at its edges. `optional`
    tables (stacks, segments) are passed on as they are. Shared by `peak_window` and the out-of-core report,
    which reads the window's rows from disk."""
    from memlens.trace import Trace

    b = blocks.drop(columns=["alloc_seq", "free_seq"]).copy()
    cut_start = (b["alloc_ns"].isna() | (b["alloc_ns"] < t0)).to_numpy()
    cut_end = (b["free_ns"].notna() & (b["free_ns"] > t1)).to_numpy()
    b["allocated_before"] = b["allocated_before"].to_numpy() | cut_start
    b["alloc_ns"] = (b["alloc_ns"] - t0).astype("Int64")
    b.loc[cut_start, "alloc_ns"] = pd.NA
    b["free_ns"] = (b["free_ns"] - t0).astype("Int64")
    b.loc[cut_end, "free_ns"] = pd.NA
    acc = accesses
    acc = acc[(acc["t_ns"] >= t0) & (acc["t_ns"] <= t1) & acc["block_id"].isin(b["block_id"])].copy()
    acc["t_ns"] -= t0
    ops = ops[(ops["start_ns"] >= t0) & (ops["start_ns"] <= t1)].copy()
    ops["start_ns"] -= t0
    ops["end_ns"] -= t0
    meta = {k: v for k, v in metadata.items() if k not in ("devices", "notes")}
    meta["notes"] = [f"window [{t0}, {t1}] ns of a {total:,}-block trace: {how}"]
    sub = Trace.from_tables(b, acc, ops, meta, **optional)
    return Window(sub, t0, t1, int(len(b)), total, how)
