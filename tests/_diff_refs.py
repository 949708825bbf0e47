"""Shared by the diff tests: the pair of real snapshots they diff, and the blocks live at a device's peak found
by a plain-Python sweep of the trace's events (the reference the diffs' per-label bytes are checked against)."""
from __future__ import annotations

import pandas as pd

CS336 = "snapshots/cs336_wedsonlin_medium_128_{}.pickle"


def events_in_order(trace, device):
    """[(t, seq, delta, block row)] in the trace's event order, built with plain Python."""
    lo, _ = trace.time_span_ns()
    ev = []
    for row in trace.blocks[trace.blocks["device"] == device].itertuples():
        a_t = lo if pd.isna(row.alloc_ns) else int(row.alloc_ns)
        a_s = -1 if pd.isna(row.alloc_seq) else int(row.alloc_seq)
        ev.append((a_t, a_s, row.size, row))
        if not pd.isna(row.free_ns):
            ev.append((int(row.free_ns), int(row.free_seq), -row.size, row))
    ev.sort(key=lambda e: (e[0], e[1]))
    return ev


def blocks_live_at_peak(trace, device) -> tuple[int, list]:
    """The device's peak (bytes) and the block rows live right after the event that first reaches it."""
    live, best, best_set, alive = 0, -1, {}, {}
    for _, _, delta, row in events_in_order(trace, device):
        live += delta
        if delta > 0:
            alive[row.block_id] = row
        else:
            alive.pop(row.block_id, None)
        if live > best:
            best, best_set = live, dict(alive)
    return best, list(best_set.values())
