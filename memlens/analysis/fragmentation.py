"""Fragmentation of the caching allocator, where the trace has allocator segments (snapshot imports).

Three levels of bytes (PyTorch's CUDACachingAllocator, REFERENCE.md section 6):
``reserved`` (segments obtained with cudaMalloc) >= ``allocated`` (blocks handed out, rounded up by
``round_size``) >= ``requested`` (what the program asked for). From them:

- ``reserved_unallocated``: reserved - allocated, bytes cached but unused (the allocator's overhead);
  ``fragmentation = 1 - allocated / reserved``.
- ``rounding_overhead``: allocated - requested (internal fragmentation from rounding).
- ``external_fragmentation = 1 - largest free block / total free bytes``: 0 when all free memory is one
  block, near 1 when it is scattered in pieces too small to serve a large request.

With a segment event log (``segment_alloc``/``segment_free``/``segment_map``/``segment_unmap``) the
reserved curve over time gives ``peak_reserved``, compared with the blocks' max-live.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

_RESERVE = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


def _segment_state(segments: pd.DataFrame, blocks: pd.DataFrame | None) -> dict:
    reserved = int(segments["total_size"].sum())
    allocated = int(segments["allocated_size"].sum())
    requested = int(segments["requested_size"].sum())
    out = {
        "segments": int(len(segments)), "reserved_bytes": reserved, "allocated_bytes": allocated,
        "active_bytes": int(segments["active_size"].sum()), "requested_bytes": requested,
        "reserved_unallocated_bytes": reserved - allocated,
        "fragmentation": (1 - allocated / reserved) if reserved > 0 else None,
        "rounding_overhead_bytes": allocated - requested if requested > 0 else None,
        "by_pool": {},
    }
    for pool, seg in segments.groupby(segments["pool"].astype(str).replace("", "(unknown)")):
        res, alloc = int(seg["total_size"].sum()), int(seg["allocated_size"].sum())
        out["by_pool"][pool] = {"segments": int(len(seg)), "reserved_bytes": res, "allocated_bytes": alloc,
                                "fragmentation": (1 - alloc / res) if res > 0 else None}
    if blocks is not None and len(blocks):
        free = blocks[blocks["state"].astype(str) == "inactive"]
        free_bytes = int(free["size"].sum())
        largest = int(free["size"].max()) if len(free) else 0
        out.update({
            "free_blocks": int(len(free)), "free_bytes": free_bytes, "largest_free_block": largest,
            "external_fragmentation": (1 - largest / free_bytes) if free_bytes > 0 else 0.0,
        })
    return out


def reserved_curve(events: pd.DataFrame, device: str | None = None) -> pd.DataFrame:
    """Reserved bytes after each segment event: ``seq``, ``t_ns``, ``action``, ``reserved`` (bytes; starts at
    0, so a trace that begins with segments already reserved reads low by that amount)."""
    ev = events if device is None else events[events["device"].astype(str) == device]
    ev = ev[ev["action"].isin(list(_RESERVE))].sort_values("seq", kind="stable")
    sign = ev["action"].map(_RESERVE).to_numpy(dtype=np.int64)
    return pd.DataFrame({"seq": ev["seq"].to_numpy(), "t_ns": ev["t_ns"].to_numpy(),
                         "action": ev["action"].to_numpy(),
                         "reserved": np.cumsum(sign * ev["size"].to_numpy(dtype=np.int64))})


def fragmentation(trace, device: str | None = None) -> dict[str, dict]:
    """{device: metrics} for devices with allocator segments or segment events; {} when the trace has
    neither (e.g. a memlens recording on CPU). Metrics are described in this module's docstring; sizes in
    bytes. ``at`` says what the segment state describes ("end of recording")."""
    result: dict[str, dict] = {}
    segments, seg_blocks, events = trace.segments, trace.segment_blocks, trace.events
    peaks = trace.peak_live_bytes()
    devices = set()
    if segments is not None and len(segments):
        devices |= set(segments["device"].astype(str))
    if events is not None and len(events) and events["action"].isin(list(_RESERVE)).any():
        devices |= set(events.loc[events["action"].isin(list(_RESERVE)), "device"].astype(str))
    for dev in sorted(devices):
        if device is not None and dev != device:
            continue
        metrics: dict = {"device": dev}
        if segments is not None and len(segments):
            seg = segments[segments["device"].astype(str) == dev]
            blk = None if seg_blocks is None else seg_blocks[seg_blocks["device"].astype(str) == dev]
            if len(seg):
                metrics.update(_segment_state(seg, blk))
                metrics["at"] = "end of recording"
        if events is not None and len(events):
            curve = reserved_curve(events, dev)
            if len(curve):
                peak_reserved = int(curve["reserved"].max())
                live = peaks.get(dev, 0)
                metrics.update({"peak_reserved_bytes": peak_reserved, "peak_live_bytes": live,
                                "reserved_over_live": peak_reserved / live if live > 0 else None,
                                "segment_events": int(len(curve))})
        result[dev] = metrics
    return result
