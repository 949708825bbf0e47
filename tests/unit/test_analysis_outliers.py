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
    """Ops (start-end ns): 1 [10,12], 2 [100,103], 3 [30,31], 4 [5,6], 5 [200,204], 6 [40,41], 7 [60,62].

    A: 10 B, alloc 0, accessed by ops 1 and 2, free 110 -> ATI 12 -> 100 = 88 (round trip 20)
    B: 30 B, alloc 20, accessed by op 3 only, free 50    -> no ATI, only lifetime edges
    C: 5 B,  alloc 0, accessed by ops 4 and 5, free 210  -> ATI 6 -> 200 = 194 (round trip 10)
    D: 20 B, alloc 15, accessed by ops 6 and 7, free 70  -> ATI 41 -> 60 = 19 (round trip 40)
    Live bytes: 15 on [0,15), 35 on [15,20), 65 on [20,50) (the peak, at t=20), 35 on [50,70),
    15 on [70,110), 5 on [110,210).
    """
    blocks = pd.DataFrame({
        "block_id": [1, 2, 3, 4], "device": ["cuda:0"] * 4, "size": [10, 30, 5, 20],
        "alloc_ns": [0, 20, 0, 15], "free_ns": [110, 50, 210, 70],
        "category": ["activation", "temporary", "optimizer_state", "activation"],
        "op": ["aten::relu", "aten::mm", "aten::zeros", "aten::add"],
        "module": ["net.act", "net.fc", "", "net.out"], "stack_id": [4, pd.NA, 9, pd.NA],
    })
    accesses = pd.DataFrame({"block_id": [1, 1, 2, 3, 3, 4, 4], "t_ns": [10, 100, 30, 5, 200, 40, 60],
                             "op_id": [1, 2, 3, 4, 5, 6, 7],
                             "is_write": [True, False, True, True, False, True, False]})
    ops = pd.DataFrame({"op_id": [1, 2, 3, 4, 5, 6, 7], "name": "aten::op",
                        "start_ns": [10, 100, 30, 5, 200, 40, 60], "end_ns": [12, 103, 31, 6, 204, 41, 62]})
    return Trace.from_tables(blocks, accesses, ops)


def test_bandwidth_filter_flags_and_windows():
    iv = bandwidth_filter(idle_trace(), ONE_BYTE_PER_NS)
    # the ATIs only, from the end of one op to the start of the next
    assert iv["block_id"].tolist() == [1, 3, 4]
    assert iv["length_ns"].tolist() == [88, 194, 19]
    assert set(iv["kind"].astype(str)) == {"access_to_access"}
    assert iv["round_trip_ns"].tolist() == [20, 10, 40]
    assert iv["swappable"].tolist() == [True, True, False]
    assert iv["saved_ns"].tolist() == [68, 184, 0]
    assert iv["swappable_bytes_ns"].tolist() == [680, 920, 0]
    swap_a = iv.iloc[0]
    assert (swap_a["swap_out_done_ns"], swap_a["swap_in_start_ns"]) == (22, 90)
    only = swappable_intervals(idle_trace(), ONE_BYTE_PER_NS)
    assert only["block_id"].tolist() == [1, 3] and only["length_ns"].tolist() == [88, 194]
    assert iv.attrs["clock"]["kind"] == "host" and iv.attrs["bandwidth"]["d2h_bytes_per_s"] == 1e9


def test_filter_summary_and_infinite_bound():
    s = filter_summary(bandwidth_filter(idle_trace(), ONE_BYTE_PER_NS))
    assert s["intervals"] == 3 and s["swappable"] == 2
    assert s["filtered_out_fraction"] == pytest.approx(1 / 3)
    idle = 10 * 88 + 5 * 194 + 20 * 19
    assert s["idle_bytes_ns"] == idle and s["swappable_bytes_ns"] == 680 + 920
    assert s["swappable_share"] == pytest.approx((680 + 920) / idle)
    assert s["blocks_with_swappable"] == 2
    assert s["clock"]["kind"] == "host"
    inf = filter_summary(bandwidth_filter(idle_trace(), "inf"))
    assert inf["swappable"] == 3 and inf["swappable_bytes_ns"] == pytest.approx(idle)


def test_default_bandwidth_is_pcie4():
    iv = bandwidth_filter(idle_trace())
    assert iv.attrs["bandwidth"]["name"] == "pcie4_x16"
    assert not iv["swappable"].any()  # every gap is far below 20 us of latency


def test_outliers_size_x_idle_ranking_and_attribution():
    out = outliers(idle_trace(), ONE_BYTE_PER_NS, top=None)
    # size x longest ATI: C 5*194=970, A 10*88=880, D 20*19=380; B has no ATI
    assert out["block_id"].tolist() == [3, 1, 4]
    assert out["score"].tolist() == [970, 880, 380]
    first = out.iloc[0]
    assert (first["max_idle_ns"], first["max_idle_start_ns"], first["max_idle_end_ns"]) == (194, 6, 200)
    assert first["max_idle_kind"] == "access_to_access" and first["accesses"] == 2
    assert first["lifetime_ns"] == 210 and first["idle_fraction"] == pytest.approx(194 / 210)
    assert first["swappable_intervals"] == 1 and first["swappable_bytes_ns"] == 920
    assert first["category"] == "optimizer_state" and first["op"] == "aten::zeros" and first["stack_id"] == 9
    d = out.set_index("block_id").loc[4]
    assert d["swappable_bytes_ns"] == 0 and d["module"] == "net.out"
    assert outliers(idle_trace(), ONE_BYTE_PER_NS, top=1)["block_id"].tolist() == [3]
    assert out.attrs["clock"]["kind"] == "host" and out.attrs["min_size"] == 0
    with pytest.raises(ValueError):
        outliers(idle_trace(), ONE_BYTE_PER_NS, priority="biggest")


def test_zhang_priorities_doa_aoa_wdoa():
    trace = idle_trace()
    # the peak is at t=20: A's ATI [12,100) and C's [6,200) span it, D's [41,60) does not
    doa = outliers(trace, ONE_BYTE_PER_NS, top=None, priority="doa", min_size=0).set_index("block_id")
    assert doa["doa_ns"].to_dict() == {3: 184.0, 1: 68.0}
    assert list(doa.index) == [3, 1]
    aoa = outliers(trace, ONE_BYTE_PER_NS, top=None, priority="aoa", min_size=0)
    assert aoa["block_id"].tolist() == [3, 1] and aoa["aoa"].tolist() == [920.0, 680.0]
    # limit 35 B: weight (load - 35) / (65 - 35) is 1 on [20,50) and 0 elsewhere; A is out over [22,90]
    # (28 ns of it weighted), C over [11,195] (30 ns)
    wdoa = outliers(trace, ONE_BYTE_PER_NS, top=None, priority="wdoa", min_size=0, limit_bytes=35)
    assert wdoa.set_index("block_id")["wdoa_ns"].to_dict() == {3: 30.0, 1: 28.0}
    # Zhang et al.'s 1 MiB candidate floor applies by default: these blocks are tiny
    ranked = outliers(trace, ONE_BYTE_PER_NS, priority="doa")
    assert len(ranked) == 0


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
    duration = rng.integers(0, 30, n_acc)
    accesses = pd.DataFrame({"block_id": blocks["block_id"].to_numpy()[owner], "t_ns": t,
                             "op_id": np.arange(n_acc), "is_write": False})
    ops = pd.DataFrame({"op_id": np.arange(n_acc), "name": "op", "start_ns": t, "end_ns": t + duration})
    trace = Trace.from_tables(blocks, accesses, ops)
    out = outliers(trace, ONE_BYTE_PER_NS, top=None).set_index("block_id")
    for row in blocks.itertuples():
        mine = np.flatnonzero(owner == row.Index)
        if len(mine) < 2:
            assert row.block_id not in out.index
            continue
        order = mine[np.lexsort((mine, t[mine]))]
        # from the end of one op to the start of the next (0 when the next starts before the end)
        gaps = np.maximum(t[order][1:] - (t[order] + duration[order])[:-1], 0)
        saved = np.clip(gaps - 2 * row.size, 0, None) * (gaps >= 2 * row.size)
        got = out.loc[row.block_id]
        assert got["max_idle_ns"] == gaps.max()
        assert got["swappable_bytes_ns"] == pytest.approx(float((saved * row.size).sum()))
        assert got["accesses"] == len(mine)


def test_blocks_without_an_ati_are_not_outliers():
    base = idle_trace()
    extra = pd.DataFrame({"block_id": [7, 8], "device": ["cuda:0"] * 2, "size": [1000, 900], "alloc_ns": [0, 0],
                          "free_ns": [200, 200], "category": ["temporary", "buffer"],
                          "source": ["profiler", "dispatch"]})
    blocks = pd.concat([base.blocks.assign(source="dispatch"), extra.assign(stream=0)], ignore_index=True)
    trace = Trace.from_tables(blocks, base.accesses, base.ops)
    # never accessed: alloc->free is a lifetime edge (reported beside the ATI by `ati`), not an idle ATI
    for flag in (False, True):
        ids = outliers(trace, ONE_BYTE_PER_NS, top=None, include_unobserved=flag)["block_id"].tolist()
        assert ids == [3, 1, 4]
    edges = access_intervals(trace)
    assert edges.set_index("block_id").loc[8, "kind"] == "alloc_to_free"


def test_ranking_ties_and_top_selection():
    # four blocks with the same size x idle (100 B x 10 ns = 50 B x 20 ns): ties break by size, then id
    blocks = pd.DataFrame({"block_id": [5, 4, 3, 2], "device": ["cpu"] * 4, "size": [50, 100, 100, 50],
                           "alloc_ns": [0, 0, 0, 0], "free_ns": [30, 30, 30, 30]})
    accesses = pd.DataFrame({"block_id": [5, 4, 3, 2, 5, 4, 3, 2], "t_ns": [0, 0, 0, 0, 20, 10, 10, 20],
                             "op_id": [1, 1, 1, 1, 3, 2, 2, 3], "is_write": [True] * 8})
    trace = Trace.from_tables(blocks, accesses)
    ranked = outliers(trace, ONE_BYTE_PER_NS, top=None)
    assert ranked["score"].tolist() == [1000.0] * 4
    assert ranked["block_id"].tolist() == [3, 4, 2, 5]
    assert outliers(trace, ONE_BYTE_PER_NS, top=3)["block_id"].tolist() == [3, 4, 2]
    assert outliers(trace, ONE_BYTE_PER_NS, top=1)["block_id"].tolist() == [3]
