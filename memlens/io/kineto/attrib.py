"""Attribute instants to the innermost enclosing interval on the same thread, vectorised.

Ops recorded on one thread nest properly. With half-open intervals ``[start, end)`` the number of ops open
at time t is D(t) = #(start <= t) - #(end <= t), and the innermost open op is the latest-starting op whose
nesting depth is D(t) - 1 (ops at one depth never overlap, so the latest one started before t at that depth
is the open one). Depths come from the same two counts at each op's start, with ops ordered by
(start, longest first) so that a child sharing its parent's start sits one level deeper.
"""
from __future__ import annotations

import numpy as np


def innermost_enclosing(op_thread: np.ndarray, op_start: np.ndarray, op_end: np.ndarray,
                        q_thread: np.ndarray, q_time: np.ndarray) -> np.ndarray:
    """Index (into the op arrays) of the innermost op containing each query on the same thread, or -1.

    Threads are integer codes; times are int64 ns. Zero-length ops are widened to 1 ns.
    """
    result = np.full(len(q_time), -1, dtype=np.int64)
    if len(op_start) == 0 or len(q_time) == 0:
        return result
    op_end = np.maximum(op_end, op_start + 1)
    for thread in np.intersect1d(np.unique(op_thread), np.unique(q_thread)):
        ops = np.flatnonzero(op_thread == thread)
        ops = ops[np.lexsort((-op_end[ops], op_start[ops]))]
        starts, ends = op_start[ops], op_end[ops]
        ends_sorted = np.sort(ends)
        depth = np.arange(len(ops)) - np.searchsorted(ends_sorted, starts, side="right")
        span = int(max(ends.max(), q_time.max()) - min(starts.min(), q_time.min())) + 2
        base = int(min(starts.min(), q_time.min()))
        keys = depth.astype(np.int64) * span + (starts - base)
        by_key = np.argsort(keys, kind="stable")
        keys_sorted = keys[by_key]

        queries = np.flatnonzero(q_thread == thread)
        t = q_time[queries]
        open_now = np.searchsorted(starts, t, side="right") - np.searchsorted(ends_sorted, t, side="right")
        target = open_now - 1
        pos = np.searchsorted(keys_sorted, target.astype(np.int64) * span + (t - base), side="right") - 1
        found = (target >= 0) & (pos >= 0)
        cand = by_key[pos.clip(0)]
        found &= depth[cand] == target
        found &= (starts[cand] <= t) & (t < ends[cand])
        result[queries[found]] = ops[cand[found]]
    return result


def nesting(op_thread: np.ndarray, op_start: np.ndarray, op_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(parent, depth) of each op: the index of the innermost other op on the same thread that contains it
    (-1 for a top-level op, and for an op that only overlaps the one open around it) and its nesting depth
    (0 at top level: the number of ops open at its start). Same rules as `innermost_enclosing`: ops ordered
    by (start, longest first), so of two ops with the same span the first is the parent."""
    n = len(op_start)
    parent = np.full(n, -1, dtype=np.int64)
    depth_out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return parent, depth_out
    op_end = np.maximum(op_end, op_start + 1)
    for thread in np.unique(op_thread):
        ops = np.flatnonzero(op_thread == thread)
        ops = ops[np.lexsort((np.arange(len(ops)), -op_end[ops], op_start[ops]))]
        starts, ends = op_start[ops], op_end[ops]
        depth = np.arange(len(ops)) - np.searchsorted(np.sort(ends), starts, side="right")
        m = len(ops)
        keys = depth.astype(np.int64) * m + np.arange(m)
        by_key = np.argsort(keys, kind="stable")
        pos = np.searchsorted(keys[by_key], (depth - 1).astype(np.int64) * m + np.arange(m), side="right") - 1
        cand = by_key[pos.clip(0)]
        # the parent contains the child (within float rounding of the trace's microseconds); ops that only
        # overlap (not nested: a malformed trace) have none
        found = (depth > 0) & (pos >= 0) & (depth[cand] == depth - 1) & (ends[cand] >= ends - 2)
        parent[ops[found]] = ops[cand[found]]
        depth_out[ops] = np.maximum(depth, 0)
    return parent, depth_out
