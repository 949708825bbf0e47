"""Pair allocations and frees that carry no address, by size (LIFO), vectorised.

Old profiler traces (2021 Kineto) log only signed byte counts. Any pairing that ends each free's block
among earlier live allocations of the same size on the same device reproduces the live-bytes curve
exactly; which of several equal-size blocks ends is unknowable, and LIFO (the most recent one) matches
how PyTorch frees temporaries. Per (device, size) the allocs (+1) and frees (-1) form a bracket sequence:
an alloc reaching depth L pairs with the next free leaving depth L. A free that reaches a new minimum has
no alloc before it (the block was live before recording).
"""
from __future__ import annotations

import numpy as np

from memlens.io.snapshot.pairing import Pairing


def pair_by_size_lifo(device: np.ndarray, size: np.ndarray, is_alloc: np.ndarray) -> Pairing:
    """Pair rows (already in time order) of allocs/frees; `size` is positive for both. Returns a `Pairing`
    (requested_row is always -1: these sources have one free event per block)."""
    n = len(size)
    row = np.arange(n, dtype=np.int64)
    if n == 0:
        empty = np.empty(0, dtype=np.int64)
        return Pairing(empty, empty, empty, empty, np.empty(0, dtype=np.int64))
    order = np.lexsort((row, size, device))
    d, s, a = device[order], size[order], is_alloc[order]
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = (d[1:] != d[:-1]) | (s[1:] != s[:-1])
    step = np.where(a, 1, -1)
    csum = np.cumsum(step)
    group_base = np.maximum.accumulate(np.where(new_group, csum - step, np.iinfo(np.int64).min))
    after = csum - group_base                     # depth after this row, within its group
    level = np.where(a, after, after + 1)         # the bracket level this row opens/closes
    group_id = np.cumsum(new_group) - 1
    # within (group, level) rows alternate open/close, except an unmatched free may lead the run
    by_level = np.lexsort((row[order], level, group_id))
    g, lv, op = group_id[by_level], level[by_level], a[by_level]
    run_start = np.ones(n, dtype=bool)
    run_start[1:] = (g[1:] != g[:-1]) | (lv[1:] != lv[:-1])
    run_id = np.cumsum(run_start) - 1
    first_in_run = np.flatnonzero(run_start)
    index_in_run = np.arange(n) - first_in_run[run_id]
    leading_free = ~op[first_in_run]              # a run that begins with a free: that free is unmatched
    index_in_run = index_in_run - leading_free[run_id]
    rows_sorted = order[by_level]

    unmatched_free = (~op) & (index_in_run < 0)
    opener = op & (index_in_run % 2 == 0)
    # the closer right after an opener in the same run is its free
    has_next = np.zeros(n, dtype=bool)
    has_next[:-1] = (run_id[1:] == run_id[:-1])
    closer_row = np.full(n, -1, dtype=np.int64)
    closer_row[:-1] = np.where(has_next[:-1], rows_sorted[1:], -1)

    alloc_rows = rows_sorted[opener]
    free_rows = closer_row[opener]
    orphan_rows = rows_sorted[unmatched_free]
    first = np.concatenate([alloc_rows, orphan_rows])
    alloc_row = np.concatenate([alloc_rows, np.full(len(orphan_rows), -1, dtype=np.int64)])
    completed = np.concatenate([free_rows, orphan_rows])
    by_time = np.argsort(first, kind="stable")
    first, alloc_row, completed = first[by_time], alloc_row[by_time], completed[by_time]
    block_of_row = np.full(n, -1, dtype=np.int64)
    ids = np.arange(len(first), dtype=np.int64)
    block_of_row[first] = ids
    has_free = completed >= 0
    block_of_row[completed[has_free]] = ids[has_free]
    return Pairing(first, alloc_row, np.full(len(first), -1, dtype=np.int64), completed, block_of_row)
