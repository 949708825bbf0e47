"""Where in time each access of a block sits: one event per (block, op), at its op's edges.

Recorders stamp a read at its op's start and a write at its op's end, so an access's own stamp is not
where its op began; an access sits between its op's edges instead. An op that touches a block several times
(it reads and writes it: two rows) touches it once, whatever the stamps say: its event spans the op's edges
widened to cover every one of those stamps (a recorder's clock skew may put a stamp before the op's start or
after its end). An op the ``ops`` table lacks has no edges: its event spans its stamps. The intervals of
`memlens.analysis.ati_intervals` run between these events.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd


class BlockEvents(NamedTuple):
    """The events of the accesses of some blocks, ordered by (row, start, end). ``row``: position of the
    block in the ``block_ids`` asked for; ``start``/``end``: ns, the op's edges widened to the stamps;
    ``first_stamp``/``last_stamp``: ns, the earliest/latest own stamp among the event's accesses;
    ``accesses``: how many access rows belong to known blocks (the others are ``unknown``)."""
    row: np.ndarray
    start: np.ndarray
    end: np.ndarray
    first_stamp: np.ndarray
    last_stamp: np.ndarray
    accesses: int
    unknown: int


def block_events(trace, block_ids: np.ndarray) -> BlockEvents:
    """One event per (block, op) for the blocks `block_ids` (accesses of other blocks are left out and
    counted in ``unknown``): see the module docstring. Events of one block with equal edges keep one order
    that does not depend on the recorded order of the rows."""
    acc = trace.accesses
    row = block_rows(np.asarray(block_ids, dtype=np.int64), acc["block_id"].to_numpy(dtype=np.int64))
    stamp = acc["t_ns"].to_numpy(dtype=np.int64)
    op = acc["op_id"].to_numpy(dtype=np.int64)
    known = row >= 0
    unknown = int(len(row) - np.count_nonzero(known))
    if unknown:
        row, stamp, op = row[known], stamp[known], op[known]
    ops = trace.ops
    op_row = block_rows(ops["op_id"].to_numpy(dtype=np.int64), op) if len(ops) else np.full(len(op), -1)
    has_op = op_row >= 0
    safe = np.maximum(op_row, 0)
    raw_start = ops["start_ns"].to_numpy(dtype=np.int64)[safe] if len(ops) else stamp
    raw_end = ops["end_ns"].to_numpy(dtype=np.int64)[safe] if len(ops) else stamp
    start = np.where(has_op, np.minimum(raw_start, stamp), stamp)
    end = np.where(has_op, np.maximum(raw_end, stamp), stamp)

    # the rows of one (block, op) next to each other: by (block, op start, op) when every op is known and
    # the rows come in that order already (recorders write them in time order: one cheap packed sort),
    # else by (block, op)
    n = len(row)
    in_order = False
    if n > 1 and has_op.all():
        step = np.diff(raw_start)
        in_order = bool(np.all((step > 0) | ((step == 0) & (op[1:] >= op[:-1]))))
    order = _stable_by_row(row, len(block_ids)) if in_order else np.lexsort((op, row))
    row, op, start, end, stamp = row[order], op[order], start[order], end[order], stamp[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (row[1:] != row[:-1]) | (op[1:] != op[:-1])
    if not new.all():  # some op touched a block in several rows
        heads = np.flatnonzero(new)
        events = (row[heads], np.minimum.reduceat(start, heads), np.maximum.reduceat(end, heads),
                  np.minimum.reduceat(stamp, heads), np.maximum.reduceat(stamp, heads))
    else:
        events = (row, start, end, stamp, stamp)
    ev_row, ev_start, ev_end = events[:3]
    if len(ev_row) > 1:  # widened edges, or ops starting together, out of (start, end) order: sort those blocks
        back = (ev_start[1:] < ev_start[:-1]) | ((ev_start[1:] == ev_start[:-1]) & (ev_end[1:] < ev_end[:-1]))
        back &= ev_row[1:] == ev_row[:-1]
        if back.any():
            redo = np.zeros(len(block_ids), dtype=bool)
            redo[ev_row[1:][back]] = True
            at = np.flatnonzero(redo[ev_row])  # those blocks' events: contiguous runs, blocks in order
            moved = at[np.lexsort((ev_end[at], ev_start[at], ev_row[at]))]
            events = tuple(column.copy() for column in events)
            for column in events:
                column[at] = column[moved]
    return BlockEvents(*events, accesses=n, unknown=unknown)


def access_op_edges(trace, op_id: np.ndarray, t_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) in ns of the op that made each access, each access on its own: the start is never
    after the stamp `t_ns` and the end never before it (a recorder's clock skew). Accesses whose op the
    ``ops`` table does not have sit at their stamp (start = end = `t_ns`). The intervals merge the accesses
    of one op to one block first (`block_events`)."""
    ops = trace.ops
    t_ns = np.asarray(t_ns, dtype=np.int64)
    if len(ops) == 0 or len(t_ns) == 0:
        return t_ns.copy(), t_ns.copy()
    rows = block_rows(ops["op_id"].to_numpy(dtype=np.int64), np.asarray(op_id, dtype=np.int64))
    known = rows >= 0
    safe = np.maximum(rows, 0)
    op_start = ops["start_ns"].to_numpy(dtype=np.int64)[safe]
    op_end = ops["end_ns"].to_numpy(dtype=np.int64)[safe]
    return (np.where(known, np.minimum(op_start, t_ns), t_ns),
            np.where(known, np.maximum(op_end, t_ns), t_ns))


def op_end_times(trace, op_id: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """End (ns) of the op of each access (`access_op_edges`'s second half)."""
    return access_op_edges(trace, op_id, t_ns)[1]


def block_rows(block_ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Position in `block_ids` of each id in `wanted` (-1 when absent). A lookup table when the ids are
    dense (recorders number blocks 0..n), binary search otherwise."""
    n = len(block_ids)
    if n == 0:
        return np.full(len(wanted), -1, dtype=np.int64)
    lo, hi = int(block_ids.min()), int(block_ids.max())
    if hi - lo < 4 * n + 1024:
        lookup = np.full(hi - lo + 1, -1, dtype=np.int64)
        lookup[block_ids - lo] = np.arange(n, dtype=np.int64)
        inside = (wanted >= lo) & (wanted <= hi)
        if inside.all():
            return lookup[wanted - lo]
        out = np.full(len(wanted), -1, dtype=np.int64)
        out[inside] = lookup[wanted[inside] - lo]
        return out
    order = np.argsort(block_ids, kind="stable")
    sorted_ids = block_ids[order]
    pos = np.minimum(np.searchsorted(sorted_ids, wanted), n - 1)
    return np.where(sorted_ids[pos] == wanted, order[pos], -1)


def _stable_by_row(row: np.ndarray, n_rows: int) -> np.ndarray:
    """The permutation that groups `row` stably (equal rows keep their order): one sort of packed int64
    keys ``row << bits | position``, several times faster than a stable argsort or a lexsort."""
    n = len(row)
    bits = max(int(n - 1).bit_length(), 1)
    if n_rows >= (1 << (62 - bits)):
        return np.argsort(row, kind="stable")
    key = row << bits
    key |= np.arange(n, dtype=np.int64)
    key.sort()
    return key & ((1 << bits) - 1)


def count_distinct(ids: np.ndarray) -> int:
    """Number of distinct non-negative ints, by counting when the range is small."""
    if len(ids) == 0:
        return 0
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo < 4 * len(ids) + 1024:
        return int(np.count_nonzero(np.bincount(ids - lo)))
    return int(pd.unique(ids).size)
