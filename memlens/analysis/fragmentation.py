"""Fragmentation of the caching allocator, where the trace has allocator segments (snapshot imports).

Three levels of bytes (PyTorch's CUDACachingAllocator):
``reserved`` (segments obtained with cudaMalloc) >= ``allocated`` (blocks handed out, rounded up by
``round_size``) >= ``requested`` (what the program asked for). From them:

- ``reserved_unallocated``: reserved - allocated, bytes cached but unused (the allocator's overhead);
  ``fragmentation = 1 - allocated / reserved``.
- ``rounding_overhead``: allocated - requested (internal fragmentation from rounding).
- ``external_fragmentation = 1 - largest free block / total free bytes``: 0 when all free memory is one
  block, near 1 when it is scattered in pieces too small to serve a large request.

The reserved curve over time (`memlens.reserved.reserved_curve`: the final segments walked back through the
segment events, so memory reserved before recording counts) gives ``peak_reserved_bytes`` and
``initial_reserved_bytes``, compared with the blocks' max-live.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.reserved import reserved_curve

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
        curve = reserved_curve(trace, dev)
        if curve is not None:
            live = peaks.get(dev, 0)
            metrics.update({"peak_reserved_bytes": curve.peak, "initial_reserved_bytes": curve.initial,
                            "peak_live_bytes": live, "reserved_over_live": curve.peak / live if live > 0 else None,
                            "segment_events": int(events["action"].isin(list(_RESERVE)).sum()
                                                  if events is not None and len(events) else 0),
                            "reserved_basis": curve.basis, "reserved_raised_by": curve.raised_by})
        result[dev] = metrics
    return result
