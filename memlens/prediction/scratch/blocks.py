"""How a modelled temporary becomes block rows of a predicted trace.

A model of kernel scratch (`memlens.prediction.scratch.modelled`) describes what one op allocates and frees as events,
``("alloc", key, bytes, what)`` / ``("free", key)``, in the order the CUDA code runs them; `events_to_blocks`
turns them into block rows inside the op's interval (``source == "predict:model"``, ``op`` naming what the
block stands for, category ``workspace``: memory a library or kernel takes for itself, as the snapshot
importer names cuBLAS / cuDNN workspaces) and `add_blocks` puts the rows into the trace.
"""
from __future__ import annotations

import pandas as pd

MODEL_SOURCE = "predict:model"


def next_block_id(trace) -> int:
    """The first block id after the trace's (0 for a trace without blocks)."""
    return int(trace.blocks["block_id"].max()) + 1 if len(trace.blocks) else 0


def modelled_block(block_id: int, op, size: int, requested_size: int, alloc_ns: int, category: str,
                   what: str) -> dict:
    """One block row on ``cuda:0`` standing for `what`, allocated at `alloc_ns` (ns) inside op `op` (an
    ops-table row) with `size` bytes (as the allocator rounds them) of `requested_size`; not freed (set
    ``free_ns`` to free it)."""
    return {"block_id": block_id, "device": "cuda:0", "addr": pd.NA, "size": size, "requested_size": requested_size,
            "alloc_ns": alloc_ns, "free_ns": pd.NA, "category": category, "op": f"{what} (modelled)",
            "alloc_op_id": int(op.op_id), "module": op.module, "stream": 0, "allocated_before": False,
            "free_without_alloc": False, "source": MODEL_SOURCE}


def events_to_blocks(events: list, op, first_id: int, round_size) -> list[dict]:
    """Block rows for `events` of op `op` (an ops-table row: op_id, start_ns, end_ns, module, thread), with
    times spread inside the op's interval in event order; sizes rounded with `round_size`."""
    start, end = int(op.start_ns), int(op.end_ns)
    step = max(1, (end - start) // (len(events) + 1))
    rows: dict[str, dict] = {}
    for k, e in enumerate(events):
        t = start + (k + 1) * step
        if e[0] == "alloc":
            _, key, size, what = e
            rows[key] = modelled_block(first_id + len(rows), op, int(round_size(int(size))), int(size), t,
                                       "workspace", what)
        else:
            rows[e[1]]["free_ns"] = t
    return list(rows.values())


def add_blocks(trace, rows: list[dict]):
    """`trace` with the block rows added (sequence positions recomputed from times)."""
    if not rows:
        return trace
    from memlens.trace import Trace
    merged = pd.concat([trace.blocks, pd.DataFrame(rows)], ignore_index=True)
    merged["alloc_seq"] = pd.array([pd.NA] * len(merged), dtype="Int64")
    merged["free_seq"] = pd.array([pd.NA] * len(merged), dtype="Int64")
    extra = {t: getattr(trace, t) for t in ("segments", "segment_blocks", "events", "stacks")
             if getattr(trace, t, None) is not None}
    return Trace.from_tables(merged, trace.accesses, trace.ops, metadata=trace.metadata, **extra)
