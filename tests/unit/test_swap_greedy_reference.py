"""The swap planner's greedy selections (memlens/swap/optimise.py) against hand-made cases and the rule written
out: the peak-greedy aimed at the moving peak instant, the priority greedy re-run step by step."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memlens.swap.optimise import (PRIORITIES, _Evaluator, priority_scores, select, select_by_priority,
                                   select_peak_greedy)
from test_swap_optimise_reference import cands_of, curve_of, periodic_curve_of


# ---- the peak-greedy: aimed at the current peak instant --------------------------------------------------------

def test_peak_greedy_follows_the_peak_as_it_moves():
    """live 100 on [10, 20), 90 on [30, 40), 10 elsewhere; A frees [9, 21), B [29, 41), 30 bytes each; limit 60.
    A takes the first peak to 70, the peak moves to [30, 40) and B takes it to 60; then the peak (70, at 10)
    has no cover left: [A, B], peak 70, each swap once."""
    curve = curve_of([0, 10, 20, 30, 40, 60], [10, 90, -90, 80, -80, -10])
    cands = cands_of([(8, 22, 1, 1, 30), (28, 42, 1, 1, 30)])
    sel = select(cands, curve, 60, "peak", 60)
    assert (sel.method, sel.chosen.tolist(), sel.peak, sel.stall_ns) == ("peak", [0, 1], 70, 0)


def test_peak_greedy_goes_past_eight_covers_that_do_not_help():
    """X (100 bytes) frees [310, 500) under the first peak (300 at [400, 410)); the second peak (250 at
    [520, 530)) is covered by eight 50-byte swaps idle [420, 590) and one 10-byte Z idle [505, 700). With X
    chosen, X's 100 ns copy-in must end by 600, so each eight's copy-in is moved to [495, 500): back before
    520, it frees nothing over the limit. The search goes on to Z (absent [510, 695)): [X, Z], peak 240."""
    curve = curve_of([0, 400, 410, 520, 530, 1000], [100, 200, -200, 150, -150, -100])
    rows = [(300, 600, 10, 100, 100)] + [(420, 590, 5, 5, 50)] * 8 + [(505, 700, 5, 5, 10)]
    sel = select_peak_greedy(cands_of(rows), curve, 150, 150)
    assert (sorted(sel.chosen.tolist()), sel.peak, sel.stall_ns) == ([0, 9], 240, 0)


def test_peak_greedy_window_ending_at_the_next_periods_peak_does_not_cover_it():
    """One period [0, 100): 60, 80 on [10, 40), the peak 100 on [40, 50), 60. C (10 bytes) is absent
    [110, 140), i.e. [10, 40) of the next period: back at 140 before the load rises to the peak, it cannot
    lower it, and the greedy (aimed at the peak only) takes nothing."""
    curve = periodic_curve_of([0, 10, 40, 50], [60, 20, 20, -40], 0, 100)
    cands = cands_of([(109, 141, 1, 1, 10)])
    assert select_peak_greedy(cands, curve, 70, 70).chosen.tolist() == []
    # the same window by the priorities: it lowers the load over the limit on [10, 40), so it is kept
    assert select_by_priority(cands, curve, 70, "doa", 70).chosen.tolist() == [0]


def test_peak_greedy_window_ending_at_the_peak_does_not_cover_it():
    """The same without a period: C is absent [9, 40), back before the load rises to the peak at 40."""
    curve = curve_of([0, 10, 40, 50, 100], [60, 20, 20, -40, -60])
    cands = cands_of([(8, 41, 1, 1, 10)])
    assert select_peak_greedy(cands, curve, 70, 70).chosen.tolist() == []
    assert select_by_priority(cands, curve, 70, "doa", 70).chosen.tolist() == [0]


def test_equal_priorities_take_the_larger_block_first():
    """Same DOA (44 ns): B (30 bytes, absent [8, 52)) before A (10 bytes, absent [9, 53)). B alone brings
    the 100 on [10, 50) to the limit 70, so A is never needed."""
    curve = curve_of([0, 10, 50], [10, 90, -100])
    cands = cands_of([(8, 54, 1, 1, 10), (7, 53, 1, 1, 30)])
    sel = select_by_priority(cands, curve, 70, "doa", 70)
    assert (sel.chosen.tolist(), sel.peak) == ([1], 70)


def test_peak_greedy_tries_the_longer_of_two_equal_covers_first():
    """X (absent [1, 69)) and Y (absent [41, 99)), 20 bytes each, both cover the overload [45, 55) and lower
    it the same: the longer window, X, is kept."""
    curve = curve_of([0, 45, 55, 100], [10, 90, -90, -10])
    cands = cands_of([(0, 70, 1, 1, 20), (40, 100, 1, 1, 20)])
    sel = select_peak_greedy(cands, curve, 90, 90)
    assert (sel.chosen.tolist(), sel.peak) == ([0], 80)


@pytest.mark.parametrize("periodic", [False, True])
def test_peak_greedy_window_starting_at_the_peak_covers_it(periodic):
    """The peak 100 on [40, 50): C leaves at 40 (after the rise: the peak instant keeps its level, the rest
    of [40, 50) drops to 90), so the greedy takes it for the overload it removes. Periodic: C leaves at 140,
    i.e. 40 of the next period."""
    t, d = [0, 40, 50, 100], [60, 40, -40, -60]
    if periodic:
        curve, cands = periodic_curve_of(t[:3], d[:3], 0, 100), cands_of([(139, 151, 1, 1, 10)])
    else:
        curve, cands = curve_of(t, d), cands_of([(39, 51, 1, 1, 10)])
    assert select_peak_greedy(cands, curve, 70, 70).chosen.tolist() == [0]


def test_an_unknown_priority_is_named():
    with pytest.raises(ValueError, match="unknown priority 'fastest'"):
        select(cands_of([(8, 22, 1, 1, 30)]), curve_of([0, 10, 20], [10, 90, -100]), 50, "fastest", 70)


def ref_priority_greedy(ev, score, goal, wdoa: bool):
    """The documented rule, written out: candidates by priority (then size, then position); a pick is kept when
    the overload above the goal drops and the stall does not grow; stop at the goal; then, latest first, drop
    each pick whose removal makes nothing worse."""
    order = sorted(range(len(score)), key=lambda k: (-score[k], -ev.z[k], k))
    chosen = []
    peak, over, stall, _ = ev(chosen)
    for k in order:
        if peak <= goal or (wdoa and score[k] <= 0):
            break
        p2, o2, s2, _ = ev(chosen + [k])
        if s2 <= stall and o2 < over:
            chosen, peak, over, stall = chosen + [k], p2, o2, s2
    for k in reversed(list(chosen)):
        p2, o2, s2, _ = ev([c for c in chosen if c != k])
        if s2 <= stall and p2 <= peak and o2 <= over:
            chosen, peak, over, stall = [c for c in chosen if c != k], p2, o2, s2
    return chosen, peak, stall


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 17, 23, 41])  # 17, 23, 41: a pick that leaves the overload as it
def test_priority_selection_matches_the_rule_written_out(seed):  # is must not be kept (it changes what follows)
    rng = np.random.default_rng(500 + seed)
    n = 24
    t = np.sort(rng.choice(np.arange(0, 300), n, replace=False))
    delta = rng.integers(-30, 60, n)
    delta[-1] = -int(np.cumsum(delta)[-2])
    curve = curve_of(t, delta)
    # slow copies on a few long windows: picks compete for the two copy streams
    cands = cands_of([(x, x + int(rng.integers(15, 90)), int(rng.integers(1, 12)), int(rng.integers(1, 12)),
                       int(rng.integers(1, 40))) for x in rng.integers(0, 260, 16)])
    live = np.cumsum(delta)
    for goal in (int(np.percentile(live, 50)), int(np.percentile(live, 85))):
        ev = _Evaluator(cands, curve, goal)
        scores = priority_scores(cands, curve, goal)
        for p in PRIORITIES:
            sel = select_by_priority(cands, curve, goal, p, goal)
            chosen, peak, stall = ref_priority_greedy(ev, scores[p].tolist(), goal, p == "wdoa")
            assert (sel.chosen.tolist(), sel.peak, sel.stall_ns) == (chosen, peak, stall)
