"""ATI and bandwidth model: hand-computed values on small constructed traces."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from memlens.analysis.ati import access_intervals, ati_by, ati_distribution, ati_stats, iteration_of
from memlens.analysis.bandwidth import PRESETS, BandwidthModel
from memlens.analysis.distributions import ecdf, log_bins, log_histogram, quantiles, size_class
from memlens.errors import InputError, NeedsAccessesError
from memlens.trace import Trace


def small_trace() -> Trace:
    """Three blocks on cuda:0 and one on cpu.

    block 1: alloc 0, accesses 20 (op 1 read+write: one event), 60, free 100 -> 20, 40, 40
    block 2: alloc 10, free 50, never accessed -> one alloc_to_free interval of 40
    block 3: allocated before recording, accesses 5 and 120, alive at the end (trace end 130)
             -> 0..5 (truncated), 5..120, 120..130 (truncated)
    block 4 (cpu): alloc 30, access 35, free 130 -> 5, 95
    """
    blocks = pd.DataFrame({
        "block_id": [1, 2, 3, 4], "device": ["cuda:0", "cuda:0", "cuda:0", "cpu"],
        "size": [100, 200, 300, 50], "alloc_ns": [0, 10, pd.NA, 30], "free_ns": [100, 50, pd.NA, 130],
        "category": ["activation", "parameter", "optimizer_state", "activation"],
        "module": ["net.fc1", "", "net", "net.fc2"], "op": ["aten::mm", "aten::empty", "", "aten::add"],
    })
    accesses = pd.DataFrame({
        "block_id": [1, 1, 1, 3, 3, 4], "t_ns": [20, 20, 60, 5, 120, 35], "op_id": [1, 1, 2, 3, 4, 5],
        "is_write": [True, False, False, False, False, True],
    })
    return Trace.from_tables(blocks, accesses)


def test_intervals_hand_computed():
    iv = access_intervals(small_trace())
    assert list(iv.columns[:9]) == ["block_id", "device", "size", "start_ns", "end_ns", "length_ns", "kind",
                                    "ordinal", "truncated"]
    assert iv["block_id"].tolist() == [1, 1, 1, 2, 3, 3, 3, 4, 4]
    assert iv["start_ns"].tolist() == [0, 20, 60, 10, 0, 5, 120, 30, 35]
    assert iv["end_ns"].tolist() == [20, 60, 100, 50, 5, 120, 130, 35, 130]
    assert iv["length_ns"].tolist() == [20, 40, 40, 40, 5, 115, 10, 5, 95]
    assert iv["kind"].astype(str).tolist() == [
        "alloc_to_first", "access_to_access", "last_to_free", "alloc_to_free",
        "alloc_to_first", "access_to_access", "last_to_free", "alloc_to_first", "last_to_free"]
    assert iv["ordinal"].tolist() == [0, 1, 2, 0, 0, 1, 2, 0, 1]
    assert iv["truncated"].tolist() == [False, False, False, False, True, False, True, False, False]
    assert iv["size"].tolist() == [100] * 3 + [200] + [300] * 3 + [50] * 2
    assert iv.attrs["accesses_outside_lifetime"] == 0


def test_intervals_per_device_and_sum_to_lifetime():
    trace = small_trace()
    iv = access_intervals(trace, device="cpu")
    assert iv["block_id"].tolist() == [4, 4]
    assert set(iv["device"].astype(str)) == {"cpu"}
    # the intervals of each block tile its (bounded) lifetime exactly
    all_iv = access_intervals(trace)
    per_block = all_iv.groupby("block_id")["length_ns"].sum().to_dict()
    assert per_block == {1: 100, 2: 40, 3: 130, 4: 100}


def test_access_outside_lifetime_widens_instead_of_negative():
    blocks = pd.DataFrame({"block_id": [7], "device": ["cpu"], "size": [8], "alloc_ns": [10], "free_ns": [20]})
    accesses = pd.DataFrame({"block_id": [7, 7], "t_ns": [5, 25], "op_id": [1, 2], "is_write": [True, False]})
    iv = access_intervals(Trace.from_tables(blocks, accesses))
    assert iv["length_ns"].tolist() == [0, 20, 0]
    assert (iv["length_ns"] >= 0).all()
    assert iv.attrs["accesses_outside_lifetime"] == 2


def test_no_accesses_raises_with_reason():
    blocks = pd.DataFrame({"block_id": [1], "device": ["cuda:0"], "size": [8], "alloc_ns": [0], "free_ns": [5]})
    trace = Trace.from_tables(blocks, metadata={"source_kind": "cuda_snapshot"})
    with pytest.raises(NeedsAccessesError) as err:
        access_intervals(trace)
    assert "accesses" in str(err.value) and "cuda_snapshot" in str(err.value)
    assert isinstance(err.value, InputError)


def test_ati_stats_hand_computed():
    iv = access_intervals(small_trace())
    s = ati_stats(iv)
    # headline: the two access->access intervals only (block 1: 20->60, block 3: 5->120)
    assert s["count"] == 2 and s["blocks"] == 2
    assert s["total_ns"] == 40 + 115
    assert s["mean_ns"] == pytest.approx(77.5)
    assert s["p50_ns"] == pytest.approx(77.5) and s["max_ns"] == 115 and s["min_ns"] == 40
    assert s["zero_count"] == 0 and s["wrap_around"] == 0
    # the lifetime edges beside it, by kind, never mixed in
    assert s["edges"]["alloc_to_first"]["count"] == 3
    assert s["edges"]["alloc_to_first"]["total_ns"] == 20 + 5 + 5
    assert s["edges"]["last_to_free"]["count"] == 3 and s["edges"]["last_to_free"]["max_ns"] == 95
    assert s["edges"]["alloc_to_free"]["count"] == 1 and s["edges"]["alloc_to_free"]["p50_ns"] == 40
    assert s["truncated"] == 2
    assert s["by_kind"] == {"alloc_to_first": 3, "access_to_access": 2, "last_to_free": 3, "alloc_to_free": 1}
    assert s["fraction_below"]["1us"] == 1.0
    assert s["clock"]["kind"] == "host"
    s2 = ati_stats(iv, exclude_truncated=True)
    assert s2["count"] == 2 and s2["truncated"] == 0
    empty = ati_stats(iv.iloc[:0])
    assert empty["count"] == 0 and empty["p50_ns"] is None


def test_ati_by_category_module_size_class():
    trace = small_trace()
    iv = access_intervals(trace)
    by_cat = ati_by(trace, "category", iv).set_index("category")
    # ATIs only: block 1 (activation) 20->60, block 3 (optimizer_state) 5->120; block 4 has one access
    assert by_cat.loc["activation", "count"] == 1
    assert by_cat.loc["activation", "bytes"] == 100
    assert by_cat.loc["activation", "max_ns"] == 40
    assert by_cat.loc["optimizer_state", "total_ns"] == 115
    assert "parameter" not in by_cat.index  # block 2 was never accessed: only a lifetime edge
    by_mod = ati_by(trace, "module", iv).set_index("module")
    assert set(by_mod.index) == {"net.fc1", "net"}
    by_size = ati_by(trace, "size_class", iv)
    assert by_size["count"].sum() == 2 and by_size["size_class"].tolist() == ["< 4 KiB"]
    # by kind shows the edges beside the ATI
    by_kind = ati_by(trace, "kind", iv).set_index("kind")
    assert by_kind["count"].to_dict() == {"alloc_to_first": 3, "access_to_access": 2, "last_to_free": 3,
                                          "alloc_to_free": 1}
    with pytest.raises(ValueError):
        ati_by(trace, "colour", iv)


def test_ati_by_iteration_uses_given_boundaries():
    trace = small_trace()
    iters = pd.DataFrame({"iteration": [0, 1], "start_ns": [0, 50], "end_ns": [50, 130],
                          "source": ["marker", "marker"]})
    by_it = ati_by(trace, "iteration", iterations=iters).set_index("iteration")
    # ATI starts: 20 (block 1) and 5 (block 3): both in iteration 0
    assert by_it.loc[0, "count"] == 2 and 1 not in by_it.index
    assert iteration_of(np.array([-5, 0, 49, 50, 130, 131]), iters).tolist() == [-1, 0, 0, 1, 1, -1]


def test_bandwidth_model_formulas():
    m = BandwidthModel(h2d_bytes_per_s=10e9, d2h_bytes_per_s=20e9, latency_ns=1000)
    size = np.array([0, 1e9, 2e9])
    assert m.swap_out_ns(size).tolist() == [1000, 1000 + 5e7, 1000 + 1e8]
    assert m.swap_in_ns(size).tolist() == [1000, 1000 + 1e8, 1000 + 2e8]
    assert m.round_trip_ns(1e9) == pytest.approx(1e9 / 20e9 * 1e9 + 1e9 / 10e9 * 1e9 + 2 * 1000)
    zhang = BandwidthModel.preset("zhang")
    # out 13.2 GB/s + 47 us, in 12.2 GB/s + 9.7 us
    assert zhang.round_trip_ns(132e6) == pytest.approx(1e7 + 47_000 + 132e6 / 12.2e9 * 1e9 + 9_700)
    inf = BandwidthModel.parse("inf")
    assert inf.is_infinite and float(inf.round_trip_ns(1 << 30)) == 0.0
    assert BandwidthModel().d2h_bytes_per_s == 25e9 and BandwidthModel().latency_ns == 10_000


def test_bandwidth_parse():
    m = BandwidthModel.parse("25GB/s")
    assert m.h2d_bytes_per_s == m.d2h_bytes_per_s == 25e9 and m.latency_ns == 10_000
    m2 = BandwidthModel.parse("13.2GB/s,12.2GB/s", latency_ns=0)
    assert m2.d2h_bytes_per_s == 13.2e9 and m2.h2d_bytes_per_s == 12.2e9 and m2.latency_ns == 0
    assert BandwidthModel.parse("pcie4") == PRESETS["pcie4_x16"]
    assert BandwidthModel.parse("nvlink").h2d_bytes_per_s == 450e9
    assert BandwidthModel.parse("pcie5", latency_ns=3).in_latency_ns == 3
    for bad in ("fast", "-3GB/s", "0GB/s"):
        with pytest.raises(InputError):
            BandwidthModel.parse(bad)
    with pytest.raises(InputError):
        BandwidthModel(0, 1, 0)


def test_distribution_helpers():
    assert quantiles([], (0.5,)) == {0.5: None}
    assert quantiles([1, 2, 3, 4], (0.5,))[0.5] == 2.5
    edges = log_bins([0, 1, 10, 1000], per_decade=1)
    assert edges.tolist()[:4] == [0.0, 1.0, 10.0, 100.0] and edges[-1] > 1000
    h = log_histogram([0, 1, 10, 1000], per_decade=1, weights=[1, 1, 1, 7])
    assert h["count"].sum() == 4 and h.loc[0, "count"] == 1  # the zero sits in [0, 1)
    assert h["weight"].sum() == 10 and math.isclose(h["fraction"].sum(), 1.0)
    assert h.loc[h["lo"] == 1000, "weight"].item() == 7
    e = ecdf([3, 1, 2, 2])
    assert e["value"].tolist() == [1, 2, 3] and e["fraction"].tolist() == [0.25, 0.75, 1.0]
    thin = ecdf(np.arange(10_000), max_points=100)
    assert len(thin) <= 100 and thin["fraction"].iloc[-1] == 1.0
    assert size_class([0, 4096, 1 << 20, (1 << 20) + 1, 1 << 30]).tolist() == [
        "< 4 KiB", "4 KiB - 1 MiB", "1 - 16 MiB", "1 - 16 MiB", ">= 256 MiB"]


def test_time_sorted_fast_path_matches_general_path():
    trace = small_trace()
    expected = access_intervals(trace)
    by_time = trace.accesses.sort_values(["t_ns", "op_id"], kind="stable")
    fast = access_intervals(Trace.from_tables(trace.blocks, by_time))
    pd.testing.assert_frame_equal(fast, expected)


def test_same_time_different_ops_are_two_events():
    blocks = pd.DataFrame({"block_id": [0], "device": ["cpu"], "size": [8], "alloc_ns": [0], "free_ns": [30]})
    for accesses in (  # time-sorted (fast path) and unsorted (general path)
        pd.DataFrame({"block_id": [0, 0, 0, 0], "t_ns": [10, 10, 10, 20], "op_id": [1, 1, 2, 3],
                      "is_write": [False, True, False, False]}),
        pd.DataFrame({"block_id": [0, 0, 0, 0], "t_ns": [20, 10, 10, 10], "op_id": [3, 1, 2, 1],
                      "is_write": [False, True, False, False]}),
    ):
        iv = access_intervals(Trace.from_tables(blocks, accesses))
        # op 1's read+write at t=10 is one event; op 2 at t=10 is another: 0-10, 10-10, 10-20, 20-30
        assert iv["length_ns"].tolist() == [10, 0, 10, 10]


def test_ati_distribution_bundle():
    iv = access_intervals(small_trace())
    d = ati_distribution(iv, per_decade=1)
    assert d["count"] == 2  # the ATIs only: 40 (block 1, 100 B) and 115 (block 3, 300 B)
    assert d["quantiles"][0.5] == pytest.approx(77.5)
    h = d["histogram"].set_index("lo")
    assert h.loc[10.0, "count"] == 1 and h.loc[100.0, "count"] == 1 and h["count"].sum() == 2
    assert h.loc[100.0, "weight"] == 300
    assert d["ecdf"]["fraction"].iloc[-1] == 1.0 and d["ecdf"]["value"].iloc[-1] == 115
