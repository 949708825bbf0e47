"""Peak breakdown and fragmentation: constructed traces and real CUDA snapshots."""
from __future__ import annotations

import pandas as pd
import pytest

from memlens.analysis.fragmentation import fragmentation
from memlens.reserved import reserved_curve
from memlens.analysis.peak import live_at, peak_breakdown
from memlens.trace import Trace


def peak_trace() -> Trace:
    """cuda:0 live bytes: 100 (P, before recording) -> +A 50 @10 -> +B 30 @20 -> +T 20 @25 = 200 (peak)
    -> -T @26 -> -A @40, +X 60 @40 (free first: 190, not 250) -> -X @41 -> +G 40 @45 -> ...
    cpu: one 7-byte block."""
    blocks = pd.DataFrame({
        "block_id": [1, 2, 3, 4, 5, 6, 9],
        "device": ["cuda:0"] * 6 + ["cpu"],
        "size": [100, 50, 30, 20, 60, 40, 7],
        "alloc_ns": [pd.NA, 10, 20, 25, 40, 45, 5],
        "free_ns": [pd.NA, 40, 50, 26, 41, 60, 6],
        "category": ["parameter", "activation", "activation", "temporary", "temporary", "gradient", "input"],
        "module": ["net.fc", "net.fc", "net.act", "", "", "net.fc", ""],
        "op": ["", "aten::addmm", "aten::relu", "aten::mul", "aten::cat", "aten::mm", "aten::empty"],
    })
    return Trace.from_tables(blocks)


def test_peak_breakdown_hand_computed():
    result = peak_breakdown(peak_trace())
    assert set(result) == {"cuda:0", "cpu"}
    p = result["cuda:0"]
    assert (p.peak_bytes, p.peak_ns, p.live_blocks, p.peak_block_id) == (200, 25, 4, 4)
    assert p.op_at_peak == "aten::mul"
    cats = p.by_category.set_index("category")
    assert cats["bytes"].to_dict() == {"parameter": 100, "activation": 80, "temporary": 20}
    assert cats.loc["activation", "blocks"] == 2 and cats.loc["parameter", "share"] == 0.5
    assert p.by_category["category"].tolist()[0] == "parameter"  # largest first
    mods = p.by_module.set_index("module")["bytes"].to_dict()
    assert mods == {"net.fc": 150, "net.act": 30, "(unknown)": 20}
    assert p.by_op.set_index("op").loc["(unknown)", "bytes"] == 100
    assert p.largest["block_id"].tolist() == [1, 2, 3, 4]
    assert not p.notes
    assert "200 B" in p.describe() and "parameter" in p.describe()
    d = p.to_dict(top=2)
    assert d["peak_bytes"] == 200 and len(d["largest"]) == 2
    assert result["cpu"].peak_bytes == 7
    assert set(peak_breakdown(peak_trace(), device="cpu")) == {"cpu"}


def test_live_at_respects_event_order():
    trace = peak_trace()
    lt = trace.lifetimes("cuda:0")
    seq_of = dict(zip(lt["block_id"], lt["start_seq"]))
    # right after X's alloc at t=40, A (freed at 40, earlier in order) is gone and X is live
    live = live_at(trace, "cuda:0", seq_of[5], 40)
    assert sorted(live["block_id"]) == [1, 3, 5] and live["size"].sum() == 190


def test_fragmentation_hand_computed():
    blocks = pd.DataFrame({"block_id": [1], "device": ["cuda:0"], "size": [1000], "alloc_ns": [0], "free_ns": [10]})
    segments = pd.DataFrame({
        "device": ["cuda:0", "cuda:0"], "addr": [0, 1 << 30], "total_size": [2 << 20, 20 << 20],
        "allocated_size": [1 << 20, 10 << 20], "active_size": [1 << 20, 10 << 20],
        "requested_size": [(1 << 20) - 100, (10 << 20) - 900], "stream": [0, 0], "pool": ["small", "large"],
    })
    seg_blocks = pd.DataFrame({
        "device": ["cuda:0"] * 4, "segment_addr": [0, 0, 1 << 30, 1 << 30],
        "addr": [0, 1 << 20, 1 << 30, (1 << 30) + (10 << 20)],
        "size": [1 << 20, 1 << 20, 10 << 20, 10 << 20], "requested_size": [0, 0, 0, 0],
        "state": ["active_allocated", "inactive", "active_allocated", "inactive"],
    })
    events = pd.DataFrame({
        "seq": [0, 1, 2, 3], "t_ns": [0, 1, 2, 3], "device": ["cuda:0"] * 4,
        "action": ["segment_alloc", "alloc", "segment_alloc", "segment_free"],
        "addr": [0, 0, 1 << 30, 1 << 30], "size": [2 << 20, 1000, 20 << 20, 20 << 20], "stream": [0] * 4,
    })
    trace = Trace.from_tables(blocks, segments=segments, segment_blocks=seg_blocks, events=events)
    f = fragmentation(trace)["cuda:0"]
    assert f["reserved_bytes"] == 22 << 20 and f["allocated_bytes"] == 11 << 20
    assert f["fragmentation"] == pytest.approx(0.5)
    assert f["rounding_overhead_bytes"] == 1000
    assert f["free_bytes"] == 11 << 20 and f["largest_free_block"] == 10 << 20
    assert f["external_fragmentation"] == pytest.approx(1 - 10 / 11)
    assert f["by_pool"]["small"]["fragmentation"] == pytest.approx(0.5)
    # the final state holds 22 MiB while the events net +2 MiB: 20 MiB were reserved before recording began
    # (the level never starts at 0 on a warm start), then +2, +20, -20 MiB
    assert f["initial_reserved_bytes"] == 20 << 20
    assert f["peak_reserved_bytes"] == 42 << 20 and f["reserved_over_live"] == pytest.approx((42 << 20) / 1000)
    curve = reserved_curve(trace, "cuda:0")
    assert curve.reserved.tolist() == [20 << 20, 22 << 20, 22 << 20, 42 << 20, 22 << 20]
    assert curve.final == f["reserved_bytes"] and curve.raised_by == 0
    assert fragmentation(peak_trace()) == {}


def test_real_snapshot_peak_and_fragmentation(shared):
    import memlens
    from memlens.io.safe_pickle import load_pickle

    path = shared("snapshots/cs336_wedsonlin_medium_128_training.pickle")
    trace = memlens.load(path)
    raw = load_pickle(path)
    segs = [s for s in raw["segments"] if s.get("device", 0) == 0]
    f = fragmentation(trace)["cuda:0"]
    assert f["reserved_bytes"] == sum(s["total_size"] for s in segs)
    assert f["allocated_bytes"] == sum(s["allocated_size"] for s in segs)
    assert f["reserved_bytes"] >= f["allocated_bytes"] >= f["requested_bytes"] > 0
    assert 0 <= f["fragmentation"] < 1 and 0 <= f["external_fragmentation"] < 1
    p = peak_breakdown(trace)["cuda:0"]
    assert p.peak_bytes == trace.peak_live_bytes()["cuda:0"]
    assert p.by_category["bytes"].sum() == p.peak_bytes == p.by_op["bytes"].sum()
    assert p.by_category["blocks"].sum() == p.live_blocks and not p.notes
    # the live blocks at the peak are real allocations that fit in what the allocator reserved at the end
    assert p.peak_bytes <= f["reserved_bytes"]


def test_real_snapshot_reserved_replay(shared):
    import memlens

    trace = memlens.load(shared("snapshots/decomfl_memory.pickle"))
    f = fragmentation(trace)["cuda:0"]
    # the allocator started empty, so the segment events account for every reserved byte at the end
    assert f["peak_reserved_bytes"] >= f["reserved_bytes"] > 0
    assert f["reserved_over_live"] >= 1.0


def test_live_curve_matches_trace_live_bytes():
    from memlens.analysis.live import live_curve

    trace = peak_trace()
    for dev in ("cuda:0", "cpu"):
        frame, alloc_pos = live_curve(trace, dev)
        expected = trace.live_bytes(dev)
        assert frame["live"].tolist() == expected["live"].tolist()
        assert frame["t_ns"].tolist() == expected["t_ns"].tolist()
    total, alloc_pos = live_curve(trace)
    assert total["live"].max() == 200  # the cpu block (live 5..6) is gone by the cuda peak at 25
    # each block's alloc event sits where the curve rises by its size
    rises = total["live"].diff().fillna(total["live"]).to_numpy()[alloc_pos]
    assert rises.tolist() == trace.blocks["size"].tolist()
