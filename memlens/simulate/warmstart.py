"""The allocator state when recording began, rebuilt from a snapshot (a warm start).

Initial state. When recording began warm, the segments reserved at the start are the final ``segments``
walked backwards through the recorded segment events, and the blocks live at the start are those freed
without an alloc in the trace plus those live at the end that the trace never allocated, at their recorded
addresses. A live block's allocator size is the final state's when known, else its rounded request plus
any gap of at most 1 MiB up to the next known block start (a large-pool block keeps a remainder that small
rather than splitting it off, so such a gap cannot be a block of its own).

Expandable segments: the final snapshot lists each mapped range of a virtual segment as a segment of its
own; ranges of one (pool, stream) belong to one virtual segment, and undoing the recorded
``segment_map`` / ``segment_unmap`` events page by page gives the ranges mapped at the start.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.simulate.config import (
    K_LARGE_BUFFER, K_SMALL_BUFFER, K_SMALL_SIZE, AllocatorConfig, round_size,
)


def int_column(df: pd.DataFrame, col: str, fill: int) -> np.ndarray:
    """A nullable integer column as int64, `fill` for missing values (and for an absent column)."""
    if col not in df.columns:
        return np.full(len(df), fill, dtype=np.int64)
    return pd.array(df[col], dtype="Int64").to_numpy(dtype=np.int64, na_value=fill)


@dataclass
class InitialSegment:
    """A segment (or, for expandable segments, one mapped range) reserved when the replay starts."""

    addr: int
    size: int
    is_small: bool
    stream: int
    live: list[tuple[int, int, int, int, bool]] = field(default_factory=list)  # (id, addr, size, req, pending)
    expandable_base: int | None = None  # start of the virtual segment this mapped range belongs to
    page: int = 0  # expandable page size (bytes)


def initial_segments(ev: pd.DataFrame, segs: pd.DataFrame) -> dict[int, InitialSegment]:
    """Segments reserved when recording began: final ones, with the segment events undone in reverse."""
    current = {int(r.addr): InitialSegment(int(r.addr), int(r.total_size), r.pool == "small", int(r.stream))
               for r in segs.itertuples(index=False) if not r.is_expandable}
    seg_ev = ev[ev["action"].isin(["segment_alloc", "segment_free"])]
    for r in seg_ev.iloc[::-1].itertuples(index=False):
        if r.action == "segment_alloc":
            current.pop(int(r.addr), None)
        else:
            size = int(r.size)
            current[int(r.addr)] = InitialSegment(int(r.addr), size, size == K_SMALL_BUFFER, int(r.stream))
    return current


def live_at_start(blocks: pd.DataFrame) -> pd.DataFrame:
    """Blocks the allocator held when recording began."""
    b = blocks[blocks["allocated_before"].to_numpy(dtype=bool)]
    has_req = "free_requested_seq" in b.columns
    pending = (b["free_requested_seq"].isna() & b["free_seq"].notna()).to_numpy(dtype=bool) if has_req \
        else np.zeros(len(b), dtype=bool)
    out = pd.DataFrame({
        "block_id": b["block_id"].to_numpy(dtype=np.int64),
        "addr": int_column(b, "addr", -1),
        "size": b["size"].to_numpy(dtype=np.int64),
        "block_size": int_column(b, "block_size", 0),
        "stream": b["stream"].to_numpy(dtype=np.int64),
        "pending": pending,
    })
    return out.sort_values(["addr", "block_id"], kind="stable").reset_index(drop=True)


def place_live_blocks(segments: dict[int, InitialSegment], live: pd.DataFrame, boundaries: np.ndarray,
                      config: AllocatorConfig, notes: list[str]) -> None:
    """Put each block live at the start into the initial segment that contains its address."""
    if not segments or not len(live):
        return
    starts = np.array(sorted(segments), dtype=np.int64)
    bounds = np.unique(np.concatenate([boundaries, live["addr"].to_numpy(),
                                       starts + np.array([segments[s].size for s in starts])]))
    lost = 0
    for r in live.itertuples(index=False):
        i = int(np.searchsorted(starts, r.addr, side="right")) - 1
        seg = segments[int(starts[i])] if i >= 0 else None
        if seg is None or r.addr < 0 or r.addr >= seg.addr + seg.size:
            lost += 1
            continue
        size = int(r.block_size) if r.block_size > 0 else round_size(int(r.size), config)
        if r.block_size <= 0 and not seg.is_small and not config.expandable_segments:
            j = int(np.searchsorted(bounds, r.addr + size, side="left"))
            nxt = min(int(bounds[j]) if j < len(bounds) else seg.addr + seg.size, seg.addr + seg.size)
            if 0 < nxt - (r.addr + size) <= K_SMALL_SIZE:
                size = nxt - int(r.addr)
        size = min(size, seg.addr + seg.size - int(r.addr))
        seg.live.append((int(r.block_id), int(r.addr), size, int(r.size), bool(r.pending)))
    for seg in segments.values():  # a block overlapping the next one (a bad estimate) is cut short
        seg.live.sort(key=lambda x: x[1])
        for k in range(len(seg.live) - 1):
            bid, addr, size, req, pend = seg.live[k]
            if addr + size > seg.live[k + 1][1]:
                seg.live[k] = (bid, addr, seg.live[k + 1][1] - addr, req, pend)
    if lost:
        notes.append(f"{lost} block(s) live at the start lie outside every initial segment; left out")


def initial_expandable_runs(ev: pd.DataFrame, segs: pd.DataFrame) -> dict[int, InitialSegment]:
    """Mapped ranges of expandable segments at the start: final mapped pages, recorded maps undone."""
    final = segs[segs["is_expandable"].to_numpy(dtype=bool)]
    groups: dict[tuple[int, bool], dict] = {}
    for r in final.itertuples(index=False):
        small = r.pool == "small"
        g = groups.setdefault((int(r.stream), small), {"page": K_SMALL_BUFFER if small else K_LARGE_BUFFER,
                                                       "pages": set(), "lo": int(r.addr), "hi": 0})
        g["pages"].update(range(int(r.addr), int(r.addr) + int(r.total_size), g["page"]))
        g["lo"], g["hi"] = min(g["lo"], int(r.addr)), max(g["hi"], int(r.addr) + int(r.total_size))
    page_ev = ev[ev["action"].isin(["segment_map", "segment_unmap"])]
    for r in page_ev.iloc[::-1].itertuples(index=False):
        addr, size, stream = int(r.addr), int(r.size), int(r.stream)
        candidates = [k for k in groups if k[0] == stream]
        if candidates:  # the virtual segment whose known range lies nearest
            key = min(candidates, key=lambda k: max(groups[k]["lo"] - addr, addr - groups[k]["hi"], 0))
        else:
            key = (stream, size % K_LARGE_BUFFER != 0)
            groups[key] = {"page": K_SMALL_BUFFER if key[1] else K_LARGE_BUFFER, "pages": set(), "lo": addr,
                           "hi": addr + size}
        g = groups[key]
        pages = range(addr, addr + size, g["page"])
        if r.action == "segment_map":
            g["pages"].difference_update(pages)
        else:
            g["pages"].update(pages)
        g["lo"], g["hi"] = min(g["lo"], addr), max(g["hi"], addr + size)
    runs: dict[int, InitialSegment] = {}
    for (stream, small), g in groups.items():
        start = prev = None
        for p in sorted(g["pages"]) + [None]:
            if start is not None and (p is None or p != prev + g["page"]):
                runs[start] = InitialSegment(start, prev + g["page"] - start, small, stream, [], g["lo"], g["page"])
                start = None
            if p is not None and start is None:
                start = p
            prev = p
    return runs
