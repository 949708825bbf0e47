"""Bandwidth filter and outlier ranking: hand-computed values on a constructed trace."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memlens.analysis.ati import access_intervals
from memlens.analysis.bandwidth import BandwidthModel
from memlens.analysis.outliers import bandwidth_filter, filter_summary, outliers, swappable_intervals
from memlens.trace import Trace

# 1 byte per ns each way, no latency: the round trip of a block of s bytes is 2*s ns
ONE_BYTE_PER_NS = BandwidthModel(h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9, latency_ns=0)


def idle_trace() -> Trace:
    """A: 10 B, alloc 0, accesses 10, 100, free 110 -> intervals 10, 90, 10 (round trip 20)
    B: 30 B, alloc 20, access 30, free 50            -> intervals 10, 20     (round trip 60)
    C: 5 B,  alloc 0, accesses 5, 200, free 210      -> intervals 5, 195, 10 (round trip 10)
    Live bytes: 15 on [0,20), 45 on [20,50) (the peak, at t=20), 15 on [50,110), 5 on [110,210).
    """
    blocks = pd.DataFrame({
        "block_id": [1, 2, 3], "device": ["cuda:0"] * 3, "size": [10, 30, 5],
        "alloc_ns": [0, 20, 0], "free_ns": [110, 50, 210],
        "category": ["activation", "temporary", "optimizer_state"], "op": ["aten::relu", "aten::mm", "aten::zeros"],
        "module": ["net.act", "net.fc", ""], "stack_id": [4, pd.NA, 9],
    })
    accesses = pd.DataFrame({"block_id": [1, 1, 2, 3, 3], "t_ns": [10, 100, 30, 5, 200], "op_id": [1, 2, 3, 4, 5],
                             "is_write": [True, False, True, True, False]})
    return Trace.from_tables(blocks, accesses)


def test_bandwidth_filter_flags_and_windows():
    iv = bandwidth_filter(idle_trace(), ONE_BYTE_PER_NS)
    assert iv["round_trip_ns"].tolist() == [20, 20, 20, 60, 60, 10, 10, 10]
    assert iv["swappable"].tolist() == [False, True, False, False, False, False, True, True]
    assert iv["saved_ns"].tolist() == [0, 70, 0, 0, 0, 0, 185, 0]
    assert iv["swappable_bytes_ns"].tolist() == [0, 700, 0, 0, 0, 0, 925, 0]
    swap_a = iv.iloc[1]
    assert (swap_a["swap_out_done_ns"], swap_a["swap_in_start_ns"]) == (20, 90)
    only = swappable_intervals(idle_trace(), ONE_BYTE_PER_NS)
    assert only["block_id"].tolist() == [1, 3, 3] and only["length_ns"].tolist() == [90, 195, 10]


def test_filter_summary_and_infinite_bound():
    s = filter_summary(bandwidth_filter(idle_trace(), ONE_BYTE_PER_NS))
    assert s["intervals"] == 8 and s["swappable"] == 3
    assert s["filtered_out_fraction"] == pytest.approx(5 / 8)
    idle = 10 * 110 + 30 * 30 + 5 * 210
    assert s["idle_bytes_ns"] == idle and s["swappable_bytes_ns"] == 700 + 925
    assert s["swappable_share"] == pytest.approx((700 + 925) / idle)
    assert s["blocks_with_swappable"] == 2
    inf = filter_summary(bandwidth_filter(idle_trace(), "inf"))
    assert inf["swappable"] == 8 and inf["swappable_bytes_ns"] == pytest.approx(idle)


def test_default_bandwidth_is_pcie4():
    iv = bandwidth_filter(idle_trace())
    assert iv.attrs["bandwidth"]["name"] == "pcie4_x16"
    assert not iv["swappable"].any()  # every gap is far below 20 us of latency


def test_outliers_size_x_idle_ranking_and_attribution():
    out = outliers(idle_trace(), ONE_BYTE_PER_NS, top=None)
    # size x longest interval: C 5*195=975, A 10*90=900, B 30*20=600
    assert out["block_id"].tolist() == [3, 1, 2]
    assert out["score"].tolist() == [975, 900, 600]
    first = out.iloc[0]
    assert (first["max_idle_ns"], first["max_idle_start_ns"], first["max_idle_end_ns"]) == (195, 5, 200)
    assert first["max_idle_kind"] == "access_to_access" and first["accesses"] == 2
    assert first["lifetime_ns"] == 210 and first["idle_fraction"] == pytest.approx(195 / 210)
    assert first["swappable_intervals"] == 2 and first["swappable_bytes_ns"] == 925
    assert first["category"] == "optimizer_state" and first["op"] == "aten::zeros" and first["stack_id"] == 9
    b = out.set_index("block_id").loc[2]
    assert b["max_idle_kind"] == "last_to_free" and b["swappable_bytes_ns"] == 0 and b["module"] == "net.fc"
    assert outliers(idle_trace(), ONE_BYTE_PER_NS, top=1)["block_id"].tolist() == [3]
    with pytest.raises(ValueError):
        outliers(idle_trace(), ONE_BYTE_PER_NS, priority="biggest")


def test_zhang_priorities_doa_aoa_wdoa():
    trace = idle_trace()
    # every block spans the peak at t=20: A by [10,100], B by [20,30], C by [5,200]
    doa = outliers(trace, ONE_BYTE_PER_NS, top=None, priority="doa", min_size=0).set_index("block_id")
    assert doa["doa_ns"].to_dict() == {3: 185.0, 1: 70.0, 2: 10 - 60.0}
    assert list(doa.index) == [3, 1, 2]
    aoa = outliers(trace, ONE_BYTE_PER_NS, top=None, priority="aoa", min_size=0)
    assert aoa["block_id"].tolist() == [3, 1, 2] and aoa["aoa"].tolist() == [925.0, 700.0, -1500.0]
    # limit 15 B: weight 1 while 45 B are live ([20,50)), 0 elsewhere; A is out over [20,90], C over [10,195]
    wdoa = outliers(trace, ONE_BYTE_PER_NS, top=None, priority="wdoa", min_size=0, limit_bytes=15)
    assert wdoa.set_index("block_id")["wdoa_ns"].to_dict() == {1: 30.0, 3: 30.0, 2: 0.0}
    # Zhang et al.'s 1 MB candidate floor applies by default: these blocks are tiny
    assert len(outliers(trace, ONE_BYTE_PER_NS, priority="doa")) == 0


def test_outliers_accepts_intervals_and_device_filter():
    trace = idle_trace()
    iv = access_intervals(trace)
    a = outliers(trace, ONE_BYTE_PER_NS, top=None, intervals=iv)
    b = outliers(trace, ONE_BYTE_PER_NS, top=None)
    pd.testing.assert_frame_equal(a, b)
    assert len(outliers(trace, ONE_BYTE_PER_NS, device="cuda:1")) == 0


def test_outliers_vectorised_matches_bruteforce_on_random_trace():
    rng = np.random.default_rng(7)
    n_blocks, n_acc = 300, 3000
    alloc = rng.integers(0, 10_000, n_blocks)
    free = alloc + rng.integers(1, 5_000, n_blocks)
    blocks = pd.DataFrame({"block_id": np.arange(n_blocks) * 3 + 1, "device": "cuda:0",
                           "size": rng.integers(1, 1_000, n_blocks), "alloc_ns": alloc, "free_ns": free})
    owner = rng.integers(0, n_blocks, n_acc)
    t = alloc[owner] + (rng.random(n_acc) * (free[owner] - alloc[owner])).astype(np.int64)
    accesses = pd.DataFrame({"block_id": blocks["block_id"].to_numpy()[owner], "t_ns": t,
                             "op_id": np.arange(n_acc), "is_write": False})
    trace = Trace.from_tables(blocks, accesses)
    out = outliers(trace, ONE_BYTE_PER_NS, top=None).set_index("block_id")
    for row in blocks.itertuples():
        times = np.sort(np.concatenate([[row.alloc_ns], t[owner == row.Index], [row.free_ns]]))
        gaps = np.diff(times)
        saved = np.clip(gaps - 2 * row.size, 0, None) * (gaps >= 2 * row.size)
        got = out.loc[row.block_id]
        assert got["max_idle_ns"] == gaps.max()
        assert got["swappable_bytes_ns"] == pytest.approx(float((saved * row.size).sum()))
        assert got["accesses"] == len(gaps) - 1


def test_allocator_only_blocks_without_accesses_are_not_idle_by_default():
    base = idle_trace()
    extra = pd.DataFrame({"block_id": [7, 8], "device": ["cuda:0"] * 2, "size": [1000, 900], "alloc_ns": [0, 0],
                          "free_ns": [200, 200], "category": ["temporary", "buffer"],
                          "source": ["profiler", "dispatch"]})
    blocks = pd.concat([base.blocks.assign(source="dispatch"), extra.assign(stream=0)], ignore_index=True)
    trace = Trace.from_tables(blocks, base.accesses)
    # block 7: a workspace only the allocator saw - used inside its op, not idle; block 8: an op-level
    # instrument saw it and nothing ever touched it - really unused for 200 ns
    default = outliers(trace, ONE_BYTE_PER_NS, top=None)["block_id"].tolist()
    assert 7 not in default and default[0] == 8
    everything = outliers(trace, ONE_BYTE_PER_NS, top=None, include_unobserved=True)["block_id"].tolist()
    assert everything[:2] == [7, 8]


def test_ranking_ties_and_top_selection():
    # four blocks with the same size x idle (100 B x 10 ns = 50 B x 20 ns): ties break by size, then id
    blocks = pd.DataFrame({"block_id": [5, 4, 3, 2], "device": ["cpu"] * 4, "size": [50, 100, 100, 50],
                           "alloc_ns": [0, 0, 0, 0], "free_ns": [20, 10, 10, 20]})
    accesses = pd.DataFrame({"block_id": [5, 4, 3, 2], "t_ns": [0, 0, 0, 0], "op_id": [1, 1, 1, 1],
                             "is_write": [True] * 4})
    trace = Trace.from_tables(blocks, accesses)
    ranked = outliers(trace, ONE_BYTE_PER_NS, top=None)
    assert ranked["score"].tolist() == [1000.0] * 4
    assert ranked["block_id"].tolist() == [3, 4, 2, 5]
    assert outliers(trace, ONE_BYTE_PER_NS, top=3)["block_id"].tolist() == [3, 4, 2]
    assert outliers(trace, ONE_BYTE_PER_NS, top=1)["block_id"].tolist() == [3]
