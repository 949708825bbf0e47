"""Shared by the peak_cause reference tests (tests/unit/test_peak_cause_reference.py, the cause sentence, and
tests/unit/test_peak_cause_sites_reference.py, the allocation sites): hand-built stacks tables, block rows and the
Trace made from them."""
from __future__ import annotations

import pandas as pd

from memlens.trace import Trace

BLOCK_COLUMNS = ["block_id", "device", "size", "alloc_ns", "free_ns", "category", "op", "module", "stack_id",
                 "allocated_before"]


def _stacks(frames: dict[int, list[tuple[str, str, int]]]) -> pd.DataFrame:
    """{stack_id: [(name, filename, line), innermost first]} as a stacks table (rows in reverse order, so
    that only the depth orders them)."""
    rows = [{"stack_id": sid, "depth": d, "name": n, "filename": f, "line": ln}
            for sid, fr in frames.items() for d, (n, f, ln) in enumerate(fr)]
    return pd.DataFrame(rows[::-1], columns=["stack_id", "depth", "name", "filename", "line"])


def _blocks_trace(rows: list[dict], stacks: pd.DataFrame | None, location: list[str] | None = None,
                  metadata: dict | None = None, **tables) -> Trace:
    b = pd.DataFrame(rows, columns=BLOCK_COLUMNS)
    if location is not None:
        b["location"] = location
    return Trace.from_tables(b, stacks=stacks, metadata=metadata, **tables)


def _row(bid, size, category="unknown", op="", module="", stack_id=None, before=False, alloc=None, free=None,
         device="cuda:0"):
    return {"block_id": bid, "device": device, "size": size, "alloc_ns": None if before else alloc,
            "free_ns": free, "category": category, "op": op, "module": module, "stack_id": stack_id,
            "allocated_before": before}
