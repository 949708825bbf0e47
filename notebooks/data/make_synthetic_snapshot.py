"""Write `synthetic_transformer_snapshot.pickle`: a SYNTHETIC CUDA memory snapshot for notebook 02.

    .venv/bin/python notebooks/data/make_synthetic_snapshot.py

Why synthetic: a user's clone has no GPU recording, and notebook 02 must run anywhere. Nothing in this file
came from a GPU. It is built from a real memlens recording made on the CPU
(`sample_traces/transformer_train_adamw.memlens`: a tiny transformer trained for three AdamW steps), whose
allocation requests (sizes, order, times, allocating op and module) are replayed through memlens's model
of PyTorch's CUDACachingAllocator (`memlens.simulate`) to obtain addresses and segment reservations. Those
are written in the layout `torch.cuda.memory._dump_snapshot` uses since 2024 (``segments``,
``device_traces`` with ``time_us``; no ``allocator_settings``). Frames are one pseudo-frame per entry whose
file name starts with ``<synthetic`` and names the module; the top-level key ``memlens_synthetic`` says how
the file was made. Blocks live before recording started (parameters) are allocated first, at time 0.
"""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SOURCE = ROOT / "sample_traces" / "transformer_train_adamw.memlens"
OUTPUT = HERE / "synthetic_transformer_snapshot.pickle"
DEVICE = "cuda:0"
SMALL_SEGMENT = 2 << 20


def request_trace(trace):
    """The recording as allocation requests on one CUDA device: every block allocated inside the trace."""
    from memlens.trace import Trace
    blocks = trace.blocks.copy()
    lo, _ = trace.time_span_ns()
    blocks["alloc_ns"] = blocks["alloc_ns"].fillna(lo)
    blocks["allocated_before"] = False
    blocks["device"] = DEVICE
    blocks["alloc_seq"] = pd.NA     # recomputed from the times by Trace.from_tables
    blocks["free_seq"] = pd.NA
    return Trace.from_tables(blocks, metadata={"source_kind": "memlens_record", "t0_unix_ns":
                                               trace.metadata.get("t0_unix_ns", 0)})


def _frames(op: str, module: str) -> list[dict]:
    return [{"filename": f"<synthetic: module {module or '(none)'}>", "line": 0, "name": op or "(no op)"}]


def build_snapshot(trace) -> dict:
    """The snapshot dict (see the module docstring)."""
    from memlens.simulate import simulate
    from memlens.simulate.config import AllocatorConfig, round_size

    req = request_trace(trace)
    result = simulate(req, initial_state="empty", device=DEVICE).devices[DEVICE]
    tl = result.timeline
    addr_of_seq = dict(zip(tl["seq"].to_numpy(np.int64), tl["addr"].to_numpy(np.int64)))
    b = req.blocks
    addr = np.array([addr_of_seq.get(int(s), -1) for s in b["alloc_seq"]], dtype=np.int64)
    if (addr < 0).any():
        raise RuntimeError(f"{int((addr < 0).sum())} allocations got no simulated address")
    t0_us = int(req.metadata.get("t0_unix_ns", 0)) // 1000
    rows = []   # (seq, rank, entry): segment reservations sort before the allocation that caused them
    for ev in result.segment_events.itertuples(index=False):
        rows.append((int(ev.seq), 0, {"action": ev.action, "addr": int(ev.addr), "size": int(ev.size), "stream": 0,
                                      "time_us": t0_us + int(ev.t_ns) // 1000, "frames": []}))
    for i, blk in enumerate(b.itertuples(index=False)):
        frames = _frames(blk.op, blk.module)
        rows.append((int(blk.alloc_seq), 1, {"action": "alloc", "addr": int(addr[i]), "size": int(blk.size),
                                             "stream": 0, "time_us": t0_us + int(blk.alloc_ns) // 1000,
                                             "frames": frames}))
        if not pd.isna(blk.free_ns):
            for action in ("free_requested", "free_completed"):
                rows.append((int(blk.free_seq), 1, {"action": action, "addr": int(addr[i]), "size": int(blk.size),
                                                    "stream": 0, "time_us": t0_us + int(blk.free_ns) // 1000,
                                                    "frames": frames}))
    rows.sort(key=lambda r: (r[0], r[1]))
    config = AllocatorConfig()
    live = b["free_ns"].isna().to_numpy()
    segments = []
    reserved = result.segment_events
    for seg in reserved[reserved["action"] == "segment_alloc"].itertuples(index=False):
        inside = np.flatnonzero(live & (addr >= seg.addr) & (addr < seg.addr + seg.size))
        inside = inside[np.argsort(addr[inside])]
        blocks, cursor = [], int(seg.addr)
        for j in inside:
            if addr[j] > cursor:
                blocks.append({"address": cursor, "size": int(addr[j] - cursor), "requested_size": 0,
                               "state": "inactive", "frames": []})
            size = round_size(int(b["size"].iloc[j]), config)
            blocks.append({"address": int(addr[j]), "size": size, "requested_size": int(b["size"].iloc[j]),
                           "state": "active_allocated", "frames": _frames(b["op"].iloc[j], b["module"].iloc[j])})
            cursor = int(addr[j]) + size
        if cursor < seg.addr + seg.size:
            blocks.append({"address": cursor, "size": int(seg.addr + seg.size - cursor), "requested_size": 0,
                           "state": "inactive", "frames": []})
        allocated = sum(x["size"] for x in blocks if x["state"] == "active_allocated")
        segments.append({"device": 0, "address": int(seg.addr), "total_size": int(seg.size),
                         "allocated_size": allocated, "active_size": allocated,
                         "requested_size": sum(x["requested_size"] for x in blocks), "stream": 0,
                         "segment_type": "small" if seg.size == SMALL_SEGMENT else "large",
                         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
    return {"segments": segments, "device_traces": [[entry for _, _, entry in rows]],
            "memlens_synthetic": (
                "SYNTHETIC: not recorded on a GPU. Allocation requests of a memlens CPU recording of a tiny "
                "transformer (sample_traces/transformer_train_adamw.memlens) replayed through memlens's "
                "CUDACachingAllocator model for addresses and segments; written by "
                "notebooks/data/make_synthetic_snapshot.py")}


def main() -> int:
    import memlens
    source = memlens.load(SOURCE)
    snapshot = build_snapshot(source)
    OUTPUT.write_bytes(pickle.dumps(snapshot, protocol=4))
    back = memlens.load(OUTPUT)
    # the importer must see the same allocations: same count and the same peak of live requested bytes
    assert len(back.blocks) == len(source.blocks), (len(back.blocks), len(source.blocks))
    assert back.peak_live_bytes()[DEVICE] == source.peak_live_bytes()["cpu"]
    print(f"wrote {OUTPUT} ({OUTPUT.stat().st_size:,} bytes): {len(snapshot['device_traces'][0]):,} entries, "
          f"{len(snapshot['segments'])} segments; {back}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
