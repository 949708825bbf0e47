"""The final allocator state of a CUDA memory snapshot: `segments` and `segment_blocks` tables.

Every era is read: 2023 blocks have no ``address`` (blocks tile their segment in order, so the address is
the segment's address plus the sizes before it) and carry ``history`` (past allocations in the block's
range, each ``{addr, real_size, frames}``); newer blocks have ``address`` and ``frames``. The pending-free
state is spelled ``active_pending_free`` (C++) or ``active_awaiting_free`` (docstrings); both are live.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from memlens.io.bounded_text import safe_str
from memlens.io.snapshot.frames import NO_STACK, StackInterner

PENDING_FREE_STATES = ("active_pending_free", "active_awaiting_free")  # freed, awaiting its streams' work
LIVE_STATES = ("active_allocated", *PENDING_FREE_STATES)


@dataclass
class FinalState:
    """Tables of the final state plus counts the importer reports."""

    segments: pd.DataFrame
    segment_blocks: pd.DataFrame
    history_entries: int        # allocations listed in 2023-style block histories
    has_history: bool
    repairs: dict | None = None  # {what was missing or unreadable: count}, said in the import notes


def _device_name(device) -> str:
    return device if isinstance(device, str) else f"cuda:{int(device)}"


def _pool_id(value) -> str:
    """segment_pool_id (a tuple like (0, 0); (0, 0) is the default pool) as "0,0"; "" when absent."""
    if value is None:
        return ""
    if isinstance(value, (tuple, list)):
        return ",".join(str(int(v)) for v in value)
    return safe_str(value)


def _current_history(block: dict, addr: int):
    """The 2023-format history entry of the allocation occupying `block` now (the last one at `addr`)."""
    current = None
    for h in block.get("history") or ():
        if h.get("addr") == addr:
            current = h
    return current


def read_segments(segments, interner: StackInterner) -> FinalState:
    """Build `segments` / `segment_blocks` from ``snapshot["segments"]``; frames go through `interner`."""
    seg_rows, blk_rows = [], []
    history_entries = 0
    has_history = False
    repairs: dict[str, int] = {}
    for seg in segments:
        if not isinstance(seg, dict) or seg.get("address") is None:
            repairs["segments without an address (skipped)"] = repairs.get(
                "segments without an address (skipped)", 0) + 1
            continue
        if seg.get("device") is None:
            repairs["segments without a device (read as cuda:0)"] = repairs.get(
                "segments without a device (read as cuda:0)", 0) + 1
        device = _device_name(seg.get("device") or 0)
        seg_addr = int(seg["address"])
        total = seg.get("total_size")
        if total is None:  # the blocks tile the segment
            repairs["segments without total_size (sum of their blocks)"] = repairs.get(
                "segments without total_size (sum of their blocks)", 0) + 1
            total = sum(int(b.get("size") or 0) for b in seg.get("blocks") or () if isinstance(b, dict))
        seg_rows.append((
            device, seg_addr, int(total), int(seg.get("allocated_size", 0)),
            int(seg.get("active_size", 0)), int(seg.get("requested_size", 0)), int(seg.get("stream", 0)),
            safe_str(seg.get("segment_type", "")), bool(seg.get("is_expandable", False)),
            _pool_id(seg.get("segment_pool_id")), interner.intern(seg.get("frames")),
        ))
        offset = seg_addr
        for blk in seg.get("blocks") or ():
            if not isinstance(blk, dict) or blk.get("size") is None:
                repairs["segment blocks without a size (skipped)"] = repairs.get(
                    "segment blocks without a size (skipped)", 0) + 1
                continue
            size = int(blk["size"])
            addr = int(blk["address"]) if blk.get("address") is not None else offset
            offset = addr + size
            frames = blk.get("frames")
            requested = blk.get("requested_size")
            if "history" in blk:
                has_history = True
                history_entries += len(blk["history"] or ())
                current = _current_history(blk, addr) if blk.get("state") in LIVE_STATES else None
                if current is not None:
                    frames = frames or current.get("frames")
                    requested = requested if requested is not None else current.get("real_size")
            blk_rows.append((device, seg_addr, addr, size, int(requested if requested is not None else size),
                             safe_str(blk.get("state", "")), interner.intern(frames)))
    seg_df = pd.DataFrame(seg_rows, columns=[
        "device", "addr", "total_size", "allocated_size", "active_size", "requested_size", "stream", "pool",
        "is_expandable", "segment_pool_id", "stack_id"])
    blk_df = pd.DataFrame(blk_rows, columns=[
        "device", "segment_addr", "addr", "size", "requested_size", "state", "stack_id"])
    for df in (seg_df, blk_df):
        df["stack_id"] = _nullable_stack(df["stack_id"].to_numpy(dtype=np.int64))
    return FinalState(seg_df, blk_df, history_entries, has_history, repairs)


def _nullable_stack(ids: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(ids, ids == NO_STACK)
