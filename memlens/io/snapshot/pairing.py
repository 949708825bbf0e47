"""Pair a snapshot's alloc / free_requested / free_completed entries into blocks, vectorised.

An address on a device is reused by many blocks over time. Sorting the block entries by
(device, address, seq) lines each block's entries up; a block begins at every ``alloc``, at the first
entry of an address, and at any entry that follows a ``free_completed`` of the same address without an
``alloc`` in between. The last two cases are frees whose alloc the trace never saw (the ring buffer
dropped it, or the block was allocated before recording began).

Each block keeps the row of its ``alloc`` (or -1), of its first ``free_requested`` (or -1) and of its
``free_completed`` (or -1). The rows are indices into the caller's event arrays.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALLOC, FREE_REQUESTED, FREE_COMPLETED = 0, 1, 2


@dataclass
class Pairing:
    """Blocks found in the event arrays, numbered in order of their first entry."""

    first_row: np.ndarray       # int64 per block: the block's first entry
    alloc_row: np.ndarray       # int64 per block, -1 when the alloc was not seen
    requested_row: np.ndarray   # int64 per block, -1 when no free_requested was seen
    completed_row: np.ndarray   # int64 per block, -1 while the block is live at the end
    block_of_row: np.ndarray    # int64 per event row, -1 for rows that are not block entries

    def __len__(self) -> int:
        return len(self.first_row)


def _first_per_group(groups: np.ndarray, rows: np.ndarray, n_groups: int) -> np.ndarray:
    """For each group 0..n_groups-1 the first of `rows` (in the given order) in it, else -1."""
    out = np.full(n_groups, -1, dtype=np.int64)
    if len(groups):
        uniq, first = np.unique(groups, return_index=True)
        out[uniq] = rows[first]
    return out


def pair_blocks(device: np.ndarray, kind: np.ndarray, addr: np.ndarray, seq: np.ndarray) -> Pairing:
    """Pair block entries. `kind` holds ALLOC / FREE_REQUESTED / FREE_COMPLETED, or -1 for rows that are
    not block entries (segment events, ooms); `device` is an integer code; `seq` orders the rows."""
    n = len(kind)
    rows = np.flatnonzero(kind >= 0)
    block_of_row = np.full(n, -1, dtype=np.int64)
    if len(rows) == 0:
        empty = np.empty(0, dtype=np.int64)
        return Pairing(empty, empty, empty, empty, block_of_row)
    order = rows[np.lexsort((seq[rows], addr[rows], device[rows]))]
    d, a, k = device[order], addr[order], kind[order]
    start = np.ones(len(order), dtype=bool)
    start[1:] = (d[1:] != d[:-1]) | (a[1:] != a[:-1]) | (k[:-1] == FREE_COMPLETED)
    start |= k == ALLOC
    block = np.cumsum(start) - 1
    n_blocks = int(block[-1]) + 1

    first_row = order[start]
    alloc_row = np.where(k[start] == ALLOC, first_row, -1)
    req = k == FREE_REQUESTED
    requested_row = _first_per_group(block[req], order[req], n_blocks)
    comp = k == FREE_COMPLETED
    completed_row = _first_per_group(block[comp], order[comp], n_blocks)

    # renumber blocks by the seq of their first entry, so block ids follow the trace
    renumber = np.empty(n_blocks, dtype=np.int64)
    by_time = np.argsort(seq[first_row], kind="stable")
    renumber[by_time] = np.arange(n_blocks)
    block_of_row[order] = renumber[block]
    return Pairing(first_row[by_time], alloc_row[by_time], requested_row[by_time],
                   completed_row[by_time], block_of_row)
