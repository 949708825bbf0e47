"""Swap planning: plans re-checked by an independent simulator (bandwidth, serial streams, lifetimes)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from memlens import Trace
from memlens.analysis.bandwidth import BandwidthModel
from memlens.cli import main
from memlens.errors import NeedsAccessesError
from memlens.swap import plan_swaps

MS = 1_000_000
GB = 1_000_000_000


def build_trace(blocks, uses, horizon_ns):
    """blocks: {name: (size, alloc_ns, free_ns)}; uses: [(t_ns, duration_ns, [names])] -> Trace with ops."""
    ids = {name: i for i, name in enumerate(blocks)}
    b = pd.DataFrame([{"block_id": ids[k], "device": "cuda:0", "size": z, "alloc_ns": a, "free_ns": f,
                       "category": "activation", "op": f"make_{k}", "module": f"net.{k}"}
                      for k, (z, a, f) in blocks.items()])
    ops = pd.DataFrame([{"op_id": i, "name": f"op{i}", "start_ns": t, "end_ns": t + d, "module": ""}
                        for i, (t, d, _) in enumerate(uses)])
    acc = pd.DataFrame([{"block_id": ids[k], "t_ns": t, "op_id": i, "is_write": False}
                        for i, (t, d, names) in enumerate(uses) for k in names])
    ops = pd.concat([ops, pd.DataFrame([{"op_id": len(uses), "name": "end", "start_ns": horizon_ns,
                                         "end_ns": horizon_ns, "module": ""}])], ignore_index=True)
    return Trace.from_tables(b, acc, ops)


def simulate_and_check(trace, plan, model: BandwidthModel):
    """Independent check of a SwapPlan; returns the peak (bytes) recomputed from scratch."""
    sw = plan.swaps
    size = sw["size"].to_numpy(np.float64)
    out_ns = np.ceil(model.out_latency_ns + size * 1e9 / model.d2h_bytes_per_s)
    in_ns = np.ceil(model.in_latency_ns + size * 1e9 / model.h2d_bytes_per_s)
    assert ((sw["out_end_ns"] - sw["out_start_ns"]).to_numpy() == out_ns).all()
    assert ((sw["in_end_ns"] - sw["in_start_ns"]).to_numpy() == in_ns).all()
    assert (sw["out_start_ns"] >= sw["idle_from_ns"]).all() and (sw["in_start_ns"] >= sw["out_end_ns"]).all()
    assert (sw["in_end_ns"] <= sw["idle_to_ns"] + sw["stall_ns"]).all()
    # lifetimes: copies happen while the block exists
    t_lo, t_hi = trace.time_span_ns()
    blk = trace.blocks.set_index("block_id").loc[sw["block_id"]]
    assert (blk["alloc_ns"].fillna(t_lo).to_numpy() <= sw["out_start_ns"].to_numpy()).all()
    assert (sw["in_end_ns"].to_numpy() <= blk["free_ns"].fillna(t_hi).to_numpy() + sw["stall_ns"].to_numpy()).all()
    # no op may use the block between the end of its last use and the copy-in's deadline
    ops = trace.ops.set_index("op_id")
    acc = trace.accesses.assign(op_end=lambda d: d["op_id"].map(ops["end_ns"]).to_numpy())
    m = sw.reset_index().merge(acc, on="block_id")
    busy = (m["op_end"] > m["out_start_ns"]) & (m["t_ns"] < m["in_end_ns"] - m["stall_ns"])
    assert not busy.any(), f"blocks {sorted(set(m.loc[busy, 'block_id']))} used while swapped out"
    for start, end in (("out_start_ns", "out_end_ns"), ("in_start_ns", "in_end_ns")):
        srt = sw.sort_values(start)
        assert (srt[start].to_numpy()[1:] >= srt[end].to_numpy()[:-1]).all(), f"{start} stream not serial"
    # peak by brute force at every instant where anything changes
    b = trace.blocks[trace.blocks["device"] == plan.device]
    a = b["alloc_ns"].fillna(t_lo).to_numpy(np.int64)
    f = b["free_ns"].fillna(t_hi + 1).to_numpy(np.int64)
    z = b["size"].to_numpy(np.int64)
    saved = sw[sw["saved_from_ns"] < sw["saved_to_ns"]]
    s0, s1 = saved["saved_from_ns"].to_numpy(), saved["saved_to_ns"].to_numpy()
    sz = saved["size"].to_numpy(np.int64)
    times = np.unique(np.concatenate([a, f, s0, s1]))
    peak = 0
    for chunk in np.array_split(times, max(1, len(times) // 512)):
        t = chunk[:, None]
        load = ((a <= t) & (t < f)) @ z - ((s0 <= t) & (t < s1)) @ sz
        peak = max(peak, int(load.max(initial=0)))
    return peak


def two_block_trace():
    # A (1 GB) used at 0 and at 500 ms; B (2 GB) lives 200-300 ms: peak 3 GB while A idles
    blocks = {"A": (1 * GB, 0, 600 * MS), "B": (2 * GB, 200 * MS, 300 * MS)}
    uses = [(0, 1 * MS, ["A"]), (200 * MS, 1 * MS, ["B"]), (299 * MS, 1 * MS, ["B"]), (500 * MS, 1 * MS, ["A"])]
    return build_trace(blocks, uses, 600 * MS)


def test_swapping_an_idle_block_removes_it_from_the_peak():
    trace = two_block_trace()
    model = BandwidthModel(10 * GB, 10 * GB, 10_000)
    for priority in ("doa", "aoa", "wdoa", "peak", "best"):
        plan = plan_swaps(trace, bandwidth=model, priority=priority)
        assert plan.peak_before == 3 * GB
        assert plan.peak_after == 2 * GB == plan.infinite_bandwidth_peak
        assert plan.swaps["block_id"].tolist() == [0] and plan.transfer_bytes == 2 * GB
        assert plan.stall_ns == 0
        row = plan.swaps.iloc[0]
        assert row.out_start_ns == 1 * MS  # after the op that used A ends
        assert row.out_end_ns == 1 * MS + 100 * MS + 10_000
        assert row.in_end_ns == 500 * MS  # just in time for the next use
        assert (row.category, row.op, row.module) == ("activation", "make_A", "net.A")
        assert simulate_and_check(trace, plan, model) == plan.peak_after


def test_only_the_intervals_asked_for_are_candidates():
    trace = two_block_trace()
    model = BandwidthModel(10 * GB, 10 * GB, 10_000)
    # B's only interval (200-299 ms, 2 GB) is too short to swap, A's is the one that lowers the peak
    without_a = plan_swaps(trace, bandwidth=model, only=lambda iv: (iv["block_id"] != 0).to_numpy())
    assert len(without_a.swaps) == 0 and without_a.peak_after == without_a.peak_before == 3 * GB
    assert without_a.infinite_bandwidth_peak == 3 * GB and without_a.intervals == 1   # B's bound: nothing off
    only_a = plan_swaps(trace, bandwidth=model, only=lambda iv: (iv["block_id"] == 0).to_numpy())
    assert only_a.swaps["block_id"].tolist() == [0] and only_a.peak_after == 2 * GB


def test_too_slow_a_link_cannot_swap():
    trace = two_block_trace()
    plan = plan_swaps(trace, bandwidth=BandwidthModel(1 * GB, 1 * GB, 0), priority="best")
    # a 1 GB round trip takes 2 s, A idles 0.5 s
    assert plan.peak_after == plan.peak_before == 3 * GB and len(plan.swaps) == 0
    assert plan.infinite_bandwidth_peak == 2 * GB


def test_serial_copy_streams_limit_what_can_be_swapped():
    # A1 and A2 (1 GB each) both idle across B's window; at 5 GB/s one copy takes 200 ms, and the single
    # copy-out stream cannot get both out before B arrives and back before they are needed
    blocks = {"A1": (GB, 0, 900 * MS), "A2": (GB, 0, 900 * MS), "B": (3 * GB, 250 * MS, 350 * MS)}
    uses = [(0, 1 * MS, ["A1", "A2"]), (250 * MS, 1 * MS, ["B"]), (349 * MS, 1 * MS, ["B"]),
            (600 * MS, 1 * MS, ["A1", "A2"])]
    trace = build_trace(blocks, uses, 900 * MS)
    model = BandwidthModel(5 * GB, 5 * GB, 0)
    plan = plan_swaps(trace, bandwidth=model, priority="best")
    assert plan.peak_before == 5 * GB and plan.infinite_bandwidth_peak == 3 * GB  # B alone at its uses
    assert plan.peak_after == 4 * GB and len(plan.swaps) == 1
    assert simulate_and_check(trace, plan, model) == plan.peak_after
    fast = BandwidthModel(50 * GB, 50 * GB, 0)
    both = plan_swaps(trace, bandwidth=fast, priority="best")
    assert both.peak_after == 3 * GB and len(both.swaps) == 2
    assert simulate_and_check(trace, both, fast) == both.peak_after


def test_limit_stops_once_met():
    # A0..A3 (1 GB each) are made 50 ms apart, idle across B, and used once more 50 ms apart
    blocks = {f"A{i}": (GB, 50 * i * MS, (700 + 50 * i) * MS + MS // 2 + 1) for i in range(4)}
    blocks["B"] = (GB, 300 * MS, 400 * MS)
    uses = [(50 * i * MS, MS // 2, [f"A{i}"]) for i in range(4)] + [(300 * MS, MS, ["B"]), (399 * MS, MS, ["B"])]
    uses += [((700 + 50 * i) * MS, MS // 2, [f"A{i}"]) for i in range(4)]
    trace = build_trace(blocks, uses, 900 * MS)
    model = BandwidthModel(100 * GB, 100 * GB, 0)
    plan = plan_swaps(trace, bandwidth=model, limit=int(3.5 * GB), priority="best")
    assert plan.peak_before == 5 * GB and plan.infinite_bandwidth_peak == GB
    assert plan.met_limit and plan.peak_after == 3 * GB and len(plan.swaps) == 2
    assert simulate_and_check(trace, plan, model) == plan.peak_after
    unreachable = plan_swaps(trace, bandwidth=model, limit="500MB")
    assert unreachable.met_limit is False and unreachable.peak_after == unreachable.infinite_bandwidth_peak


def test_trace_without_accesses_is_refused(shared):
    from memlens.io import load
    with pytest.raises(NeedsAccessesError):
        plan_swaps(load(shared("dsa/tflm_person_detection.csv")))


@pytest.mark.parametrize("name,priority", [(n, p) for n in ("mlp_train_sgd_stacks", "cnn_inference")
                                           for p in ("doa", "aoa", "wdoa", "peak")]
                         + [("transformer_train_adamw", "peak")])
def test_recorded_traces_plans_verify(name, priority):
    from conftest import SAMPLE_TRACES
    from memlens.io import load
    path = SAMPLE_TRACES / f"{name}.memlens"
    if not path.exists():
        pytest.skip(f"{path} not recorded")
    trace = load(path)
    model = BandwidthModel(2 * GB, 2 * GB, 5_000)
    plan = plan_swaps(trace, bandwidth=model, priority=priority)
    assert plan.infinite_bandwidth_peak <= plan.peak_after <= plan.peak_before
    assert plan.stall_ns == 0
    assert plan.transfer_bytes == 2 * int(plan.swaps["size"].sum())
    assert simulate_and_check(trace, plan, model) <= plan.peak_after


def test_best_is_no_worse_than_each_priority():
    from conftest import SAMPLE_TRACES
    from memlens.io import load
    path = SAMPLE_TRACES / "transformer_train_adamw.memlens"
    if not path.exists():
        pytest.skip("sample trace not recorded")
    trace = load(path)
    model = BandwidthModel(0.5 * GB, 0.5 * GB, 20_000)
    # a tiny model: its blocks are below Zhang et al.'s 1 MiB floor, which is the default
    assert len(plan_swaps(trace, bandwidth=model, priority="best").swaps) == 0
    best = plan_swaps(trace, bandwidth=model, priority="best", min_size=0)
    assert simulate_and_check(trace, best, model) <= best.peak_after
    assert best.peak_after < best.peak_before
    for p in ("doa", "aoa", "wdoa", "peak"):
        assert best.peak_after <= plan_swaps(trace, bandwidth=model, priority=p, min_size=0).peak_after


def test_cli_swap_json(tmp_path, capsys):
    path = tmp_path / "t.memlens"
    two_block_trace().save(path)
    assert main(["swap", str(path), "--bandwidth", "10GB/s", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("peak_before", "peak_after", "infinite_bandwidth_peak", "stall_ns", "swaps"):
        assert key in out
    assert out["peak_after"] == 2 * GB and out["swaps"][0]["block_id"] == 0
    assert main(["swap", str(path), "--limit", "2.5GB"]) == 0
    assert "met" in capsys.readouterr().out


@pytest.mark.parametrize("seed", range(10))
def test_load_curve_merge_matches_a_full_sort(seed):
    """The compiled merge gives the curve of sorting every event by (time, copy-in < recorded < copy-out,
    recorded order), ties included."""
    from memlens.swap.schedule import LoadCurve, Schedule

    rng = np.random.default_rng(seed)
    curve = LoadCurve.__new__(LoadCurve)
    curve.t = np.sort(rng.integers(0, 30, 200)).astype(np.int64)
    curve.delta = rng.integers(-50, 80, 200).astype(np.int64)
    k = 25
    out_end = rng.integers(0, 30, k).astype(np.int64)
    in_start = out_end + rng.integers(-3, 10, k)  # some not saving (copy-in before copy-out ends)
    size = rng.integers(1, 40, k).astype(np.int64)
    sched = Schedule(out_end - 1, out_end, in_start, in_start + 1, np.zeros(k, np.int64))
    t, live = curve.curve(size, sched)
    eff = sched.saving
    z = size[eff]
    ts = np.concatenate([in_start[eff], curve.t, out_end[eff]])
    ds = np.concatenate([z, curve.delta, -z])
    cls = np.concatenate([np.zeros(len(z)), np.ones(len(curve.t)), np.full(len(z), 2)])
    pos = np.arange(len(ts))
    order = np.lexsort((pos, cls, ts))
    assert t.tolist() == ts[order].tolist()
    assert live.tolist() == np.cumsum(ds[order]).tolist()


def test_peak_and_overload_match_the_curve():
    from memlens.swap.schedule import LoadCurve, Schedule

    rng = np.random.default_rng(3)
    curve = LoadCurve.__new__(LoadCurve)
    curve.t = np.sort(rng.integers(0, 1000, 300)).astype(np.int64)
    curve.delta = rng.integers(-40, 60, 300).astype(np.int64)
    out_end = rng.integers(0, 1000, 30).astype(np.int64)
    size = rng.integers(1, 90, 30).astype(np.int64)
    sched = Schedule(out_end, out_end, out_end + 50, out_end + 60, np.zeros(30, np.int64))
    t, live = curve.curve(size, sched)
    for goal in (0, 500, 2000):
        peak, over = curve.peak_and_overload(size, sched, goal)
        assert peak == max(int(live.max()), 0)
        assert over == pytest.approx(float((np.diff(t) * np.maximum(live[:-1] - goal, 0)).sum()))


def test_a_swap_that_ends_up_saving_nothing_is_dropped():
    """X (1 GB) is idle 1-140 ms, Y (3 GB) 90-210 ms, B (10 GB) lives 100-200 ms: 14 GB against an 11 GB limit.
    DOA picks X first (139 ms idle vs 120 ms): it lowers the load over the limit on [100, 139) but not the peak.
    Y then brings the peak to 11 GB on its own, so X saves nothing any more and must not be kept."""
    blocks = {"X": (GB, 0, 300 * MS), "Y": (3 * GB, 0, 300 * MS), "B": (10 * GB, 100 * MS, 200 * MS)}
    uses = [(0, 1 * MS, ["X"]), (89 * MS, 1 * MS, ["Y"]), (100 * MS, 1 * MS, ["B"]), (140 * MS, 1 * MS, ["X"]),
            (210 * MS, 1 * MS, ["Y"])]
    trace = build_trace(blocks, uses, 300 * MS)
    model = BandwidthModel(1000 * GB, 1000 * GB, 0)
    plan = plan_swaps(trace, bandwidth=model, limit=11 * GB, priority="doa", min_size=0)
    table = plan.candidates_table.set_index("block_id")
    assert table.loc[0, "rank_doa"] == 1 and table.loc[1, "rank_doa"] == 2  # X first, then Y
    assert plan.swaps["block_id"].tolist() == [1] and plan.peak_after == 11 * GB and plan.met_limit
    assert simulate_and_check(trace, plan, model) == 11 * GB
