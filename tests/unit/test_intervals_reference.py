"""Intervals, steady-state wraps and the cycle helpers' exact values against brute-force references.

Small random traces (hypothesis) are built with ops of known edges; every expectation is recomputed here or
in _interval_refs, block by block and instant by instant, from the definition, not from memlens:
- an ATI runs from the END of the op of one access to the START of the op of the next, whatever the
  accesses' own stamps (a write is stamped at its op's end);
- alloc -> first access ends at the first op's start (0 when that op made the block), last access -> free
  starts at the last op's end (0 when the block was freed inside it);
- an interval wraps when it crosses an iteration start b: start < b <= end.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from _interval_refs import (DEVICE, SETTINGS, iterations_at, reference_events, reference_intervals,  # noqa: E402
                            reference_span, traces)
from memlens.analysis.ati import access_intervals  # noqa: E402
from memlens.trace import Trace  # noqa: E402


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


def _two_op_intervals(op_edges: tuple[list[int], list[int]], block: tuple[int, int, int, int],
                      stamps: list[int], writes: list[bool]) -> tuple[pd.DataFrame, list[list]]:
    """access_intervals of a hand-made trace: ops 1 and 2 with (starts, ends) ns; one block (id, size bytes,
    alloc ns, free ns) accessed once by each op, stamped `stamps` ns; and its (kind, start, end) rows."""
    block_id, size, alloc, free = block
    ops = pd.DataFrame({"op_id": [1, 2], "name": "op", "start_ns": op_edges[0], "end_ns": op_edges[1]})
    blocks = pd.DataFrame({"block_id": [block_id], "device": DEVICE, "size": [size], "alloc_ns": [alloc],
                           "free_ns": [free]})
    acc = pd.DataFrame({"block_id": [block_id] * 2, "t_ns": stamps, "op_id": [1, 2], "is_write": writes})
    iv = access_intervals(Trace.from_tables(blocks, acc, ops))
    return iv, iv[["kind", "start_ns", "end_ns"]].astype({"kind": str}).values.tolist()


def test_a_write_next_ends_the_interval_at_its_op_start():
    """Hand-made: op A [100, 150] reads X; op B [400, 700] writes X (stamped 700). The ATI is 150 -> 400."""
    _, got = _two_op_intervals(([100, 400], [150, 700]), (5, 4096, 50, 900), [100, 700], [False, True])
    assert got == [["alloc_to_first", 50, 100], ["access_to_access", 150, 400], ["last_to_free", 700, 900]]


def test_first_access_by_the_op_that_made_the_block_is_not_idle():
    """Op [100, 200] allocates Y at 120 and writes it (stamped 200): alloc -> first access is 0 at the alloc."""
    iv, got = _two_op_intervals(([100, 300], [200, 350]), (1, 64, 120, 400), [200, 300], [True, False])
    assert got == [["alloc_to_first", 120, 120], ["access_to_access", 200, 300], ["last_to_free", 350, 400]]
    assert iv.attrs["accesses_outside_lifetime"] == 0


# ---- steady state ----------------------------------------------------------------------------------------

def reference_cycle(trace: Trace, starts: list[int], k: int | None, steady: bool) -> tuple[list[tuple], int]:
    """The intervals of iteration k (block, kind, start, end, truncated, wraps) and its period, by hand;
    k None: every interval of the recording, the last iteration's period."""
    lo, hi = reference_span(trace)
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
    rows = []
    for b, kind, s, e, trunc in reference_intervals(trace):
        wraps = kind == "access_to_access" and any(s < x <= e for x in starts[1:])
        if steady and k == len(starts) - 1 and kind == "last_to_free" and trunc and w0 <= s < w1:
            blk = trace.blocks.set_index("block_id").loc[b]
            alive_before = pd.isna(blk["alloc_ns"]) or int(blk["alloc_ns"]) < w0
            firsts = [start for start, _ in reference_events(trace, b) if w0 <= start < w1]
            if alive_before and firsts:
                kind, e, trunc, wraps = "access_to_access", max(min(firsts) + period, s), False, True
        if not whole and not (w0 <= s < w1):
            continue
        if not whole and not steady and (e > w1 or wraps):
            continue
        rows.append((b, kind, s, e, trunc, wraps))
    return sorted(rows), period


def reference_steady_iteration(starts: list[int], hi: int) -> int:
    """The default steady iteration by its rule, in plain Python: not the first; not shorter than half the
    median period of the others (a period is start to next start, the last one's is its recorded span to
    `hi`); preferably one whose successor was recorded; the last such."""
    n = len(starts)
    if n == 1:
        return 0
    dur = [b - a for a, b in zip(starts, starts[1:])] + [hi - starts[-1]]
    rest = sorted(dur[1:])
    median = (rest[(len(rest) - 1) // 2] + rest[len(rest) // 2]) / 2
    long_enough = [pos for pos in range(1, n) if dur[pos] >= 0.5 * median]
    complete = [pos for pos in long_enough if pos < n - 1]
    return complete[-1] if complete else long_enough[-1] if long_enough else n - 1


@SETTINGS
@given(traces(max_ops=12), st.data())
def test_steady_state_wraps_equal_the_definition(trace, data):
    ops = trace.ops
    lo, hi = reference_span(trace)
    op_starts = ops["start_ns"].astype(int).tolist()
    # iteration starts at op starts (an access starting exactly at a boundary) or between ops
    picks = sorted(set(data.draw(st.lists(st.sampled_from(op_starts[1:] + [s + 1 for s in op_starts[:-1]]),
                                          min_size=1, max_size=3))))
    starts = [op_starts[0]] + [p for p in picks if p > op_starts[0]]
    its = iterations_at(starts, hi)
    k = data.draw(st.one_of(st.none(), st.integers(0, len(starts) - 1)))
    steady = data.draw(st.booleans()) or k is None
    iv = access_intervals(trace, steady_state=steady, iteration=k, iterations=its)
    # without k, the steady state is one iteration: the default steady one (the last after the warm-up)
    ref_k = reference_steady_iteration(starts, hi) if k is None else k
    expected, period = reference_cycle(trace, starts, ref_k, steady)
    assert iv.attrs["iteration"] == ref_k and iv.attrs["iteration_default"] == (k is None)
    assert iv.attrs["period_ns"] == period
    assert _rows(iv, ("wraps",)) == expected


def test_a_next_access_at_the_iteration_start_wraps():
    """Iterations start at 0 and 1000; the parameter is read by ops [100, 200] and [1000, 1100]: the interval
    200 -> 1000 ends exactly at the boundary and is a wrap-around of iteration 0."""
    ops = pd.DataFrame({"op_id": [1, 2], "name": "op", "start_ns": [100, 1000], "end_ns": [200, 1100]})
    blocks = pd.DataFrame({"block_id": [1], "device": DEVICE, "size": [64], "alloc_ns": [None], "free_ns": [None]})
    acc = pd.DataFrame({"block_id": [1, 1], "t_ns": [100, 1000], "op_id": [1, 2], "is_write": False})
    trace = Trace.from_tables(blocks.astype({"alloc_ns": "Int64", "free_ns": "Int64"}), acc, ops)
    its = iterations_at([0, 1000], 1100)
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
    its = iterations_at([0, 1000], 1250)
    first = access_intervals(trace, steady_state=True, iteration=0, iterations=its)
    assert not first["wraps"].any()
    last = access_intervals(trace, steady_state=True, iteration=1, iterations=its)
    # block 2 is accessed in the last iteration: [1150, 1200] inside, then 1250 -> 1100 + period (1000)
    assert last[last["wraps"]][["block_id", "start_ns", "end_ns"]].values.tolist() == [[2, 1250, 2100]]
    invented = last[last["wraps"]].iloc[0]
    assert invented["kind"] == "access_to_access" and not invented["truncated"] and invented["length_ns"] == 850
    assert last.attrs["wraps_beyond_recording"] == 1 and first.attrs["wraps_beyond_recording"] == 0
    # steady state without an iteration: the default one, iteration 1 (iteration 0 is the warm-up), and
    # only its intervals (none of the warm-up's)
    default = access_intervals(trace, steady_state=True, iterations=its)
    assert default.attrs["iteration"] == 1 and default.attrs["iteration_default"]
    assert default.attrs["window_ns"] == (1000, 2000)
    assert default[["block_id", "start_ns", "end_ns", "wraps"]].values.tolist() == \
        last[["block_id", "start_ns", "end_ns", "wraps"]].values.tolist()
    assert (default["start_ns"] >= 1000).all()
    assert last.attrs["period_source"] == "previous iteration" and last.attrs["period_ns"] == 1000


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
    its = iterations_at([100, 400, 700], 1000)
    assert cycle_window(trace, its, 0) == (100, 400, 300, "next iteration")
    assert cycle_window(trace, its, 2) == (700, 1001, 301, "trace end")  # span 301 > previous 300
    its = iterations_at([100, 400, 900], 1000)
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
    from memlens.trace import clock_of
    assert iv.attrs == {"accesses_outside_lifetime": 2, "overlapping_ops": 1, "accesses_of_unknown_blocks": 1,
                        "trace_span_ns": (0, 500), "clock": clock_of(trace), "steady_state": False,
                        "iteration": None, "iteration_default": False, "period_ns": None, "window_ns": None,
                        "iteration_source": None}
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
