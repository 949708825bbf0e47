"""The join stage of a recording's build: the dispatch-mode blocks made final before the trace is assembled.

Autograd's own tensors are found among the unknown blocks first (`refine_autograd_seeds`: who first read
them), then the allocator's events are joined in (`memlens.recording.join.join_allocator`). Both read two
facts per block of the accesses only: its first access, and its first access by another op than the one that
made it; so the windowed save passes just those rows (`memlens.recording.build.FirstAccesses`) and gets the
same blocks.
"""
from __future__ import annotations

import numpy as np

from memlens.recording.columns import Columns
from memlens.recording.instruments import AllocatorData
from memlens.recording.join import join_allocator
from memlens.recording.session import Session


def join_tables(session: Session, allocator: AllocatorData, blocks: Columns, accesses: Columns, ops: Columns,
                clock: tuple[int, int]) -> tuple[Columns, list, dict]:
    """(blocks, notes, join statistics) of a stopped session: autograd seeds refined, then every allocator
    stream joined in on the trace's clock (`clock`: (time.time_ns(), time.perf_counter_ns()) read together
    at the start). `notes`: the allocator's, then the join's."""
    blocks = refine_autograd_seeds(blocks, accesses, ops)
    notes = list(allocator.notes)
    blocks, stats = join_allocator(blocks, accesses, ops, allocator, session.unix_to_trace_ns(clock), notes,
                                   window_ns=session.t_stop - session.t_start)
    return blocks, notes, stats


def refine_autograd_seeds(blocks: Columns, accesses: Columns, ops: Columns) -> Columns:
    """Unknown blocks made during recording whose first reader (another op) runs in backward are
    autograd's own tensors, e.g. the ``ones_like`` gradient seed of ``loss.backward()``."""
    cand = (blocks["category"] == "unknown") & blocks["alloc_op_id"].present()
    if not cand.any() or len(accesses) == 0:
        return blocks
    bid = blocks["block_id"]
    made_by = blocks["alloc_op_id"].filled(-1)
    # each access's candidate block row (block ids are unique); -1 where its block is no candidate
    order = np.argsort(bid, kind="stable")
    acc_bid = accesses["block_id"]
    pos = np.minimum(np.searchsorted(bid[order], acc_bid), len(bid) - 1)
    row = np.where(bid[order][pos] == acc_bid, order[pos], -1)
    acc_op = accesses["op_id"]
    keep = (row >= 0) & cand[np.maximum(row, 0)] & (acc_op != made_by[np.maximum(row, 0)])
    row, acc_op, acc_t = row[keep], acc_op[keep], accesses["t_ns"][keep]
    if len(row) == 0:
        return blocks
    # each candidate's first access by another op: the least (time, op)
    first = np.lexsort((acc_op, acc_t, bid[row]))
    head = np.ones(len(first), dtype=bool)
    head[1:] = bid[row[first[1:]]] != bid[row[first[:-1]]]
    first = first[head]
    op_ids = ops["op_id"]
    phases = ops["phase"]
    at = np.minimum(np.searchsorted(op_ids, acc_op[first]), max(len(op_ids) - 1, 0))
    found = (op_ids[at] == acc_op[first]) if len(op_ids) else np.zeros(len(first), bool)
    seed_rows = row[first][found & (phases[at] == "backward" if len(op_ids) else found)]
    if len(seed_rows) == 0:
        return blocks
    blocks = blocks.copy()
    category, rule = blocks["category"].copy(), blocks["category_rule"].copy()
    category[seed_rows] = "autograd_detail"
    rule[seed_rows] = "made outside modules with no autograd history, first read by backward"
    blocks["category"], blocks["category_rule"] = category, rule
    return blocks
