"""Shared by the interval and swap-plan reference tests: random traces with ops of known edges, and the
brute-force intervals of the definition, recomputed block by block here in plain Python (no memlens
function is called; the trace's bounds are recomputed too):
- an ATI runs from the END of the op of one access to the START of the op of the next, whatever the
  accesses' own stamps (a write is stamped at its op's end);
- the rows of one op on one block (a read and a write) are one access, at the op's edges widened to cover
  all their stamps (a recorder's clock skew);
- alloc -> first access ends at the first op's start (0 when that op made the block), last access -> free
  starts at the last op's end (0 when the block was freed inside it).
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from memlens.trace import Trace

# MEMLENS_HYPOTHESIS_EXAMPLES caps the examples per property (scripts/mutation.sh runs them once per mutant)
CAP = int(os.environ.get("MEMLENS_HYPOTHESIS_EXAMPLES", "0")) or None


def examples(n: int) -> int:
    return min(n, CAP) if CAP else n


SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICE = "cuda:0"


@st.composite
def traces(draw, max_ops: int = 9, max_blocks: int = 5, min_accesses: int = 0):
    """A trace of ops with strictly increasing starts (they may overlap: nested ops), blocks with or without
    a recorded alloc/free, and accesses stamped as recorders stamp them (reads at the op's start, writes at
    its end; an op may read and write one block: two rows)."""
    n_ops = draw(st.integers(2, max_ops))
    gaps = draw(st.lists(st.integers(1, 400), min_size=n_ops, max_size=n_ops))
    starts = 1000 + np.cumsum(gaps)
    durs = draw(st.lists(st.integers(0, 300), min_size=n_ops, max_size=n_ops))
    ends = starts + np.asarray(durs)
    ops = pd.DataFrame({"op_id": np.arange(n_ops) * 3 + 7, "name": "aten::op", "start_ns": starts,
                        "end_ns": ends})
    n_blocks = draw(st.integers(1, max_blocks))
    horizon = int(ends.max()) + 500
    blocks, acc = [], []
    for b in range(n_blocks):
        chosen = sorted(set(draw(st.lists(st.integers(0, n_ops - 1), min_size=max(int(b == 0), min_accesses), max_size=6))))
        first = int(starts[chosen[0]]) if chosen else 1000
        last = int(ends[chosen[-1]]) if chosen else horizon
        alloc = None if draw(st.booleans()) and b % 2 == 0 else draw(st.integers(900, first))
        # a block may live zero ns (allocated and freed at the same instant: sequenced alloc, then free)
        free = None if draw(st.booleans()) else draw(st.integers(max(last, alloc or 0), horizon + 1))
        blocks.append({"block_id": 100 + 7 * b, "device": DEVICE, "size": draw(st.integers(1, 64)) * 1024,
                       "alloc_ns": alloc, "free_ns": free})
        for i in chosen:
            mode = draw(st.sampled_from(["r", "w", "rw"]))
            for w in ([False] if mode == "r" else [True] if mode == "w" else [False, True]):
                acc.append({"block_id": 100 + 7 * b, "op_id": int(ops["op_id"].iloc[i]), "is_write": w,
                            "t_ns": int(ends[i] if w else starts[i])})
    acc = pd.DataFrame(acc, columns=["block_id", "t_ns", "op_id", "is_write"])
    acc = acc.sort_values(["op_id", "block_id"], kind="stable").reset_index(drop=True)
    blk = pd.DataFrame(blocks)
    blk["alloc_ns"] = blk["alloc_ns"].astype("Int64")
    blk["free_ns"] = blk["free_ns"].astype("Int64")
    return Trace.from_tables(blk, acc, ops)


def reference_span(trace: Trace) -> tuple[int, int]:
    """(first, last) instant in ns over every alloc, free, access stamp and op edge of `trace`: the bounds
    of a block allocated before, or still alive after, the recording."""
    values = [int(v) for v in trace.blocks["alloc_ns"].dropna()] + [int(v) for v in trace.blocks["free_ns"].dropna()]
    values += [int(v) for v in trace.accesses["t_ns"]]
    values += [int(v) for v in trace.ops["start_ns"]] + [int(v) for v in trace.ops["end_ns"]]
    return (min(values), max(values)) if values else (0, 0)


def reference_events(trace: Trace, block_id: int) -> list[tuple[int, int]]:
    """(start, end) ns of each op touching `block_id`, sorted: one per op however many rows (stamps) it has,
    spanning the op's edges widened to every stamp of that op on that block; an op the ops table lacks
    spans its stamps."""
    op_edges = {int(r.op_id): (int(r.start_ns), int(r.end_ns)) for r in trace.ops.itertuples()}
    stamps: dict[int, list[int]] = {}
    for a in trace.accesses.itertuples():
        if int(a.block_id) == block_id:
            stamps.setdefault(int(a.op_id), []).append(int(a.t_ns))
    events = []
    for op, ts in stamps.items():
        edges = list(op_edges[op]) if op in op_edges else []
        events.append((min(edges + ts), max(edges + ts)))
    return sorted(events)


def reference_intervals(trace: Trace) -> list[tuple]:
    """(block, kind, start, end, truncated) of every interval, block by block in plain Python."""
    lo, hi = reference_span(trace)
    out = []
    for blk in trace.blocks.itertuples():
        b = int(blk.block_id)
        seq = reference_events(trace, b)
        stamps = [int(t) for t in trace.accesses.loc[trace.accesses["block_id"] == b, "t_ns"]]
        alloc = lo if pd.isna(blk.alloc_ns) else int(blk.alloc_ns)
        free = hi if pd.isna(blk.free_ns) else int(blk.free_ns)
        alloc, free = min([alloc] + stamps), max([free] + stamps)
        if not seq:
            out.append((b, "alloc_to_free", alloc, free, pd.isna(blk.alloc_ns) or pd.isna(blk.free_ns)))
            continue
        out.append((b, "alloc_to_first", alloc, max(seq[0][0], alloc), bool(pd.isna(blk.alloc_ns))))
        for (_, e0), (s1, _) in zip(seq, seq[1:]):
            out.append((b, "access_to_access", min(e0, s1), s1, False))
        out.append((b, "last_to_free", min(seq[-1][1], free), free, bool(pd.isna(blk.free_ns))))
    return sorted(out)


def iterations_at(starts: list[int], hi: int) -> pd.DataFrame:
    """An iterations table (as split_iterations returns it) whose iterations start at `starts` (ns) and the
    last ends at `hi` (ns)."""
    ends = starts[1:] + [hi]
    return pd.DataFrame({"iteration": np.arange(len(starts)), "start_ns": starts, "end_ns": ends,
                         "source": "marker"})
