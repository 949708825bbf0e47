"""Where a predicted run runs out of memory: the first allocation that would not fit, and what was live then."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass
class OOM:
    """The first allocation that would not fit: its size (bytes, as requested), op, module, stack (when
    recorded), when (trace ns) and what was live then (the largest blocks first)."""

    block_id: int
    size: int
    op: str
    module: str
    t_ns: int
    reserved: int
    allocated: int
    capacity: int
    stack: pd.DataFrame | None
    live: pd.DataFrame

    def __str__(self) -> str:
        from memlens.units import format_bytes
        return (f"OOM: {self.op} in {self.module or '(no module)'} asks for {format_bytes(self.size)} with "
                f"{format_bytes(self.allocated)} allocated and {format_bytes(self.reserved)} reserved of "
                f"{format_bytes(self.capacity)}")


def first_oom(trace, replay, capacity: int) -> OOM | None:
    """The first failed allocation of `replay` (the allocator simulation of `trace` on ``cuda:0`` at
    `capacity` bytes of device memory; None when the replay failed nothing): its block, op, module, stack,
    time (ns) and the blocks live then, largest first."""
    if replay is None or not replay.ooms:
        return None
    first = replay.ooms[0]
    blocks = trace.blocks
    # the failing request is the allocation at the OOM's position in the replayed order (alloc_seq)
    hit = blocks[(blocks["device"] == "cuda:0") & (blocks["alloc_seq"] == int(first["seq"]))]
    row = hit.iloc[0] if len(hit) else None
    bid = int(row["block_id"]) if row is not None else None
    t_ns = int(row["alloc_ns"]) if row is not None else int(first.get("t_ns", 0))
    alive = blocks[(blocks["device"] == "cuda:0") & (blocks["alloc_ns"].fillna(-1) < t_ns)
                   & (blocks["free_ns"].isna() | (blocks["free_ns"].fillna(0) > t_ns))]
    live = alive.sort_values("size", ascending=False)[["block_id", "size", "category", "op", "module"]]
    stack = None
    if row is not None and trace.stacks is not None and pd.notna(row["stack_id"]):
        stack = trace.stacks[trace.stacks["stack_id"] == int(row["stack_id"])]
    return OOM(bid if bid is not None else -1, int(row["requested_size"]) if row is not None else
               int(first.get("requested", 0)), str(row["op"]) if row is not None else "",
               str(row["module"]) if row is not None else "", t_ns, int(first.get("reserved", 0)),
               int(live["size"].sum()), capacity, stack, live.reset_index(drop=True))
