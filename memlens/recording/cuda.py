"""CUDA pieces of the recorder: read the caching allocator's snapshot into allocator events, segments
and segment blocks (the snapshot layout of `torch.cuda.memory._snapshot()`: segments, blocks, device traces).

Only `alloc` and `free_completed` change what is allocated (`free_requested` is the deferred free of
a block used on another stream: its memory stays taken until `free_completed`). Entries carry
`time_us` (unix microseconds) since 2024; older snapshots have no clock and cannot be joined by time.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

_DELTA_SIGN = {"alloc": 1, "free_completed": -1}


def snapshot_events(snapshot: dict) -> pd.DataFrame:
    """Allocation events of a snapshot's `device_traces`: t_ns (unix ns), device, addr, delta (bytes)."""
    t, dev, addr, delta = [], [], [], []
    for index, entries in enumerate(snapshot.get("device_traces") or []):
        device = f"cuda:{index}"
        for e in entries or []:
            sign = _DELTA_SIGN.get(e.get("action"))
            if sign is None or "time_us" not in e:
                continue
            t.append(int(e["time_us"]) * 1000)
            dev.append(device)
            addr.append(int(e["addr"]))
            delta.append(sign * int(e["size"]))
    return pd.DataFrame({"t_ns": np.asarray(t, dtype=np.int64), "device": np.asarray(dev, dtype=object),
                         "addr": np.asarray(addr, dtype=np.int64), "delta": np.asarray(delta, dtype=np.int64)})


def snapshot_segments(snapshot: dict) -> dict[str, pd.DataFrame]:
    """The `segments` and `segment_blocks` tables of a snapshot (the allocator state at its end)."""
    seg_rows, blk_rows = [], []
    for seg in snapshot.get("segments") or []:
        device = f"cuda:{int(seg.get('device', 0))}"
        base = int(seg["address"])
        seg_rows.append({
            "device": device, "addr": base, "total_size": int(seg.get("total_size", 0)),
            "allocated_size": int(seg.get("allocated_size", 0)), "active_size": int(seg.get("active_size", 0)),
            "requested_size": int(seg.get("requested_size", 0)), "stream": int(seg.get("stream", 0)),
            "pool": str(seg.get("segment_type", "")), "is_expandable": bool(seg.get("is_expandable", False))})
        addr = base
        for blk in seg.get("blocks") or []:
            size = int(blk.get("size", 0))
            blk_rows.append({"device": device, "segment_addr": base, "addr": int(blk.get("address", addr)),
                             "size": size, "requested_size": int(blk.get("requested_size", size)),
                             "state": str(blk.get("state", ""))})
            addr += size
    from memlens.trace import empty_table
    return {"segments": pd.DataFrame(seg_rows) if seg_rows else empty_table("segments"),
            "segment_blocks": pd.DataFrame(blk_rows) if blk_rows else empty_table("segment_blocks")}


def kernel_times_per_op(kernels: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """Per op: first kernel start, last kernel end, count and busy time of the GPU activity it launched.

    `kernels` has launch_ns, start_ns, end_ns on the trace clock; an activity belongs to the op whose host
    interval contains its launch (`memlens.gpu_activity.attribute_activity`: memlens ops carry no
    External id, so containment decides). Returns op_id, kernel_start_ns, kernel_end_ns, kernels,
    kernel_busy_ns (ns).
    """
    from memlens.gpu_activity import attribute_activity, kernels_per_op
    empty = pd.DataFrame({c: pd.Series(dtype=np.int64) for c in
                          ("op_id", "kernel_start_ns", "kernel_end_ns", "kernels", "kernel_busy_ns")})
    if kernels is None or len(kernels) == 0 or len(ops) == 0:
        return empty
    corr = np.arange(len(kernels), dtype=np.int64)
    launches = pd.DataFrame({"name": "launch", "start_ns": kernels["launch_ns"].to_numpy(np.int64),
                             "correlation": corr, "external_id": np.int64(-1)})
    activity = pd.DataFrame({"name": kernels["name"] if "name" in kernels else "kernel",
                             "category": kernels["category"] if "category" in kernels else "kernel",
                             "start_ns": kernels["start_ns"].to_numpy(np.int64),
                             "end_ns": kernels["end_ns"].to_numpy(np.int64), "correlation": corr, "stream": -1})
    host_ops = ops[["start_ns", "end_ns"]].reset_index(drop=True)
    per = kernels_per_op(host_ops, attribute_activity(host_ops, launches, activity))
    if len(per) == 0:
        return empty
    per.insert(0, "op_id", ops["op_id"].to_numpy()[per["op"].to_numpy()])
    return per.drop(columns=["op"])
