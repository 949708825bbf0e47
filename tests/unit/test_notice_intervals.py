"""Interval edges at exact boundary instants, by hand and by brute force with boundary-seeking draws.

Each hand-made case is aimed at one plausible bug (named in its docstring as "mutant"): the instants sit
exactly on an iteration start, or an access's stamp lies outside its op's edges (a recorder's clock skew).
Expectations are computed by hand from the definition: an ATI runs from the end of one access's op to the
start of the next; an access's op edges are widened to cover its own stamp; iteration k is
``[start_k, start_k + period)`` and an interval belongs to the iteration its start falls in.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from _interval_refs import DEVICE, SETTINGS, iterations_at, reference_intervals, reference_span, traces  # noqa: E402
from memlens.analysis.ati import access_intervals  # noqa: E402
from memlens.trace import Trace  # noqa: E402
from test_intervals_reference import _rows, reference_cycle  # noqa: E402


def _trace(ops: list[tuple[int, int, int]], blocks: list[tuple[int, object, object]],
           accesses: list[tuple[int, int, int, bool]]) -> Trace:
    """ops (op_id, start, end); blocks (block_id, alloc, free; None = not recorded); accesses (block_id,
    op_id, stamp, is_write). Every block is 64 bytes on one device."""
    op = pd.DataFrame(ops, columns=["op_id", "start_ns", "end_ns"]).assign(name="op")
    blk = pd.DataFrame(blocks, columns=["block_id", "alloc_ns", "free_ns"]).assign(device=DEVICE, size=64)
    blk = blk.astype({"alloc_ns": "Int64", "free_ns": "Int64"})
    acc = pd.DataFrame(accesses, columns=["block_id", "op_id", "t_ns", "is_write"])
    return Trace.from_tables(blk, acc, op)


def _table(iv: pd.DataFrame) -> list[list]:
    cols = ["block_id", "kind", "start_ns", "end_ns", "truncated", "wraps"]
    return sorted(iv[cols].astype({"kind": str}).values.tolist())


def test_a_write_stamped_after_its_op_end_starts_the_next_interval_at_its_stamp():
    """Op A [100, 150] writes X, stamped 180 (after A's end: skew); op B [400, 500] reads X, stamped 390
    (before B's start). The op edges widen to the stamps: the ATI is 180 -> 390, not 150 -> 400.
    Mutant killed: `access_op_edges` returning the op's own end (dropping ``np.maximum(op_end, t_ns)``), or
    its own start (dropping ``np.minimum(op_start, t_ns)``)."""
    t = _trace([(1, 100, 150), (2, 400, 500)], [(5, 50, 900)], [(5, 1, 180, True), (5, 2, 390, False)])
    iv = access_intervals(t)
    assert _table(iv) == [[5, "access_to_access", 180, 390, False, False],
                          [5, "alloc_to_first", 50, 100, False, False],
                          [5, "last_to_free", 500, 900, False, False]]
    assert iv.attrs["accesses_outside_lifetime"] == 0


def test_an_access_stamped_after_the_free_widens_the_lifetime_to_its_stamp():
    """Block freed at 450, but op B [400, 500] reads it stamped 470: the lifetime widens to 470 (skew, counted
    once in ``accesses_outside_lifetime``); last -> free is 0 ns at 500 (the free lies inside B, widened).
    Mutant killed: the widening ``np.maximum(end, last_acc)`` removed (free stays 450: 450 -> 450)."""
    t = _trace([(1, 100, 150), (2, 400, 500)], [(5, 50, 450)], [(5, 1, 100, False), (5, 2, 470, False)])
    iv = access_intervals(t)
    # by hand: free = max(450, 470) = 470; last_to_free = [min(500, 470), 470]
    assert _table(iv) == [[5, "access_to_access", 150, 400, False, False],
                          [5, "alloc_to_first", 50, 100, False, False],
                          [5, "last_to_free", 470, 470, False, False]]
    assert iv.attrs["accesses_outside_lifetime"] == 1


def test_a_block_allocated_exactly_at_the_iteration_start_gets_no_invented_wrap():
    """Iterations start at 0 and 1000; only iteration 1 ends the recording (period 1000 from iteration 0).
    Block 1 is allocated at 1000 exactly, block 2 at 999; both are read by ops [1100, 1200] and [1500, 1600]
    and never freed. Only block 2 lived across the whole window, so only it gets the wrap-around 1600 -> 2100
    (its first access 1100 plus the period). Block 1's alloc edge starts exactly at the window start and is in it.
    Mutants killed: ``alloc < w0`` -> ``alloc <= w0`` (block 1 would wrap too); ``start >= w0`` -> ``>``
    (block 1's alloc edge would leave the window)."""
    t = _trace([(1, 1100, 1200), (2, 1500, 1600)], [(1, 1000, None), (2, 999, None)],
               [(1, 1, 1100, False), (1, 2, 1500, False), (2, 1, 1100, False), (2, 2, 1500, False)])
    iv = access_intervals(t, steady_state=True, iteration=1, iterations=iterations_at([0, 1000], 1600))
    assert iv.attrs["period_ns"] == 1000 and iv.attrs["window_ns"] == (1000, 2000)
    assert _table(iv) == [[1, "access_to_access", 1200, 1500, False, False],
                          [1, "alloc_to_first", 1000, 1100, False, False],
                          [1, "last_to_free", 1600, 1600, True, False],
                          [2, "access_to_access", 1200, 1500, False, False],
                          [2, "access_to_access", 1600, 2100, False, True]]
    assert iv.attrs["wraps_beyond_recording"] == 1


def test_a_free_exactly_at_the_next_iteration_start_stays_in_the_iteration():
    """Iterations start at 0 and 1000. Block 3 (alloc 50) is read by op [100, 200] and freed at 1000, exactly
    when iteration 1 starts: its last -> free edge [200, 1000] lies within iteration 0 ``[0, 1000)`` up to its
    end. Block 4, freed at 1001, runs past the window and is left out of iteration 0.
    Mutant killed: ``end <= w1`` -> ``end < w1`` (block 3's free edge would be dropped)."""
    t = _trace([(1, 100, 200), (2, 1100, 1200)], [(3, 50, 1000), (4, 50, 1001)],
               [(3, 1, 100, False), (4, 1, 100, False)])
    iv = access_intervals(t, iteration=0, iterations=iterations_at([0, 1000], 1200))
    assert _table(iv) == [[3, "alloc_to_first", 50, 100, False, False],
                          [3, "last_to_free", 200, 1000, False, False],
                          [4, "alloc_to_first", 50, 100, False, False]]


def test_an_alloc_exactly_at_an_iteration_start_belongs_to_that_iteration():
    """Iterations start at 0 and 1000; block 7 is allocated at 1000 and read by op [1000, 1050] (the op that
    made it): its alloc edge [1000, 1000] is in iteration 1, none of its intervals in iteration 0.
    Mutant killed: ``start < w1`` -> ``start <= w1`` (the edge would also count in iteration 0)."""
    t = _trace([(1, 10, 20), (2, 1000, 1050)], [(7, 1000, 1100)], [(7, 2, 1050, True)])
    its = iterations_at([0, 1000], 1100)
    assert _table(access_intervals(t, iteration=0, iterations=its)) == []
    assert _table(access_intervals(t, iteration=1, iterations=its)) == [
        [7, "alloc_to_first", 1000, 1000, False, False], [7, "last_to_free", 1050, 1100, False, False]]


@pytest.mark.parametrize("write_first", [False, True])
def test_a_read_and_a_write_by_one_op_are_one_access_widened_to_both_stamps(write_first):
    """Op A [100, 150] reads X (stamped 100, at its start) and writes it stamped 180 (after A's end: skew);
    op B [400, 500] reads X at its start. A touches X once: its place is [100, 180], so there is one ATI,
    180 -> 400, whichever of A's two rows comes first in the table.
    Mutant killed: merging an op's rows by keeping the first row's edges (150 -> 400 when the read is
    listed first)."""
    rows = [(5, 1, 100, False), (5, 1, 180, True)]
    t = _trace([(1, 100, 150), (2, 400, 500)], [(5, 50, 900)],
               (rows[::-1] if write_first else rows) + [(5, 2, 400, False)])
    assert _table(access_intervals(t)) == [[5, "access_to_access", 180, 400, False, False],
                                           [5, "alloc_to_first", 50, 100, False, False],
                                           [5, "last_to_free", 500, 900, False, False]]


def test_a_read_stamped_at_the_iteration_start_before_its_op_is_not_a_second_access():
    """Iterations start at 0 and 1000. Op A [1005, 1050] reads X stamped 1000 (exactly the iteration start,
    5 ns before A began: skew) and writes X stamped 1050; op B [1200, 1300] reads X at 1200. X lives
    [0, 2000]. A's place is [1000, 1050]: one ATI 1050 -> 1200 and no zero-length interval between A's read
    and A's write. In iteration 1 (window [1000, 2001): the last iteration, its recorded span 1001 ns is
    longer than iteration 0's 1000) the alloc edge [0, 1000] is absent, it begins in iteration 0.
    Mutant killed: one event per row (A counted twice: an extra zero-length ATI at 1005)."""
    t = _trace([(1, 1005, 1050), (2, 1200, 1300)], [(5, 0, 2000)],
               [(5, 1, 1000, False), (5, 1, 1050, True), (5, 2, 1200, False)])
    iv = access_intervals(t)
    assert _table(iv) == [[5, "access_to_access", 1050, 1200, False, False],
                          [5, "alloc_to_first", 0, 1000, False, False],
                          [5, "last_to_free", 1300, 2000, False, False]]
    assert iv.attrs["overlapping_ops"] == 0 and iv.attrs["accesses_outside_lifetime"] == 0
    its = iterations_at([0, 1000], 2000)
    one = access_intervals(t, iteration=1, iterations=its)
    assert one.attrs["window_ns"] == (1000, 2001)
    assert _table(one) == [[5, "access_to_access", 1050, 1200, False, False],
                           [5, "last_to_free", 1300, 2000, False, False]]
    assert _table(access_intervals(t, iteration=0, iterations=its)) == [
        [5, "alloc_to_first", 0, 1000, False, False]]


def test_the_wrap_of_a_block_returns_to_its_skewed_first_access_in_the_window():
    """Iterations start at 0 and 1000 (an op [10, 20] opens the recording); parameter P (never allocated or
    freed in the recording: its alloc edge [10, 1000] begins in iteration 0) is read by op A [1005, 1050] stamped 1000 (the iteration start, before A: skew) and written by A at 1050, then read
    by op B [1200, 1300]. The last iteration's period is iteration 0's 1000 ns (its own span, 1000 -> 1300,
    is 301 ns), so P's wrap-around runs from B's end 1300 to A's place one period later: 1000 + 1000 = 2000,
    not 1005 + 1000.
    Mutant killed: the first access in the window taken from one row's op start instead of the op's
    widened place (an end of 2005)."""
    t = _trace([(0, 10, 20), (1, 1005, 1050), (2, 1200, 1300)], [(9, None, None)],
               [(9, 1, 1000, False), (9, 1, 1050, True), (9, 2, 1200, False)])
    its = iterations_at([0, 1000], 1300)
    iv = access_intervals(t, steady_state=True, iteration=1, iterations=its)
    assert iv.attrs["period_ns"] == 1000 and iv.attrs["window_ns"] == (1000, 2000)
    assert _table(iv) == [[9, "access_to_access", 1050, 1200, False, False],
                          [9, "access_to_access", 1300, 2000, False, True]]
    from memlens.analysis.ati_intervals import first_access_in_window
    assert first_access_in_window(t, (1000, 2000)).to_dict() == {9: 1000}
    assert first_access_in_window(t, (1001, 2000)).to_dict() == {9: 1200}  # A began at 1000: not in it


def test_accesses_stamped_exactly_at_their_op_edges_and_an_op_starting_at_the_iteration_start():
    """Iterations start at 0 and 1000. Op A [400, 600] reads X stamped 400 (its start) and writes X stamped
    600 (its end); op B starts exactly at 1000 and reads X at 1000. X is allocated at 400 inside A (A made it)
    and freed at 1000 exactly. The ATI 600 -> 1000 ends on the boundary: it wraps in steady state and is
    left out of iteration 0 without it (it reaches iteration 1); B's read is a zero-length last -> free at
    the free.
    Mutants killed: ``start < b <= end`` -> ``start < b < end`` (no wrap); the alloc edge not clipped."""
    t = _trace([(1, 400, 600), (2, 1000, 1000)], [(3, 400, 1000)],
               [(3, 1, 400, False), (3, 1, 600, True), (3, 2, 1000, False)])
    its = iterations_at([0, 1000], 1000)
    linear = access_intervals(t)
    assert _table(linear) == [[3, "access_to_access", 600, 1000, False, False],
                              [3, "alloc_to_first", 400, 400, False, False],
                              [3, "last_to_free", 1000, 1000, False, False]]
    steady = access_intervals(t, steady_state=True, iteration=0, iterations=its)
    assert _table(steady) == [[3, "access_to_access", 600, 1000, False, True],
                              [3, "alloc_to_first", 400, 400, False, False]]
    assert _table(access_intervals(t, iteration=0, iterations=its)) == [
        [3, "alloc_to_first", 400, 400, False, False]]


def test_an_op_listed_write_first_starts_at_its_read_stamped_before_it():
    """Op 1 [100, 150] writes X (row first, stamped 150) and reads it stamped 95 (5 ns before op 1 began:
    skew); op 2 [400, 500] reads X. Op 1's place is [95, 150]: alloc 0 -> 95, ATI 150 -> 400.
    Mutant killed: the merged start taken from the op's first row (0 -> 100)."""
    t = _trace([(1, 100, 150), (2, 400, 500)], [(5, 0, 900)],
               [(5, 1, 150, True), (5, 1, 95, False), (5, 2, 400, False)])
    assert _table(access_intervals(t)) == [[5, "access_to_access", 150, 400, False, False],
                                           [5, "alloc_to_first", 0, 95, False, False],
                                           [5, "last_to_free", 500, 900, False, False]]


def test_the_op_that_makes_a_block_and_touches_it_twice_does_not_widen_its_lifetime():
    """Op 1 [100, 200] allocates Y at 120, reads it (stamped 150) and writes it (stamped 200); op 2
    [300, 350] reads it; Y is freed at 400. The lifetime widens to stamps only, never to the op's start:
    alloc -> first is 0 at 120 and no access lies outside the lifetime.
    Mutant killed: a merged event's stamps taken from its widened op edges (the lifetime from 100)."""
    t = _trace([(1, 100, 200), (2, 300, 350)], [(7, 120, 400)],
               [(7, 1, 150, False), (7, 1, 200, True), (7, 2, 300, False)])
    iv = access_intervals(t)
    assert _table(iv) == [[7, "access_to_access", 200, 300, False, False],
                          [7, "alloc_to_first", 120, 120, False, False],
                          [7, "last_to_free", 350, 400, False, False]]
    assert iv.attrs["accesses_outside_lifetime"] == 0


def test_without_an_ops_table_an_op_spans_its_own_stamps():
    """No ops recorded (an import that has accesses but no op edges): op 1 reads X at 100 and writes it at 150,
    op 2 reads X at 400. Op 1's place is its stamps [100, 150]: alloc 0 -> 100, one ATI 150 -> 400, 400 ->
    free 900. Mutant killed: the op edges looked up in an empty ops table (an IndexError)."""
    t = _trace([], [(5, 0, 900)], [(5, 1, 100, False), (5, 1, 150, True), (5, 2, 400, False)])
    assert _table(access_intervals(t)) == [[5, "access_to_access", 150, 400, False, False],
                                           [5, "alloc_to_first", 0, 100, False, False],
                                           [5, "last_to_free", 400, 900, False, False]]


def test_each_access_on_its_own_sits_between_its_op_edges_widened_to_its_stamp():
    """`access_op_edges`, row by row (no merging): op 3 [400, 500] stamped 390 (before it) and 450; op 8 is
    not in the table (its stamp 77 both ways); op 1 [100, 300] stamped 320 (after it)."""
    from memlens.analysis.ati_intervals import access_op_edges
    t = _trace([(1, 100, 300), (3, 400, 500)], [(5, 0, 900)], [(5, 1, 100, False)])
    start, end = access_op_edges(t, np.array([3, 3, 8, 1]), np.array([390, 450, 77, 320]))
    assert start.tolist() == [390, 400, 77, 100] and end.tolist() == [500, 500, 77, 320]


def test_ops_starting_together_are_ordered_by_end_whatever_the_row_order():
    """Ops 1 [100, 300] and 2 [100, 150] start together (2 nested in 1) and both touch X, op 2 twice (a read
    at 100, a write at 150); op 3 [400, 500] reads X; X lives [0, 900]. The rows come op 2, op 1, op 2. Events
    by (start, end): op 2 [100, 150], op 1 [100, 300], op 3: the ATIs are a zero-length overlap at 100 and
    300 -> 400; op 2 counts once.
    Mutants killed: the in-order shortcut trusting equal op starts without looking at the op ids (op 2's
    rows split: three events); no re-sort of events out of (start, end) order, or ties in start not ordered
    by end (150 -> 400 instead of 300 -> 400)."""
    t = _trace([(1, 100, 300), (2, 100, 150), (3, 400, 500)], [(5, 0, 900)],
               [(5, 2, 100, False), (5, 1, 100, False), (5, 2, 150, True), (5, 3, 400, False)])
    iv = access_intervals(t)
    assert _table(iv) == [[5, "access_to_access", 100, 100, False, False],
                          [5, "access_to_access", 300, 400, False, False],
                          [5, "alloc_to_first", 0, 100, False, False],
                          [5, "last_to_free", 500, 900, False, False]]
    assert iv.attrs["overlapping_ops"] == 1


def test_a_stamp_far_before_its_op_moves_the_op_before_an_earlier_one():
    """Op 1 [100, 150] reads X at 100; op 2 [300, 400] reads X stamped 90 (skew: before op 1 began). Op 2's
    place is [90, 400], so it comes first: alloc 0 -> 90, then op 1 starts inside op 2 (a zero-length overlap
    at 100), and the last access's op (op 1) ends at 150 -> free 900. The rows are in time order of the ops.
    Mutant killed: no re-sort after widening (0 -> 100, an ATI 150 -> 90 clipped to 90, and 400 -> 900)."""
    t = _trace([(1, 100, 150), (2, 300, 400)], [(5, 0, 900)], [(5, 1, 100, False), (5, 2, 90, False)])
    assert _table(access_intervals(t)) == [[5, "access_to_access", 100, 100, False, False],
                                           [5, "alloc_to_first", 0, 90, False, False],
                                           [5, "last_to_free", 150, 900, False, False]]


# ---- hypothesis: boundary instants and skewed stamps drawn on purpose ---------------------------------------

@st.composite
def skewed_traces(draw):
    """A trace from `traces` whose access stamps are moved off their op's edges by up to 50 ns either way,
    some exactly onto the op's edges or one past them, or onto the block's alloc/free (clock skew). Both
    rows of an op that reads and writes a block are moved, each its own way. The access rows come in a
    drawn order (recorders write them in time order, imports in any)."""
    t = draw(traces(max_ops=8, max_blocks=4))
    acc = t.accesses.copy()
    if len(acc) == 0:
        return t
    ops = t.ops.set_index("op_id")
    blk = t.blocks.set_index("block_id")
    stamps = acc["t_ns"].astype(np.int64).to_numpy().copy()
    for i in range(len(acc)):
        how = draw(st.sampled_from(["keep", "skew", "op_end", "op_start", "alloc", "free"]))
        op = ops.loc[int(acc["op_id"].iloc[i])]
        b = blk.loc[int(acc["block_id"].iloc[i])]
        if how == "skew":
            stamps[i] += draw(st.integers(-50, 50))
        elif how == "op_end":
            stamps[i] = int(op["end_ns"]) + draw(st.integers(0, 3))
        elif how == "op_start":
            stamps[i] = int(op["start_ns"]) - draw(st.integers(0, 3))
        elif how == "alloc" and not pd.isna(b["alloc_ns"]):
            stamps[i] = int(b["alloc_ns"]) - draw(st.integers(0, 1))
        elif how == "free" and not pd.isna(b["free_ns"]):
            stamps[i] = int(b["free_ns"]) + draw(st.integers(0, 1))
    acc["t_ns"] = stamps
    order = draw(st.sampled_from(["time", "op", "shuffled"]))
    if order == "time":
        acc = acc.sort_values("t_ns", kind="stable")
    elif order == "shuffled":
        acc = acc.iloc[draw(st.permutations(list(range(len(acc)))))]
    return Trace.from_tables(t.blocks, acc.reset_index(drop=True), t.ops)


@SETTINGS
@given(skewed_traces())
def test_skewed_stamps_equal_the_op_edge_definition(trace):
    iv = access_intervals(trace)
    assert _rows(iv) == reference_intervals(trace)
    assert (iv["length_ns"] >= 0).all()
    # one ATI per pair of consecutive ops touching a block, however many rows each op has
    n_ops = trace.accesses.groupby("block_id")["op_id"].nunique()
    ati = iv[iv["kind"] == "access_to_access"].groupby("block_id").size()
    assert ati.reindex(n_ops.index, fill_value=0).tolist() == [max(n - 1, 0) for n in n_ops.tolist()]


@SETTINGS
@given(skewed_traces(), st.data())
def test_iteration_starts_on_skewed_stamps_equal_the_definition(trace, data):
    """Iteration starts drawn from the skewed stamps themselves (and one past them), op starts and ends: an
    access stamped exactly at an iteration start, before its op, belongs with its op's other rows."""
    lo, hi = reference_span(trace)
    instants = sorted({int(v) + d for v in pd.concat([trace.accesses["t_ns"], trace.ops["start_ns"],
                                                      trace.ops["end_ns"]])
                       for d in (0, 1) if lo < int(v) + d <= hi})
    if not instants:
        return
    picks = sorted(set(data.draw(st.lists(st.sampled_from(instants), min_size=1, max_size=3))))
    starts = [lo] + picks
    its = iterations_at(starts, hi)
    k = data.draw(st.integers(0, len(starts) - 1))
    steady = data.draw(st.booleans())
    iv = access_intervals(trace, steady_state=steady, iteration=k, iterations=its)
    expected, period = reference_cycle(trace, starts, k, steady)
    assert iv.attrs["period_ns"] == period
    assert _rows(iv, ("wraps",)) == expected


@SETTINGS
@given(traces(max_ops=10), st.data())
def test_iteration_starts_on_allocs_frees_and_op_ends_equal_the_definition(trace, data):
    """Iteration starts drawn from the instants where an off-by-one matters: allocs, frees, op ends and op
    starts (and one past each)."""
    lo, hi = reference_span(trace)
    b = trace.blocks
    instants = sorted({int(v) + d for v in pd.concat([b["alloc_ns"].dropna(), b["free_ns"].dropna(),
                                                      trace.ops["end_ns"], trace.ops["start_ns"]])
                       for d in (0, 1) if lo < int(v) + d <= hi})
    if not instants:
        return
    picks = sorted(set(data.draw(st.lists(st.sampled_from(instants), min_size=1, max_size=3))))
    starts = [lo] + [p for p in picks if p > lo]
    its = iterations_at(starts, hi)
    k = data.draw(st.integers(0, len(starts) - 1))
    steady = data.draw(st.booleans())
    iv = access_intervals(trace, steady_state=steady, iteration=k, iterations=its)
    expected, period = reference_cycle(trace, starts, k, steady)
    assert iv.attrs["period_ns"] == period
    assert _rows(iv, ("wraps",)) == expected
