"""The recorder's allocator-join and CUDA code paths, run without a GPU: on constructed snapshots and
event tables with known answers, and on a real CUDA snapshot recorded by someone else."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

import memlens  # noqa: E402
from memlens.recording.cuda import kernel_times_per_op, snapshot_events, snapshot_segments  # noqa: E402
from memlens.recording.instruments import AllocatorData, Instruments  # noqa: E402
from memlens.recording.join import join_allocator, pair_events  # noqa: E402

US = 1000   # ns per us


def _ops(intervals, names=None, modules=None):
    n = len(intervals)
    return pd.DataFrame({"op_id": np.arange(n), "name": names or [f"aten::op{i}" for i in range(n)],
                         "start_ns": [a for a, _ in intervals], "end_ns": [b for _, b in intervals],
                         "module": modules or [""] * n, "iteration": pd.array([pd.NA] * n, dtype="Int64")})


def _dispatch_blocks(rows):
    cols = ["block_id", "device", "addr", "size", "alloc_ns", "free_ns", "alloc_op_id", "allocated_before",
            "category", "category_rule"]
    df = pd.DataFrame(rows, columns=cols)
    for c in ("addr", "alloc_ns", "free_ns", "alloc_op_id"):
        df[c] = pd.array(df[c], dtype="Int64")
    df["op"] = ""
    df["module"] = ""
    df["source"] = "dispatch"
    df["stream"] = 0
    df["free_without_alloc"] = False
    return df


def test_pair_events_handles_orphan_frees_and_live_blocks():
    ev = pd.DataFrame({"t_ns": [5, 10, 20, 30, 40], "device": ["cpu"] * 5,
                       "addr": [7, 1, 1, 2, 1], "delta": [-64, 100, -100, 50, 100]})
    pairs = pair_events(ev).to_frame().sort_values(["addr", "alloc_t"], na_position="first").reset_index(drop=True)
    assert pairs["size"].tolist() == [100, 100, 50, 64]
    assert pairs["alloc_t"].tolist()[:3] == [10, 40, 30] and pd.isna(pairs["alloc_t"].iloc[3])
    assert pairs["free_t"].iloc[0] == 20 and pd.isna(pairs["free_t"].iloc[1]) and pd.isna(pairs["free_t"].iloc[2])
    assert pairs["free_t"].iloc[3] == 5      # freed, never seen allocated: alive before the instrument


def constructed_snapshot(t0_us: int) -> dict:
    """Two ops on cuda:0: op 0 allocates an output (A) and a workspace (W, freed inside op 0); op 1
    frees A through the deferred path (free_requested, then free_completed)."""
    A, W = 0x7F0000000000, 0x7F0000200000
    trace = [
        {"action": "segment_alloc", "addr": A, "size": 2 << 20, "stream": 0, "time_us": t0_us + 1},
        {"action": "alloc", "addr": A, "size": 1024, "stream": 0, "time_us": t0_us + 12},
        {"action": "alloc", "addr": W, "size": 4096, "stream": 0, "time_us": t0_us + 13},
        {"action": "free_requested", "addr": W, "size": 4096, "stream": 0, "time_us": t0_us + 15},
        {"action": "free_completed", "addr": W, "size": 4096, "stream": 0, "time_us": t0_us + 15},
        {"action": "free_requested", "addr": A, "size": 1024, "stream": 0, "time_us": t0_us + 31},
        {"action": "free_completed", "addr": A, "size": 1024, "stream": 0, "time_us": t0_us + 33},
    ]
    segment = {"device": 0, "address": A, "total_size": 2 << 20, "allocated_size": 0, "active_size": 0,
               "requested_size": 0, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
               "is_expandable": False, "frames": [],
               "blocks": [{"address": A, "size": 2 << 20, "requested_size": 0, "state": "inactive"}]}
    return {"segments": [segment], "device_traces": [trace]}


def test_constructed_snapshot_joins_with_dispatch_blocks():
    t0_us = 1_700_000_000_000_000
    snap = constructed_snapshot(t0_us)
    ev = snapshot_events(snap)
    assert ev["delta"].tolist() == [1024, 4096, -4096, -1024]       # free_requested is not a free yet
    ops = _ops([(10 * US, 20 * US), (30 * US, 40 * US)], names=["aten::mm", "aten::add"],
               modules=["model.fc", "model"])
    # the dispatch mode saw A (requested 1000 bytes; the allocator rounded it to 1024) made by op 0
    # (the tensor died at 31 us; the block stayed taken until the deferred free completed at 33 us)
    blocks = _dispatch_blocks([(0, "cuda:0", 0x7F0000000000, 1000, 10 * US, 31 * US, 0, False, "activation", "x")])
    accesses = pd.DataFrame({"block_id": [0, 0], "t_ns": [20 * US, 30 * US], "op_id": [0, 1],
                             "is_write": [True, False]})
    # history that was already running before the recording (t < 0) stays out of the trace
    snap["device_traces"][0].insert(0, {"action": "alloc", "addr": 0x7F0000400000, "size": 512, "stream": 0,
                                        "time_us": t0_us - 5000})
    notes = []
    out, stats = join_allocator(blocks, accesses, ops, AllocatorData(snapshot=snap), -t0_us * US, notes,
                                window_ns=50 * US)
    out = out.to_frame()
    assert any("1 allocator events outside the recording" in n for n in notes)
    st = stats["cuda_snapshot"]
    assert (st["matched"], st["allocator_only"], st["dispatch_only"]) == (1, 1, 0)
    a = out.iloc[0]
    assert a["source"] == "dispatch+cuda_snapshot" and a["size"] == 1000 and a["allocator_size"] == 1024
    assert a["alloc_ns"] == 12 * US and a["free_ns"] == 33 * US     # free_completed, not free_requested
    w = out.iloc[1]
    assert (w["source"], w["op"], w["module"], w["category"]) == ("cuda_snapshot", "aten::mm", "model.fc",
                                                                  "temporary")
    assert (w["alloc_ns"], w["free_ns"], w["size"]) == (13 * US, 15 * US, 4096)
    tables = snapshot_segments(snap)
    assert tables["segments"]["total_size"].tolist() == [2 << 20]
    assert tables["segment_blocks"]["state"].tolist() == ["inactive"]


def test_snapshot_without_clock_is_not_joined():
    snap = constructed_snapshot(0)
    for e in snap["device_traces"][0]:
        del e["time_us"]
    assert len(snapshot_events(snap)) == 0


def test_kernel_times_attach_to_the_launching_op():
    ops = _ops([(0, 100), (100, 200), (300, 400)])
    kernels = pd.DataFrame({"launch_ns": [10, 50, 150, 250], "start_ns": [500, 600, 700, 800],
                            "end_ns": [550, 650, 750, 850]})
    per_op = kernel_times_per_op(kernels, ops).set_index("op_id")
    cols = ["kernel_start_ns", "kernel_end_ns", "kernels", "kernel_busy_ns"]
    assert per_op.loc[0, cols].tolist() == [500, 650, 2, 100]
    assert per_op.loc[1, cols].tolist() == [700, 750, 1, 50]
    assert 2 not in per_op.index                       # launch at 250 lies between ops: not attributed


def test_cpu_build_takes_the_cpu_path(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only path")
    inst = Instruments("auto")
    inst.start()
    data = inst.stop()
    assert data.sources == ["profiler"] and data.snapshot is None and data.kernels is None
    # a CUDA build whose memory history cannot start (e.g. a pluggable allocator): noted, not raised
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def refuse(*args, **kwargs):
        raise RuntimeError("snapshots are disabled by a CUDAPluggableAllocator")

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", refuse)
    inst = Instruments("auto", kernel_times=False)
    inst._start_cuda_history(torch)
    assert not inst._cuda_history
    assert any("CUDA memory history unavailable" in n for n in inst.data.notes)


def test_recorder_on_cpu_reports_cpu_sources():
    with memlens.record() as rec:
        torch.ones(8) * 2
    md = rec.trace.metadata
    assert md["devices"] == ["cpu"] and md["sources"] in (["dispatch", "profiler"], ["dispatch", "memory_hook"])
    assert rec.trace.segments is None


@pytest.mark.shared
def test_real_cuda_snapshot_events_and_join(shared):
    from memlens.io.safe_pickle import load_pickle
    snap = load_pickle(shared("snapshots/cs336_wedsonlin_medium_128_training.pickle"))
    raw = snap["device_traces"][0]
    ev = snapshot_events(snap)
    n_alloc = sum(e["action"] == "alloc" for e in raw)
    n_free = sum(e["action"] == "free_completed" for e in raw)
    assert len(ev) == n_alloc + n_free
    assert ev["delta"][ev["delta"] > 0].sum() == sum(e["size"] for e in raw if e["action"] == "alloc")
    pairs = pair_events(ev).to_frame()
    assert (pairs["alloc_t"].notna()).sum() == n_alloc
    # the ring buffer overflowed: frees whose alloc was dropped come out as orphan frees
    assert pairs["alloc_t"].isna().sum() > 0
    seg = snapshot_segments(snap)["segments"]
    assert seg["total_size"].sum() == sum(s["total_size"] for s in snap["segments"])
    # a dispatch view that saw every 10th real allocation (requested size a bit below the block size)
    t0 = int(ev["t_ns"].min())
    made = pairs[pairs["alloc_t"].notna()].sort_values("alloc_t").iloc[::10].reset_index(drop=True)
    alloc = made["alloc_t"].astype("int64").to_numpy() - t0
    ops = _ops(list(zip(alloc - 1, alloc + 1)))
    blocks = _dispatch_blocks([(i, "cuda:0", int(r.addr), max(int(r.size) - 100, 1), int(a - 1), None, i,
                                False, "activation", "x") for i, (r, a) in enumerate(zip(made.itertuples(), alloc))])
    out, stats = join_allocator(blocks, pd.DataFrame(columns=["block_id", "t_ns", "op_id", "is_write"]), ops,
                                AllocatorData(snapshot=snap), -t0, [])
    out = out.to_frame()
    st = stats["cuda_snapshot"]
    assert st["matched"] == len(blocks) and st["dispatch_only"] == 0
    assert st["allocator_only"] == n_alloc - len(blocks)
    assert (out.loc[: len(blocks) - 1, "source"] == "dispatch+cuda_snapshot").all()
