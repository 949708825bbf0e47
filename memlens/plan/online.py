"""Online best-fit in time order (ONNX Runtime's arena planner) as an event sweep over free gaps.

Walking allocs and frees in time order (frees first at equal times, half-open lifetimes), the buffers
that conflict with a new one and are already placed are exactly the live ones, so the free gaps between
live buffers can be kept up to date incrementally instead of being rebuilt per buffer: a size-ordered list
answers "smallest gap that fits, lowest address on ties" by bisection, and two dicts keyed by gap start
and end merge a freed buffer with its neighbouring gaps. No conflict graph is needed, so this is the
heuristic that scales to the largest traces (O(n log n) plus list moves). It gives the same offsets as
`place_in_order(problem, order_by(problem, "online"), "best")` (tested) when no alignment above 1 is asked.
"""
from __future__ import annotations

import bisect

import numpy as np

from memlens.plan.problem import PlanProblem

_UNBOUNDED = float("inf")


def online_best_fit(problem: PlanProblem) -> np.ndarray:
    """Offsets (bytes) of online best-fit in allocation order: larger first at equal start times."""
    if (problem.alignment > 1).any():
        raise ValueError("the sweep assumes alignment 1; use place_in_order for aligned problems")
    act = np.flatnonzero(problem.active)
    start, end, size = problem.start[act], problem.end[act], problem.size[act]
    # events: (time, kind 0 = free / 1 = alloc, tie-break) -> frees first; allocs larger first, then index
    n = len(act)
    times = np.concatenate([end, start])
    kinds = np.concatenate([np.zeros(n, np.int64), np.ones(n, np.int64)])
    ties = np.concatenate([np.arange(n), -size * (n + 1) + np.arange(n)])
    order = np.lexsort((ties, kinds, times))
    who = np.concatenate([np.arange(n), np.arange(n)])[order].tolist()
    is_alloc = kinds[order].tolist()
    sizes = size.tolist()
    off = [0] * n
    by_size: list[tuple[int, int]] = []  # (gap size, gap start), sorted; the gap above everything excluded
    gap_end_at_start: dict[int, int] = {}
    gap_start_at_end: dict[int, int] = {}
    top_start = 0  # the unbounded gap above the highest live buffer starts here

    def add_gap(lo: int, hi: int) -> None:
        bisect.insort(by_size, (hi - lo, lo))
        gap_end_at_start[lo] = hi
        gap_start_at_end[hi] = lo

    def drop_gap(lo: int, hi: int) -> None:
        del by_size[bisect.bisect_left(by_size, (hi - lo, lo))]
        del gap_end_at_start[lo]
        del gap_start_at_end[hi]

    for b, alloc in zip(who, is_alloc):
        z = sizes[b]
        if alloc:
            k = bisect.bisect_left(by_size, (z, -1))
            if k < len(by_size):
                g, lo = by_size[k]
                drop_gap(lo, lo + g)
                if g > z:
                    add_gap(lo + z, lo + g)
                off[b] = lo
            else:
                off[b] = top_start
                top_start += z
            continue
        lo, hi = off[b], off[b] + z
        if hi in gap_end_at_start:  # merge with the gap just above
            above = gap_end_at_start[hi]
            drop_gap(hi, above)
            hi = above
        if lo in gap_start_at_end:  # and with the gap just below
            below = gap_start_at_end[lo]
            drop_gap(below, lo)
            lo = below
        if hi == top_start:
            top_start = lo
        else:
            add_gap(lo, hi)
    out = np.zeros(problem.n, np.int64)
    out[act] = off
    return out
