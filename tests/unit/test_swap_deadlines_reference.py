"""Periodic load curves and swap plans (deadlines, stalls, repeating plans) against brute-force references.

Small random traces (hypothesis, from _interval_refs) are built with ops of known edges; every expectation is
recomputed here, block by block and instant by instant, from the definition, not from memlens:
- a swapped block must be back by the start of the op that next accesses it, or the stall is reported;
- a repeating plan is re-simulated over three periods: the load is counted instant by instant.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from _interval_refs import DEVICE, SETTINGS, examples, iterations_at, traces  # noqa: E402
from memlens.analysis.bandwidth import BandwidthModel  # noqa: E402
from memlens.swap import plan_swaps  # noqa: E402
from memlens.swap.periodic import PeriodicLoadCurve  # noqa: E402
from memlens.trace import Trace  # noqa: E402


# ---- the periodic load curve --------------------------------------------------------------------------
@SETTINGS
@given(traces(max_ops=10), st.data())
def test_periodic_load_curve_is_the_window_load(trace, data):
    lo, hi = trace.time_span_ns()
    w0 = data.draw(st.integers(lo, hi))
    w1 = data.draw(st.integers(w0 + 1, hi + 50))
    curve = PeriodicLoadCurve(trace, DEVICE, (w0, w1))
    t, live = curve.curve()
    b = trace.blocks
    alloc = b["alloc_ns"].astype("float64").fillna(lo).to_numpy()
    free = b["free_ns"].astype("float64").fillna(np.inf).to_numpy()
    size = b["size"].to_numpy()
    # after every event time inside the window (and at w0), the bytes alive then
    times = sorted(set([w0] + [int(x) for x in np.concatenate([alloc, free]) if np.isfinite(x) and w0 <= x < w1]))
    expected_peak = max(int(size[(alloc <= x) & (x < free)].sum()) for x in times)
    last_at = {int(x): int(v) for x, v in zip(t, live)}  # the level after the last event at each time
    for x in times:
        assert last_at[x] == int(size[(alloc <= x) & (x < free)].sum()), x
    assert int(t[0]) == w0 and all(w0 <= int(x) < w1 for x in t)
    # the peak counts the events at one instant in trace order: at least the level after them
    assert curve.peak()[0] >= expected_peak


# ---- swap plans: deadlines at the op's start, stalls reported ------------------------------------------
def _next_op_start(trace: Trace, block: int, after: int) -> int:
    """The interval's deadline: the start of the op of `block`'s next access after the access whose op
    ended at `after` (the interval's start), in op order. (By time alone, "the first access at or after
    `after`" would take that op's own access when it lasts zero ns: starts and ends at `after`.)"""
    ops = trace.ops.set_index("op_id")
    mine = trace.accesses[trace.accesses["block_id"] == block].sort_values(["op_id", "t_ns"])
    rows = [(int(o), min(int(ops.loc[o, "start_ns"]), int(t)), int(ops.loc[o, "end_ns"]))
            for o, t in zip(mine["op_id"], mine["t_ns"])]
    before = [i for i, (_, _, end) in enumerate(rows) if end <= after]
    k = before[-1] + 1 if before else 0
    return rows[k][1]


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(max_ops=9, max_blocks=5, min_accesses=2), st.integers(1, 400))
def test_swap_deadlines_are_op_starts_and_stalls_are_reported(trace, bytes_per_ns):
    model = BandwidthModel(h2d_bytes_per_s=bytes_per_ns * 1e9, d2h_bytes_per_s=bytes_per_ns * 1e9,
                           latency_ns=0.0)
    plan = plan_swaps(trace, bandwidth=model, min_size=0, priority="doa")
    sw = plan.swaps
    total = 0
    for row in sw.itertuples():
        deadline = _next_op_start(trace, row.block_id, row.idle_from_ns)
        assert row.idle_to_ns == deadline
        assert row.out_start_ns >= row.idle_from_ns and row.in_start_ns >= row.out_end_ns
        assert row.stall_ns == max(row.in_end_ns - deadline, 0)
        total += row.stall_ns
    assert plan.stall_ns == total
    for a, b in (("out_start_ns", "out_end_ns"), ("in_start_ns", "in_end_ns")):
        o = sw.sort_values(a)
        assert (o[a].to_numpy()[1:] >= o[b].to_numpy()[:-1]).all()  # one copy at a time on each stream


def test_a_late_copy_in_reports_its_stall():
    """serial_schedule by hand: two swaps idle [0, 1000) and [100, 1050), 600 ns out and 400 ns in each.
    Outs: 0 -> 600, then 600 -> 1200. Ins in deadline order, as late as allowed: the first may start at 600
    (deadline 1000) but the second needs its copy-out (ends 1200): 1200 -> 1600, stalling 550 ns."""
    from memlens.swap.schedule import serial_schedule
    a = np.array([0, 100], np.int64)
    b = np.array([1000, 1050], np.int64)
    d_out = np.array([600, 600], np.int64)
    d_in = np.array([400, 400], np.int64)
    s = serial_schedule(a, b, d_out, d_in)
    assert s.out_start.tolist() == [0, 600] and s.out_end.tolist() == [600, 1200]
    assert s.in_start.tolist() == [600, 1200] and s.in_end.tolist() == [1000, 1600]
    assert s.stall.tolist() == [0, 550]


def _two_block_trace() -> Trace:
    """X (1 MB) read by ops [0, 100] and [1100, 1200], W (500 kB) alive [400, 700): the peak 1.5 MB is there."""
    ops = pd.DataFrame({"op_id": [1, 2], "name": "op", "start_ns": [0, 1100], "end_ns": [100, 1200]})
    blocks = pd.DataFrame({"block_id": [1, 2], "device": DEVICE, "size": [1_000_000, 500_000],
                           "alloc_ns": [0, 400], "free_ns": [1300, 700]})
    acc = pd.DataFrame({"block_id": [1, 1], "t_ns": [0, 1200], "op_id": [1, 2], "is_write": [False, True]})
    return Trace.from_tables(blocks, acc, ops)


def test_a_swap_is_back_by_its_next_op_start():
    """One 1 MB block idle between ops [0, 100] and [1100, 1200] (the next access a write, stamped 1200);
    at 10 kB/ns each way (100 ns) it is copied out at 100..200 and back at 1000..1100, by the op's start.
    Block 2 (500 kB) lives [400, 700): the peak falls from 1.5 MB to the 1 MB of block 1 alone."""
    trace = _two_block_trace()
    fast = BandwidthModel(h2d_bytes_per_s=1e13, d2h_bytes_per_s=1e13, latency_ns=0.0)
    plan = plan_swaps(trace, bandwidth=fast, min_size=0)
    row = plan.swaps.iloc[0]
    assert (row.idle_from_ns, row.idle_to_ns) == (100, 1100)
    assert (row.out_start_ns, row.out_end_ns, row.in_start_ns, row.in_end_ns) == (100, 200, 1000, 1100)
    assert plan.stall_ns == 0 and plan.peak_before == 1_500_000 and plan.peak_after == 1_000_000


def test_the_deadline_after_a_zero_length_op_is_the_next_op():
    """Hypothesis's case: block 114 is read by op 7, which starts and ends at 1001, then by op 19 at 1514;
    at 4 B/ns its 1024 bytes go out at 1001..1257 and it is needed back by 1514 (not 1001: op 7's own read
    is the access the idle time starts after)."""
    ops = pd.DataFrame({"op_id": [7, 10, 19], "name": "op", "start_ns": [1001, 1002, 1514],
                        "end_ns": [1001, 1002, 1514]})
    # block 107 (4 kB) lives [1257, 1258): the peak, which makes 114 a candidate
    blocks = pd.DataFrame({"block_id": [100, 107, 114], "device": DEVICE, "size": [8, 4096, 1024],
                           "alloc_ns": [0, 1257, 0], "free_ns": [2000, 1258, 2000]})
    acc = pd.DataFrame({"block_id": [114, 100, 114], "t_ns": [1001, 1002, 1514], "op_id": [7, 10, 19],
                        "is_write": False})
    trace = Trace.from_tables(blocks, acc, ops)
    model = BandwidthModel(h2d_bytes_per_s=4e9, d2h_bytes_per_s=4e9, latency_ns=0.0)
    plan = plan_swaps(trace, bandwidth=model, min_size=0, priority="doa")
    row = plan.swaps.set_index("block_id").loc[114]
    assert (row.idle_from_ns, row.idle_to_ns) == (1001, 1514)
    assert _next_op_start(trace, 114, 1001) == 1514
    assert (row.out_start_ns, row.out_end_ns, row.in_start_ns, row.in_end_ns) == (1001, 1257, 1258, 1514)
    assert row.stall_ns == 0 and plan.stall_ns == 0 and plan.peak_before == 8 + 4096 + 1024


# ---- repeating plans re-simulated over three periods ----------------------------------------------------
def _periodic_deadline_by_hand(trace: Trace, block: int, idle_from: int, window: tuple[int, int],
                               period: int) -> int:
    """When the block must be back: the start of the next op that accesses it, in the recording or in the
    repeated window (the window's accesses, by op start, shifted by whole periods), at most a period less
    1 ns after it went idle."""
    w0, w1 = window
    ops = trace.ops.set_index("op_id")
    mine = trace.accesses[trace.accesses["block_id"] == block]
    edges = sorted({(min(int(ops.loc[o, "start_ns"]), int(t)), max(int(ops.loc[o, "end_ns"]), int(t)))
                    for o, t in zip(mine["op_id"], mine["t_ns"])})
    # the access whose op ended at idle_from is the earlier one; the next starts after it in op order
    pos = max(i for i, (_, e) in enumerate(edges) if e == idle_from)
    candidates = [s for s, _ in edges[pos + 1:]]
    firsts = [s for s, _ in edges if w0 <= s < w1]
    if firsts:
        candidates.append(min(firsts) + period)
    candidates.append(idle_from + period - 1)
    return max(min(candidates), idle_from)


def _load_by_hand(trace: Trace, window: tuple[int, int], period: int, swaps: pd.DataFrame, copies=range(-3, 6)):
    """Peak bytes over the middle of three repeated periods, instant by instant: the recorded window's blocks
    (as the trace orders events at one instant: the frees of blocks allocated earlier, then the allocs, then
    the frees of blocks that live zero ns; so after the allocs of instant x a block is live when
    alloc <= x < free, or alloc == free == x; at the period's start also the level carried into it, live just
    before it: alloc < w0 <= free), less every swapped block strictly between the end of its copy-out and the
    start of its copy-in, in every repetition."""
    w0, w1 = window
    lo, _ = trace.time_span_ns()
    b = trace.blocks[trace.blocks["device"] == DEVICE]
    alloc = b["alloc_ns"].astype("float64").fillna(lo).to_numpy()
    free = b["free_ns"].astype("float64").fillna(np.inf).to_numpy()
    size = b["size"].to_numpy(np.int64)
    saving = swaps[swaps["out_end_ns"] < swaps["in_start_ns"]]
    r = np.concatenate([saving["out_end_ns"].to_numpy() + j * period for j in copies])
    q = np.concatenate([saving["in_start_ns"].to_numpy() + j * period for j in copies])
    z = np.tile(saving["size"].to_numpy(np.int64), len(copies))
    instants = [w0] + [int(x) for x in np.concatenate([alloc, free]) if np.isfinite(x) and w0 <= x < w1]
    instants += [int(w0 + (x - w0) % period) for x in np.concatenate([r, q])]
    best = 0
    for x in set(instants):
        tau = x + period  # the middle period
        alive = (alloc <= x) & ((x < free) | ((alloc == x) & (free == x)))
        saved = int(z[(r < tau) & (tau < q)].sum())
        best = max(best, int(size[alive].sum()) - saved)
        if x == w0:  # the level carried into the period: what was live just before its first instant
            best = max(best, int(size[(alloc < x) & (x <= free)].sum()) - saved)
    return best


def _repeating_case(trace: Trace, data) -> tuple[list[int], pd.DataFrame, int, BandwidthModel]:
    """Drawn for a repeating plan: iteration starts (ns) at the first op's start and up to three later op
    starts, their iterations table, the iteration k that repeats, and a bandwidth of 500 B/ns to 200 kB/ns
    each way."""
    op_starts = trace.ops["start_ns"].astype(int).tolist()
    picks = sorted(set(data.draw(st.lists(st.sampled_from(op_starts[1:]), min_size=1, max_size=3))))
    starts = [op_starts[0]] + picks
    its = iterations_at(starts, trace.time_span_ns()[1])
    k = data.draw(st.integers(0, len(starts) - 1))
    rate = data.draw(st.integers(500, 200_000))
    model = BandwidthModel(h2d_bytes_per_s=rate * 1e9, d2h_bytes_per_s=rate * 1e9, latency_ns=0.0)
    return starts, its, k, model


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(max_ops=12, max_blocks=5, min_accesses=3), st.data())
def test_a_repeating_plan_resimulated_over_three_periods(trace, data):
    starts, its, k, model = _repeating_case(trace, data)
    import memlens.analysis.iterations as iterations_module
    original = iterations_module.split_iterations
    iterations_module.split_iterations = lambda _trace: its
    try:
        plan = plan_swaps(trace, bandwidth=model, min_size=0, iteration=k, priority=data.draw(
            st.sampled_from(["doa", "aoa", "wdoa", "peak"])), limit=data.draw(st.sampled_from([None, 1])))
    finally:
        iterations_module.split_iterations = original
    window, period = tuple(plan.window_ns), int(plan.period_ns)
    assert window[0] == starts[k] and window[1] - window[0] == period
    sw = plan.swaps
    for row in sw.itertuples():
        deadline = _periodic_deadline_by_hand(trace, row.block_id, row.idle_from_ns, window, period)
        assert row.idle_to_ns == deadline
        assert row.stall_ns == max(row.in_end_ns - deadline, 0)
        assert row.out_start_ns >= row.idle_from_ns and row.in_start_ns >= row.out_end_ns
    assert plan.stall_ns == int(sw["stall_ns"].sum())
    from memlens.swap.planner import SWAP_COLUMNS
    assert list(sw.columns) == list(SWAP_COLUMNS)
    times = sw[["out_start_ns", "out_end_ns", "in_start_ns", "in_end_ns"]].to_numpy()
    outside = ((times < window[0]) | (times > window[1])).any(axis=1) if len(sw) else np.zeros(0, bool)
    assert sw["crosses_boundary"].tolist() == (outside | sw["wraps"].to_numpy(bool)).tolist()
    assert plan.peak_before == _load_by_hand(trace, window, period, sw.iloc[:0])
    assert plan.peak_after == _load_by_hand(trace, window, period, sw)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(max_ops=12, max_blocks=5, min_accesses=3), st.data())
def test_any_set_of_repeating_swaps_resimulated_over_three_periods(trace, data):
    """Any subset of the candidates (not only those a priority picks), timed by the periodic scheduler and
    folded into the period's load curve, against the instant-by-instant load and the deadlines by hand."""
    from memlens.swap.candidates import idle_intervals, swap_candidates
    from memlens.swap.periodic import periodic_schedule

    starts, its, k, model = _repeating_case(trace, data)
    iv = idle_intervals(trace, DEVICE, steady_state=True, iteration=k, iterations=its)
    window, period = tuple(iv.attrs["window_ns"]), int(iv.attrs["period_ns"])
    cands = swap_candidates(iv, model, 0)
    chosen = [i for i in range(len(cands)) if data.draw(st.booleans())]
    c = cands.iloc[chosen].reset_index(drop=True)
    sched = periodic_schedule(period)(c["idle_from_ns"].to_numpy(np.int64), c["idle_to_ns"].to_numpy(np.int64),
                                      c["out_ns"].to_numpy(np.int64), c["in_ns"].to_numpy(np.int64))
    curve = PeriodicLoadCurve(trace, DEVICE, window)
    swaps = pd.DataFrame({"block_id": c["block_id"], "size": c["size"], "out_end_ns": sched.out_end,
                          "in_start_ns": sched.in_start})
    for i, row in c.iterrows():
        deadline = _periodic_deadline_by_hand(trace, int(row.block_id), int(row.idle_from_ns), window, period)
        assert int(row.idle_to_ns) == deadline
        assert sched.in_end[i] - sched.in_start[i] == row.in_ns and sched.out_end[i] - sched.out_start[i] == row.out_ns
        if sched.stall[i] < period:  # a settled schedule: the stall is the copy-in's lateness
            assert sched.stall[i] == max(int(sched.in_end[i]) - deadline, 0)
    settled = not len(c) or (sched.stall < period).all()
    assert curve.peak()[0] == _load_by_hand(trace, window, period, swaps.iloc[:0])
    if settled:
        assert curve.peak(c["size"].to_numpy(np.int64), sched)[0] == _load_by_hand(trace, window, period, swaps)


# ---- swap plans: every reported fact by hand ----------------------------------------------------------------
def test_a_plan_reports_every_fact_by_hand():
    fast = BandwidthModel(h2d_bytes_per_s=1e13, d2h_bytes_per_s=1e13, latency_ns=0.0)
    plan = plan_swaps(_two_block_trace(), bandwidth=fast, min_size=0)
    s = plan.summary()
    assert {k: s[k] for k in ("peak_before", "peak_after", "infinite_bandwidth_peak", "saved_bytes",
                              "transfer_bytes", "stall_ns", "late_copy_ins", "swap_count", "candidates",
                              "smaller_candidates", "idle_intervals", "min_size", "met_limit", "limit",
                              "steady_state", "iteration", "period_ns", "window_ns")} == {
        "peak_before": 1_500_000, "peak_after": 1_000_000, "infinite_bandwidth_peak": 1_000_000,
        "saved_bytes": 500_000, "transfer_bytes": 2_000_000, "stall_ns": 0, "late_copy_ins": 0, "swap_count": 1,
        "candidates": 1, "smaller_candidates": 0, "idle_intervals": 1, "min_size": 0, "met_limit": None,
        "limit": None, "steady_state": False, "iteration": None, "period_ns": None, "window_ns": None}
    assert s["priority"].startswith("best:") and s["priority"] != "best:"
    assert plan.swaps["crosses_boundary"].tolist() == [False] and plan.swaps["wraps"].tolist() == [False]
    assert len(plan.candidates_table) == 1 and plan.candidates_table["doa_ns"].tolist() == [800]
    # the curves, by hand: X out at 200 and back at 1000; W alive [400, 700)
    before = list(zip(plan.curve_before["t_ns"], plan.curve_before["live"]))
    assert before == [(0, 1_000_000), (400, 1_500_000), (700, 1_000_000), (1300, 0)]
    after = list(zip(plan.curve_after["t_ns"], plan.curve_after["live"]))
    assert max(v for _, v in after) == 1_000_000 and (200, 0) in after and (1000, 1_000_000) in after
    limited = plan_swaps(_two_block_trace(), bandwidth=fast, min_size=0, limit=1_200_000, priority="doa")
    assert limited.met_limit is True and limited.summary()["priority"] == "doa"


def test_periodic_schedule_by_hand():
    """One swap idle [10, 90) of a 100 ns period, 20 ns each way: out 10..30, in as late as allowed 70..90,
    settled (the neighbours are the same shifted by a period), no stall."""
    from memlens.swap.periodic import periodic_schedule
    s = periodic_schedule(100)(np.array([10]), np.array([90]), np.array([20]), np.array([20]))
    assert (s.out_start.tolist(), s.out_end.tolist(), s.in_start.tolist(), s.in_end.tolist()) == \
        ([10], [30], [70], [90])
    assert s.stall.tolist() == [0]
    # two swaps whose copies cannot fit one period: the queue grows every period, each marked a period late
    s = periodic_schedule(100)(np.array([0, 0]), np.array([99, 99]), np.array([60, 60]), np.array([60, 60]))
    assert (s.stall >= 100).all()


def test_empty_periodic_curve_and_the_default_steady_iteration(monkeypatch):
    trace = _two_block_trace()
    empty = PeriodicLoadCurve(Trace.from_tables(trace.blocks.iloc[:0], trace.accesses.iloc[:0]), DEVICE, (0, 10))
    assert empty.peak() == (0, 0, 10)  # the whole period at 0 bytes
    import memlens.analysis.iterations as iterations_module
    its = iterations_at([0, 600, 1100], 1300)
    monkeypatch.setattr(iterations_module, "split_iterations", lambda _trace: its)
    fast = BandwidthModel(h2d_bytes_per_s=1e13, d2h_bytes_per_s=1e13, latency_ns=0.0)
    plan = plan_swaps(trace, bandwidth=fast, min_size=0, steady_state=True)
    # iterations of 600, 500 and a last 201 ns: the middle one, which has a successor
    assert (plan.iteration, plan.period_ns, plan.window_ns) == (1, 500, (600, 1100))
