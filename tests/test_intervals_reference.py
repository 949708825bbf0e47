"""Intervals, steady-state wraps, the periodic load curve and swap plans against brute-force references.

Small random traces (hypothesis) are built with ops of known edges; every expectation is recomputed here,
block by block and instant by instant, from REFERENCE.md section 2, not from memlens:
- an ATI runs from the END of the op of one access to the START of the op of the next, whatever the
  accesses' own stamps (a write is stamped at its op's end);
- alloc -> first access ends at the first op's start (0 when that op made the block), last access -> free
  starts at the last op's end (0 when the block was freed inside it);
- an interval wraps when it crosses an iteration start b: start < b <= end;
- a swapped block must be back by the start of the op that next accesses it, or the stall is reported.
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from memlens.analysis.ati import access_intervals  # noqa: E402
from memlens.analysis.bandwidth import BandwidthModel  # noqa: E402
from memlens.swap import plan_swaps  # noqa: E402
from memlens.swap.periodic import PeriodicLoadCurve  # noqa: E402
from memlens.trace import Trace  # noqa: E402

# MEMLENS_HYPOTHESIS_EXAMPLES caps the examples per property (scripts/mutation.sh runs them once per mutant)
CAP = int(os.environ.get("MEMLENS_HYPOTHESIS_EXAMPLES", "0")) or None


def examples(n: int) -> int:
    return min(n, CAP) if CAP else n


SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICE = "cuda:0"


@st.composite
def traces(draw, max_ops: int = 9, max_blocks: int = 5, min_accesses: int = 0):
    """A trace of ops with strictly increasing starts (they may overlap: nested ops), blocks with or without
    a recorded alloc/free, and accesses stamped as recorders stamp them (reads at the op's start, writes at
    its end; an op may read and write one block: two rows)."""
    n_ops = draw(st.integers(2, max_ops))
    gaps = draw(st.lists(st.integers(1, 400), min_size=n_ops, max_size=n_ops))
    starts = 1000 + np.cumsum(gaps)
    durs = draw(st.lists(st.integers(0, 300), min_size=n_ops, max_size=n_ops))
    ends = starts + np.asarray(durs)
    ops = pd.DataFrame({"op_id": np.arange(n_ops) * 3 + 7, "name": "aten::op", "start_ns": starts,
                        "end_ns": ends})
    n_blocks = draw(st.integers(1, max_blocks))
    horizon = int(ends.max()) + 500
    blocks, acc = [], []
    for b in range(n_blocks):
        chosen = sorted(set(draw(st.lists(st.integers(0, n_ops - 1), min_size=max(int(b == 0), min_accesses), max_size=6))))
        first = int(starts[chosen[0]]) if chosen else 1000
        last = int(ends[chosen[-1]]) if chosen else horizon
        alloc = None if draw(st.booleans()) and b % 2 == 0 else draw(st.integers(900, first))
        # a block may live zero ns (allocated and freed at the same instant: sequenced alloc, then free)
        free = None if draw(st.booleans()) else draw(st.integers(max(last, alloc or 0), horizon + 1))
        blocks.append({"block_id": 100 + 7 * b, "device": DEVICE, "size": draw(st.integers(1, 64)) * 1024,
                       "alloc_ns": alloc, "free_ns": free})
        for i in chosen:
            mode = draw(st.sampled_from(["r", "w", "rw"]))
            for w in ([False] if mode == "r" else [True] if mode == "w" else [False, True]):
                acc.append({"block_id": 100 + 7 * b, "op_id": int(ops["op_id"].iloc[i]), "is_write": w,
                            "t_ns": int(ends[i] if w else starts[i])})
    acc = pd.DataFrame(acc, columns=["block_id", "t_ns", "op_id", "is_write"])
    acc = acc.sort_values(["op_id", "block_id"], kind="stable").reset_index(drop=True)
    blk = pd.DataFrame(blocks)
    blk["alloc_ns"] = blk["alloc_ns"].astype("Int64")
    blk["free_ns"] = blk["free_ns"].astype("Int64")
    return Trace.from_tables(blk, acc, ops)


def reference_intervals(trace: Trace) -> list[tuple]:
    """(block, kind, start, end, truncated) of every interval, block by block in plain Python."""
    lo, hi = trace.time_span_ns()
    op_edges = {int(r.op_id): (int(r.start_ns), int(r.end_ns)) for r in trace.ops.itertuples()}
    out = []
    for blk in trace.blocks.itertuples():
        mine = trace.accesses[trace.accesses["block_id"] == blk.block_id]
        events = {}
        for a in mine.itertuples():
            s, e = op_edges.get(int(a.op_id), (int(a.t_ns), int(a.t_ns)))
            s, e = min(s, int(a.t_ns)), max(e, int(a.t_ns))
            events.setdefault(int(a.op_id), (s, e))
        stamps = mine["t_ns"].astype(int).tolist()
        alloc = lo if pd.isna(blk.alloc_ns) else int(blk.alloc_ns)
        free = hi if pd.isna(blk.free_ns) else int(blk.free_ns)
        alloc, free = min([alloc] + stamps), max([free] + stamps)
        seq = sorted(events.values())
        b = int(blk.block_id)
        if not seq:
            out.append((b, "alloc_to_free", alloc, free, pd.isna(blk.alloc_ns) or pd.isna(blk.free_ns)))
            continue
        out.append((b, "alloc_to_first", alloc, max(seq[0][0], alloc), bool(pd.isna(blk.alloc_ns))))
        for (_, e0), (s1, _) in zip(seq, seq[1:]):
            out.append((b, "access_to_access", min(e0, s1), s1, False))
        out.append((b, "last_to_free", min(seq[-1][1], free), free, bool(pd.isna(blk.free_ns))))
    return sorted(out)


def _rows(iv: pd.DataFrame, extra: tuple = ()) -> list[tuple]:
    cols = ["block_id", "kind", "start_ns", "end_ns", "truncated", *extra]
    return sorted(tuple(int(v) if isinstance(v, (np.integer,)) else (bool(v) if isinstance(v, np.bool_) else
                        str(v) if c == "kind" else v) for c, v in zip(cols, row))
                  for row in iv[cols].itertuples(index=False))


@SETTINGS
@given(traces())
def test_intervals_equal_the_op_edge_definition(trace):
    iv = access_intervals(trace)
    assert _rows(iv) == reference_intervals(trace)
    assert (iv["length_ns"] == iv["end_ns"] - iv["start_ns"]).all() and (iv["length_ns"] >= 0).all()


def test_a_write_next_ends_the_interval_at_its_op_start():
    """Hand-made: op A [100, 150] reads X; op B [400, 700] writes X (stamped 700). The ATI is 150 -> 400."""
    ops = pd.DataFrame({"op_id": [1, 2], "name": "op", "start_ns": [100, 400], "end_ns": [150, 700]})
    blocks = pd.DataFrame({"block_id": [5], "device": DEVICE, "size": [4096], "alloc_ns": [50], "free_ns": [900]})
    acc = pd.DataFrame({"block_id": [5, 5], "t_ns": [100, 700], "op_id": [1, 2], "is_write": [False, True]})
    iv = access_intervals(Trace.from_tables(blocks, acc, ops))
    got = iv[["kind", "start_ns", "end_ns"]].astype({"kind": str}).values.tolist()
    assert got == [["alloc_to_first", 50, 100], ["access_to_access", 150, 400], ["last_to_free", 700, 900]]


def test_first_access_by_the_op_that_made_the_block_is_not_idle():
    """Op [100, 200] allocates Y at 120 and writes it (stamped 200): alloc -> first access is 0 at the alloc."""
    ops = pd.DataFrame({"op_id": [1, 2], "name": "op", "start_ns": [100, 300], "end_ns": [200, 350]})
    blocks = pd.DataFrame({"block_id": [1], "device": DEVICE, "size": [64], "alloc_ns": [120], "free_ns": [400]})
    acc = pd.DataFrame({"block_id": [1, 1], "t_ns": [200, 300], "op_id": [1, 2], "is_write": [True, False]})
    iv = access_intervals(Trace.from_tables(blocks, acc, ops))
    got = iv[["kind", "start_ns", "end_ns"]].astype({"kind": str}).values.tolist()
    assert got == [["alloc_to_first", 120, 120], ["access_to_access", 200, 300], ["last_to_free", 350, 400]]
    assert iv.attrs["accesses_outside_lifetime"] == 0


# ---- steady state ----------------------------------------------------------------------------------------
def _iterations(starts: list[int], hi: int) -> pd.DataFrame:
    ends = starts[1:] + [hi]
    return pd.DataFrame({"iteration": np.arange(len(starts)), "start_ns": starts, "end_ns": ends,
                         "source": "marker"})


def reference_cycle(trace: Trace, starts: list[int], k: int | None, steady: bool) -> tuple[list[tuple], int]:
    """The intervals of iteration k (block, kind, start, end, truncated, wraps) and its period, by hand;
    k None: every interval of the recording, the last iteration's period."""
    lo, hi = trace.time_span_ns()
    whole = k is None
    k = len(starts) - 1 if whole else k
    w0 = starts[k]
    if k < len(starts) - 1:
        period = starts[k + 1] - w0
    else:
        span = hi - w0 + 1
        prev = w0 - starts[k - 1] if k > 0 else 0
        period = prev if prev > span else span
    w1 = w0 + period
    op_edges = {int(r.op_id): (int(r.start_ns), int(r.end_ns)) for r in trace.ops.itertuples()}
    rows = []
    for b, kind, s, e, trunc in reference_intervals(trace):
        wraps = kind == "access_to_access" and any(s < x <= e for x in starts[1:])
        if steady and k == len(starts) - 1 and kind == "last_to_free" and trunc and w0 <= s < w1:
            blk = trace.blocks.set_index("block_id").loc[b]
            alive_before = pd.isna(blk["alloc_ns"]) or int(blk["alloc_ns"]) < w0
            mine = trace.accesses[trace.accesses["block_id"] == b]
            firsts = [min(op_edges[int(o)][0], int(t)) for o, t in zip(mine["op_id"], mine["t_ns"])]
            firsts = [f for f in firsts if w0 <= f < w1]
            if alive_before and firsts:
                kind, e, trunc, wraps = "access_to_access", max(min(firsts) + period, s), False, True
        if not whole and not (w0 <= s < w1):
            continue
        if not whole and not steady and (e > w1 or wraps):
            continue
        rows.append((b, kind, s, e, trunc, wraps))
    return sorted(rows), period


@SETTINGS
@given(traces(max_ops=12), st.data())
def test_steady_state_wraps_equal_the_definition(trace, data):
    ops = trace.ops
    lo, hi = trace.time_span_ns()
    op_starts = ops["start_ns"].astype(int).tolist()
    # iteration starts at op starts (an access starting exactly at a boundary) or between ops
    picks = sorted(set(data.draw(st.lists(st.sampled_from(op_starts[1:] + [s + 1 for s in op_starts[:-1]]),
                                          min_size=1, max_size=3))))
    starts = [op_starts[0]] + [p for p in picks if p > op_starts[0]]
    its = _iterations(starts, hi)
    k = data.draw(st.one_of(st.none(), st.integers(0, len(starts) - 1)))
    steady = data.draw(st.booleans()) or k is None
    iv = access_intervals(trace, steady_state=steady, iteration=k, iterations=its)
    expected, period = reference_cycle(trace, starts, k, steady)
    assert iv.attrs["period_ns"] == period
    assert _rows(iv, ("wraps",)) == expected


def test_a_next_access_at_the_iteration_start_wraps():
    """Iterations start at 0 and 1000; the parameter is read by ops [100, 200] and [1000, 1100]: the interval
    200 -> 1000 ends exactly at the boundary and is a wrap-around of iteration 0."""
    ops = pd.DataFrame({"op_id": [1, 2], "name": "op", "start_ns": [100, 1000], "end_ns": [200, 1100]})
    blocks = pd.DataFrame({"block_id": [1], "device": DEVICE, "size": [64], "alloc_ns": [None], "free_ns": [None]})
    acc = pd.DataFrame({"block_id": [1, 1], "t_ns": [100, 1000], "op_id": [1, 2], "is_write": False})
    trace = Trace.from_tables(blocks.astype({"alloc_ns": "Int64", "free_ns": "Int64"}), acc, ops)
    its = _iterations([0, 1000], 1100)
    iv = access_intervals(trace, steady_state=True, iteration=0, iterations=its)
    wraps = iv[iv["wraps"]]
    assert wraps[["start_ns", "end_ns"]].values.tolist() == [[200, 1000]]


def test_no_invented_wrap_when_the_next_iteration_was_recorded():
    """Block read only in iteration 0 of two recorded ones, alive to the end: no wrap-around for iteration 0
    (it is not accessed in iteration 1); one for iteration 1 only if accessed there (it is not)."""
    ops = pd.DataFrame({"op_id": [1, 2, 3], "name": "op", "start_ns": [100, 1100, 1200],
                        "end_ns": [150, 1150, 1250]})
    blocks = pd.DataFrame({"block_id": [1, 2], "device": DEVICE, "size": [64, 32], "alloc_ns": [None, None],
                           "free_ns": [None, None]}).astype({"alloc_ns": "Int64", "free_ns": "Int64"})
    acc = pd.DataFrame({"block_id": [1, 2, 2], "t_ns": [100, 1100, 1250], "op_id": [1, 2, 3],
                        "is_write": [False, False, True]})
    trace = Trace.from_tables(blocks, acc, ops)
    its = _iterations([0, 1000], 1250)
    first = access_intervals(trace, steady_state=True, iteration=0, iterations=its)
    assert not first["wraps"].any()
    last = access_intervals(trace, steady_state=True, iteration=1, iterations=its)
    # block 2 is accessed in the last iteration: [1150, 1200] inside, then 1250 -> 1100 + period (1000)
    assert last[last["wraps"]][["block_id", "start_ns", "end_ns"]].values.tolist() == [[2, 1250, 2100]]
    invented = last[last["wraps"]].iloc[0]
    assert invented["kind"] == "access_to_access" and not invented["truncated"] and invented["length_ns"] == 850
    assert last.attrs["wraps_beyond_recording"] == 1 and first.attrs["wraps_beyond_recording"] == 0
    # the whole recording in steady state: every interval, with the last iteration's wrap added
    whole = access_intervals(trace, steady_state=True, iterations=its)
    assert len(whole) == len(access_intervals(trace)) and whole.attrs["window_ns"] == (1000, 2000)
    assert whole[whole["wraps"]][["block_id", "start_ns", "end_ns"]].values.tolist() == [[2, 1250, 2100]]
    assert last.attrs["period_source"] == "previous iteration" and last.attrs["period_ns"] == 1000


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


def test_a_swap_is_back_by_its_next_op_start():
    """One 1 MB block idle between ops [0, 100] and [1100, 1200] (the next access a write, stamped 1200);
    at 10 kB/ns each way (100 ns) it is copied out at 100..200 and back at 1000..1100, by the op's start.
    Block 2 (500 kB) lives [400, 700): the peak falls from 1.5 MB to the 1 MB of block 1 alone."""
    ops = pd.DataFrame({"op_id": [1, 2], "name": "op", "start_ns": [0, 1100], "end_ns": [100, 1200]})
    blocks = pd.DataFrame({"block_id": [1, 2], "device": DEVICE, "size": [1_000_000, 500_000],
                           "alloc_ns": [0, 400], "free_ns": [1300, 700]})
    acc = pd.DataFrame({"block_id": [1, 1], "t_ns": [0, 1200], "op_id": [1, 2], "is_write": [False, True]})
    trace = Trace.from_tables(blocks, acc, ops)
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


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(max_ops=12, max_blocks=5, min_accesses=3), st.data())
def test_a_repeating_plan_resimulated_over_three_periods(trace, data):
    op_starts = trace.ops["start_ns"].astype(int).tolist()
    picks = sorted(set(data.draw(st.lists(st.sampled_from(op_starts[1:]), min_size=1, max_size=3))))
    starts = [op_starts[0]] + picks
    its = _iterations(starts, trace.time_span_ns()[1])
    k = data.draw(st.integers(0, len(starts) - 1))
    rate = data.draw(st.integers(500, 200_000))
    model = BandwidthModel(h2d_bytes_per_s=rate * 1e9, d2h_bytes_per_s=rate * 1e9, latency_ns=0.0)
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

    op_starts = trace.ops["start_ns"].astype(int).tolist()
    picks = sorted(set(data.draw(st.lists(st.sampled_from(op_starts[1:]), min_size=1, max_size=3))))
    starts = [op_starts[0]] + picks
    its = _iterations(starts, trace.time_span_ns()[1])
    k = data.draw(st.integers(0, len(starts) - 1))
    rate = data.draw(st.integers(500, 200_000))
    model = BandwidthModel(h2d_bytes_per_s=rate * 1e9, d2h_bytes_per_s=rate * 1e9, latency_ns=0.0)
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


# ---- exact values of the helpers --------------------------------------------------------------------------
def test_count_distinct_both_paths():
    from memlens.analysis.ati_intervals import count_distinct
    assert count_distinct(np.zeros(0, np.int64)) == 0
    assert count_distinct(np.array([5, 5, 7, 9, 7], np.int64)) == 3
    assert count_distinct(np.array([1, 1 << 40, 1, 3], np.int64)) == 3  # sparse: by hashing


def test_block_rows_dense_and_sparse_ids():
    from memlens.analysis.ati_intervals import block_rows
    dense = np.array([10, 12, 11, 15], np.int64)
    assert block_rows(dense, np.array([15, 10, 13, 9, 16, 11], np.int64)).tolist() == [3, 0, -1, -1, -1, 2]
    # ids far apart (a hashed or imported numbering): the binary-search path, the largest id included
    sparse = np.array([7, 1 << 40, 3, 1 << 50], np.int64)
    assert block_rows(sparse, np.array([1 << 50, 3, 1 << 40, 7, 8, -1], np.int64)).tolist() == [3, 2, 1, 0, -1, -1]
    assert block_rows(np.zeros(0, np.int64), np.array([1], np.int64)).tolist() == [-1]


def test_sparse_block_ids_keep_every_interval():
    """Blocks numbered 5 and 2**45: both get their intervals (ATI 150 -> 300 for the large id)."""
    ops = pd.DataFrame({"op_id": [1, 2], "name": "op", "start_ns": [100, 300], "end_ns": [150, 320]})
    blocks = pd.DataFrame({"block_id": [5, 1 << 45], "device": DEVICE, "size": [64, 4096], "alloc_ns": [0, 0],
                           "free_ns": [500, 500]})
    acc = pd.DataFrame({"block_id": [1 << 45, 1 << 45, 5], "t_ns": [100, 300, 300], "op_id": [1, 2, 2],
                        "is_write": False})
    iv = access_intervals(Trace.from_tables(blocks, acc, ops))
    ati = iv[iv["kind"] == "access_to_access"]
    assert ati[["block_id", "start_ns", "end_ns"]].values.tolist() == [[1 << 45, 150, 300]]
    assert len(iv) == 5


def test_cycle_window_without_iterations_and_with_them():
    from memlens.analysis.ati_intervals import cycle_window
    ops = pd.DataFrame({"op_id": [1, 2], "name": "op", "start_ns": [100, 900], "end_ns": [150, 1000]})
    blocks = pd.DataFrame({"block_id": [1], "device": DEVICE, "size": [64], "alloc_ns": [100], "free_ns": [1000]})
    acc = pd.DataFrame({"block_id": [1], "t_ns": [100], "op_id": [1], "is_write": False})
    trace = Trace.from_tables(blocks, acc, ops)
    none = pd.DataFrame({"iteration": [], "start_ns": [], "end_ns": [], "source": []})
    assert cycle_window(trace, none, None) == (100, 1001, 901, "trace end")
    its = _iterations([100, 400, 700], 1000)
    assert cycle_window(trace, its, 0) == (100, 400, 300, "next iteration")
    assert cycle_window(trace, its, 2) == (700, 1001, 301, "trace end")  # span 301 > previous 300
    its = _iterations([100, 400, 900], 1000)
    assert cycle_window(trace, its, 2) == (900, 1400, 500, "previous iteration")  # span 101 < 500
    with pytest.raises(Exception, match="iteration 7 is not in the trace"):
        cycle_window(trace, its, 7)


def test_steady_iteration_prefers_a_measured_period():
    from memlens.analysis.iterations import steady_iteration
    # periods 100 (warm-up), 300, 310, and a last step of 290 recorded: the middle one with a successor
    its = pd.DataFrame({"iteration": [0, 1, 2, 3], "start_ns": [0, 100, 400, 710], "end_ns": [100, 400, 710, 1000]})
    assert steady_iteration(its) == 2
    # a short partial third step is never chosen; with two steps the last stands for the cycle
    assert steady_iteration(its.iloc[:2]) == 1
    assert steady_iteration(its.iloc[:1]) == 0 and steady_iteration(its.iloc[:0]) is None
    # periods 300, 300, 300, 10 (a partial step), and a last of 290: median of those after the warm-up 295;
    # step 3 (10 ns) is too short, 4 has no successor: step 2
    short = pd.DataFrame({"iteration": [0, 1, 2, 3, 4], "start_ns": [0, 300, 600, 900, 910],
                          "end_ns": [300, 600, 900, 910, 1200]})
    assert steady_iteration(short) == 2
    assert steady_iteration(short.iloc[[0, 1, 3, 4]].assign(iteration=[0, 1, 2, 3])) == 1


def test_frame_attrs_and_messages_exact():
    """Every fact a frame carries beside its rows, by hand: two blocks, one nested op, one access stamped
    after its block's recorded free and one exactly at a free."""
    ops = pd.DataFrame({"op_id": [1, 2, 3], "name": "op", "start_ns": [100, 120, 400], "end_ns": [300, 200, 500]})
    blocks = pd.DataFrame({"block_id": [1, 2, 3], "device": [DEVICE, "cpu", DEVICE], "size": [64, 32, 16],
                           "alloc_ns": [0, 0, 0], "free_ns": [450, 500, 300]})
    # block 1: op 1 [100, 300], nested op 2 [120, 200] (starts before op 1 ends), op 3 stamped 500 > free 450;
    # block 2: one access by op 3 stamped 500, exactly at its free (inside its lifetime); one access of a
    # block nobody recorded (id 9)
    # block 3: its only access stamped at 400, after its free at 300
    acc = pd.DataFrame({"block_id": [1, 1, 1, 2, 9, 3], "t_ns": [100, 120, 500, 500, 400, 400],
                        "op_id": [1, 2, 3, 3, 3, 3], "is_write": [False, False, True, True, False, False]})
    trace = Trace.from_tables(blocks, acc, ops)
    iv = access_intervals(trace)
    from memlens.analysis.clock import clock_of
    assert iv.attrs == {"accesses_outside_lifetime": 2, "overlapping_ops": 1, "accesses_of_unknown_blocks": 1,
                        "trace_span_ns": (0, 500), "clock": clock_of(trace), "steady_state": False,
                        "iteration": None, "period_ns": None, "window_ns": None, "iteration_source": None}
    rows = iv[["block_id", "kind", "start_ns", "end_ns"]].astype({"kind": str}).values.tolist()
    # block 1's lifetime widened to the write at 500; the nested op's interval is 0 at its start
    assert rows == [[1, "alloc_to_first", 0, 100], [1, "access_to_access", 120, 120],
                    [1, "access_to_access", 200, 400], [1, "last_to_free", 500, 500],
                    [2, "alloc_to_first", 0, 400], [2, "last_to_free", 500, 500],
                    [3, "alloc_to_first", 0, 400], [3, "last_to_free", 400, 400]]
    assert access_intervals(trace, device="cpu").attrs["accesses_of_unknown_blocks"] == 0
    its = pd.DataFrame({"iteration": [3, 4, 5], "start_ns": [0, 150, 300], "end_ns": [150, 300, 500],
                        "source": "marker"})
    cyc = access_intervals(trace, steady_state=True, iteration=4, iterations=its)
    assert {k: cyc.attrs[k] for k in ("steady_state", "iteration", "period_ns", "window_ns", "iteration_source",
                                      "period_source", "wraps_beyond_recording")} == {
        "steady_state": True, "iteration": 4, "period_ns": 150, "window_ns": (150, 300),
        "iteration_source": "marker", "period_source": "next iteration", "wraps_beyond_recording": 0}
    from memlens.analysis.ati_intervals import cycle_window, op_end_times, period_window
    assert cycle_window(trace, its, None) == (300, 501, 201, "trace end")  # span 201 > 150
    assert period_window(trace, its, 4) == (150, 300, 150) and period_window(trace, its, None) == (300, 501, 201)
    # op 3 is [400, 500]; op 8 is unknown: its access sits at its stamp
    assert op_end_times(trace, np.array([3, 8, 1]), np.array([400, 77, 100])).tolist() == [500, 77, 300]
    tie = its.assign(start_ns=[0, 99, 300])  # previous period 201 == span 201: the recorded span is kept
    assert cycle_window(trace, tie, None) == (300, 501, 201, "trace end")
    longer = its.assign(start_ns=[0, 98, 300])  # previous period 202 > span 201
    assert cycle_window(trace, longer, None) == (300, 502, 202, "previous iteration")
    with pytest.raises(Exception) as err:
        access_intervals(trace, iteration=7, iterations=its)
    assert str(err.value).endswith("iteration 7 is not in the trace (3 iterations, marker: 3, 4, 5)")
    ten = pd.DataFrame({"iteration": np.arange(10), "start_ns": np.arange(10) * 50, "end_ns": np.arange(1, 11) * 50,
                        "source": ["optimizer"] + ["marker"] * 9})
    with pytest.raises(Exception) as err:
        access_intervals(trace, iteration=11, iterations=ten)
    assert str(err.value).endswith("(10 iterations, optimizer: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9)")
    with pytest.raises(Exception) as err:
        access_intervals(Trace.from_tables(blocks, acc.iloc[:0], ops))
    assert str(err.value).endswith(
        "has none: CUDA memory snapshots, Kineto traces and memory timelines record only allocations and frees. "
        "Record the run with memlens.record (or `memlens record`) to get accesses; lifetime-based analyses "
        "(peak, iterations, fragmentation) still work on this trace.")


def test_dense_ids_far_from_zero():
    from memlens.analysis.ati_intervals import block_rows
    ids = (1 << 40) + np.array([3, 0, 2], np.int64)
    assert block_rows(ids, (1 << 40) + np.array([0, 1, 2, 3], np.int64)).tolist() == [1, -1, 2, 0]


# ---- swap plans: every reported fact by hand ----------------------------------------------------------------
def _two_block_trace() -> Trace:
    """X (1 MB) read by ops [0, 100] and [1100, 1200], W (500 kB) alive [400, 700): the peak 1.5 MB is there."""
    ops = pd.DataFrame({"op_id": [1, 2], "name": "op", "start_ns": [0, 1100], "end_ns": [100, 1200]})
    blocks = pd.DataFrame({"block_id": [1, 2], "device": DEVICE, "size": [1_000_000, 500_000],
                           "alloc_ns": [0, 400], "free_ns": [1300, 700]})
    acc = pd.DataFrame({"block_id": [1, 1], "t_ns": [0, 1200], "op_id": [1, 2], "is_write": [False, True]})
    return Trace.from_tables(blocks, acc, ops)


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
    its = _iterations([0, 600, 1100], 1300)
    monkeypatch.setattr(iterations_module, "split_iterations", lambda _trace: its)
    fast = BandwidthModel(h2d_bytes_per_s=1e13, d2h_bytes_per_s=1e13, latency_ns=0.0)
    plan = plan_swaps(trace, bandwidth=fast, min_size=0, steady_state=True)
    # iterations of 600, 500 and a last 201 ns: the middle one, which has a successor
    assert (plan.iteration, plan.period_ns, plan.window_ns) == (1, 500, (600, 1100))
