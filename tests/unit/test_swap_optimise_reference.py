"""The swap planner's selection (memlens/swap/optimise.py) against references written here: which candidates
can help (an instant-by-instant walk of the load), WDOA of windows past the period's end (folded by hand),
the pruning pass (every single removal re-simulated) and the goal used with a limit (hand-made cases)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memlens.swap import optimise
from memlens.swap.optimise import (PRIORITIES, Selection, _Evaluator, _prune, _select_among, priority_scores,
                                   select, select_by_priority, select_peak_greedy, useful_candidates)
from memlens.swap.periodic import PeriodicLoadCurve
from memlens.swap.schedule import LoadCurve, serial_schedule


def curve_of(t, delta) -> LoadCurve:
    """A LoadCurve with the given events (ns, bytes)."""
    c = LoadCurve.__new__(LoadCurve)
    c.t, c.delta = np.asarray(t, np.int64), np.asarray(delta, np.int64)
    return c


def periodic_curve_of(t, delta, w0, w1) -> PeriodicLoadCurve:
    """A PeriodicLoadCurve of the window [w0, w1): `t[0]` must be w0 (the carried level)."""
    c = PeriodicLoadCurve.__new__(PeriodicLoadCurve)
    c.t, c.delta = np.asarray(t, np.int64), np.asarray(delta, np.int64)
    c.w0, c.w1, c.period = int(w0), int(w1), int(w1) - int(w0)
    return c


def cands_of(rows) -> pd.DataFrame:
    """rows: (idle_from_ns, idle_to_ns, out_ns, in_ns, size) -> a candidates frame (doa = idle - out - in)."""
    df = pd.DataFrame(rows, columns=["idle_from_ns", "idle_to_ns", "out_ns", "in_ns", "size"]).astype(np.int64)
    df["doa_ns"] = df["idle_to_ns"] - df["idle_from_ns"] - df["out_ns"] - df["in_ns"]
    return df


def windows(rows):
    """Candidates whose absence window is exactly [a, b) (1 ns copies each way), size 1."""
    return cands_of([(a - 1, b + 1, 1, 1, 1) for a, b in rows])


# ---- useful_candidates against an instant-by-instant walk -------------------------------------------------

def values_at(t, live, x, first: bool):
    """Every level the load takes at instant x: the one in force (0 before the first event), plus, unless x is
    the window's first instant (the block is still there during the events at its release), the transient
    levels of the events at x."""
    in_force = [int(live[k]) for k in range(len(t)) if t[k] <= x][-1:] or [0]
    if first:
        return in_force
    return [int(live[k]) for k in range(len(t)) if t[k] == x] + in_force


def ref_useful(t, live, a, b, goal, wrap=None):
    """Does the load exceed `goal` at some instant of [a, b)? (`wrap` folds each instant into the period)."""
    for x in range(int(a), int(b)):
        y = wrap(x) if wrap else x
        if any(v > goal for v in values_at(t, live, y, x == a)):
            return True
    return False


def test_useful_boundaries_by_hand():
    # live 5 on [0, 10), 15 on [10, 20), 5 on [20, 30), 0 after: over the goal 10 exactly on [10, 20)
    curve = curve_of([0, 10, 20, 30], [5, 10, -10, -5])
    rows = [(0, 10),   # ends exactly where the overload starts
            (20, 30),  # starts exactly where it ends
            (19, 20), (9, 11), (0, 30),
            (10, 10), (15, 15), (25, 25),  # empty windows meet no instant, even inside the overload
            (-5, 5), (-5, 11)]
    got = useful_candidates(windows(rows), curve, 10).tolist()
    assert got == [False, False, True, True, True, False, False, False, False, True]
    # a level already high at the first event: nothing is allocated before it
    got = useful_candidates(windows([(0, 10), (0, 11), (10, 10)]), curve_of([10, 20], [50, -50]), 10).tolist()
    assert got == [False, True, False]


def test_useful_transients_at_equal_times():
    # two events at 10 ns: a transient 15 (over the goal 10) that lasts no time
    curve = curve_of([0, 10, 10, 20], [5, 10, -10, -5])
    rows = [(10, 20),  # released after the events at 10: present for the transient
            (5, 10),   # back before the events at 10
            (5, 11), (9, 10), (10, 11)]
    assert useful_candidates(windows(rows), curve, 10).tolist() == [False, False, True, False, False]


def test_useful_periodic_boundaries_by_hand():
    # one period [0, 100): 5 on [0, 40), 15 on [40, 60), 5 on [60, 100); goal 10
    curve = periodic_curve_of([0, 40, 60], [5, 10, -10], 0, 100)
    rows = [(100, 130),  # starts exactly at w1: folds to [0, 30)
            (130, 150),  # folds to [30, 50)
            (90, 140),   # wraps to [90, 100) + [0, 40): ends where the overload starts
            (90, 141),   # wraps past 40
            (60, 100), (35, 40), (59, 60),
            (60, 60), (50, 50), (150, 150), (100, 100),  # empty windows, late ones too
            (190, 245),  # late and wrapping: [90, 100) + [0, 45)
            (160, 230),  # late, [60, 100) + [0, 30)
            (100, 141)]  # at w1, folds to [0, 41)
    got = useful_candidates(windows(rows), curve, 10).tolist()
    assert got == [False, True, False, True, False, False, True, False, False, False, False, True, False, True]


@pytest.mark.parametrize("seed", range(12))
def test_useful_matches_the_walk(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    t = np.sort(rng.integers(0, 40, n))  # equal times included: transient levels
    delta = rng.integers(-20, 30, n)
    live = np.cumsum(delta)
    goal = int(rng.integers(0, 40))
    a = rng.integers(-5, 45, 40)
    b = a + rng.integers(0, 15, 40)
    got = useful_candidates(windows(list(zip(a.tolist(), b.tolist()))), curve_of(t, delta), goal)
    want = [ref_useful(t, live, x, y, goal) for x, y in zip(a, b)]
    assert got.tolist() == want


@pytest.mark.parametrize("seed", range(12))
def test_useful_periodic_matches_the_folded_walk(seed):
    rng = np.random.default_rng(100 + seed)
    w0, w1 = 10, 50
    period = w1 - w0
    inside = np.sort(rng.choice(np.arange(w0 + 1, w1), int(rng.integers(0, 10)), replace=False))
    t = np.concatenate([[w0], inside])
    delta = rng.integers(-20, 30, len(t))
    live = np.cumsum(delta)
    goal = int(rng.integers(0, 30))
    a = rng.integers(w0, w1 + period, 40)  # windows starting at/after w1 are the next period's
    b = a + rng.integers(0, period, 40)

    def wrap(x):
        return w0 + (x - w0) % period

    got = useful_candidates(windows(list(zip(a.tolist(), b.tolist()))), periodic_curve_of(t, delta, w0, w1), goal)
    assert got.tolist() == [ref_useful(t, live, x, y, goal, wrap) for x, y in zip(a, b)]


# ---- priority_scores: Zhang et al.'s DOA / AOA / WDOA ---------------------------------------------------------

# one period [0, 100): live 40 on [0, 30), 10 on [30, 50), 30 on [50, 70), 10 on [70, 100); against the goal 20
# (peak 40) the WDOA weight (live - 20) / 20 is 1, 0, 0.5, 0
WDOA_T, WDOA_D = [0, 30, 50, 70], [40, -30, 20, -20]


def test_wdoa_of_windows_past_the_period_end_by_hand():
    curve = periodic_curve_of(WDOA_T, WDOA_D, 0, 100)
    rows = [(110, 160),  # late: [10, 60) -> 20 + 5
            (190, 215),  # late and wrapping: [90, 100) + [0, 15) -> 15
            (10, 60), (90, 115),
            (100, 120),  # at w1: [0, 20)
            (140, 175)]  # late: [40, 75) -> 0.5 * 20
    scores = priority_scores(windows(rows), curve, 20)
    assert scores["wdoa"].tolist() == pytest.approx([25, 15, 25, 15, 20, 10])


def test_doa_aoa_and_wdoa_without_a_period_by_hand():
    curve = curve_of(WDOA_T, WDOA_D)  # ends at 70: the last level lasts no time
    cands = cands_of([(9, 61, 1, 1, 3), (45, 80, 2, 3, 7)])  # windows [10, 60) and [47, 77)
    scores = priority_scores(cands, curve, 20)
    assert scores["doa"].tolist() == [50, 30]
    assert scores["aoa"].tolist() == [150, 210]
    assert scores["wdoa"].tolist() == pytest.approx([25, 10])


@pytest.mark.parametrize("seed", range(8))
def test_wdoa_of_a_late_window_is_that_of_the_folded_one(seed):
    rng = np.random.default_rng(200 + seed)
    w0, w1 = 20, 120
    period = w1 - w0
    inside = np.sort(rng.choice(np.arange(w0 + 1, w1), 8, replace=False))
    t = np.concatenate([[w0], inside])
    delta = rng.integers(-30, 40, len(t))
    curve = periodic_curve_of(t, delta, w0, w1)
    a = rng.integers(w0, w1, 30)
    b = a + rng.integers(1, period, 30)
    goal = int(np.cumsum(delta).min())
    folded = priority_scores(windows(list(zip(a.tolist(), b.tolist()))), curve, goal)["wdoa"]
    late = priority_scores(windows(list(zip((a + period).tolist(), (b + period).tolist()))), curve, goal)["wdoa"]
    assert late.tolist() == pytest.approx(folded.tolist())
    assert folded.max() > 0


# ---- _prune ----------------------------------------------------------------------------------------------------

def state(ev, chosen):
    peak, over, stall, sched = ev(chosen)
    return peak, over, stall, sched


def pruned(ev, chosen):
    return _prune(ev, list(chosen), *state(ev, chosen))[0]


# live 100 on [0, 10) (no candidate covers it), 20 on [10, 20), 60 on [20, 40), 20 on [40, 60)
PRUNE_T, PRUNE_D = [0, 10, 20, 40, 60], [100, -80, 40, -40, -20]


def test_prune_drops_the_last_of_two_interchangeable_picks():
    """Against the goal 55, one of two equal 10-byte swaps of [20, 40) brings that stretch under the goal:
    the second is dropped (the latest pick first), the first then stays (without it the overload grows)."""
    cands = cands_of([(19, 41, 1, 1, 10), (19, 41, 1, 1, 10)])
    ev = _Evaluator(cands, curve_of(PRUNE_T, PRUNE_D), 55)
    assert pruned(ev, [0, 1]) == [0]
    assert pruned(ev, [1, 0]) == [1]
    out = _prune(ev, [0, 1], *state(ev, [0, 1]))
    assert out[1:3] == (100, 45 * 10) and out[3] == 0


def test_prune_drops_an_early_pick_that_a_later_one_covers():
    """Pick 0 frees [20, 30), pick 1 frees [15, 45): with 1, the stretch [20, 40) is under 55 already."""
    cands = cands_of([(19, 31, 1, 1, 10), (14, 46, 1, 1, 10)])
    ev = _Evaluator(cands, curve_of(PRUNE_T[1:], [20, 40, -40, -20]), 55)
    assert pruned(ev, [0, 1]) == [1]
    assert pruned(ev, [1]) == [1]


def test_prune_keeps_a_swap_that_only_lowers_the_peak():
    """Under the goal the overload is 0 either way; removing swap 0 would raise the peak 50 back to 60.
    (Its window [19, 41) holds the whole stretch: a block leaves after the events at its release time and
    is back before those at its return.)"""
    cands = cands_of([(18, 42, 1, 1, 10), (9, 21, 1, 1, 5)])
    ev = _Evaluator(cands, curve_of(PRUNE_T[1:], [20, 40, -40, -20]), 100)
    assert pruned(ev, [0]) == [0]
    assert pruned(ev, [0, 1]) == [0]  # 1 frees only [10, 20), under the peak


@pytest.mark.parametrize("seed", range(10))
def test_prune_keeps_exactly_the_swaps_that_matter(seed):
    rng = np.random.default_rng(300 + seed)
    n = 30
    t = np.sort(rng.choice(np.arange(0, 400), n, replace=False))
    delta = rng.integers(-40, 60, n)
    delta[-1] = -int(np.cumsum(delta)[-2])
    curve = curve_of(t, delta)
    k = 12
    a = rng.integers(0, 350, k)
    cands = cands_of([(x, x + int(rng.integers(10, 120)), int(rng.integers(1, 6)), int(rng.integers(1, 6)),
                       int(rng.integers(1, 50))) for x in a])
    goal = int(np.percentile(np.cumsum(delta), 60))
    ev = _Evaluator(cands, curve, goal)
    chosen = rng.permutation(k)[: int(rng.integers(1, k))].tolist()
    peak0, over0, stall0, _ = ev(chosen)
    kept, peak, over, stall, sched = _prune(ev, chosen, peak0, over0, stall0, ev(chosen)[3])
    assert kept == [c for c in chosen if c in kept]  # a subsequence, order kept
    assert (peak, over, stall) == ev(kept)[:3]
    assert peak <= peak0 and over <= over0 and stall <= stall0  # no removal made anything worse
    for c in kept:  # every swap left matters: without it the peak, overload or stall is worse
        p2, o2, s2, _ = ev([x for x in kept if x != c])
        assert p2 > peak or o2 > over or s2 > stall


# ---- select with a limit: the goal is the limit ---------------------------------------------------------------

def test_a_limit_above_the_target_stops_early():
    """live 100 on [10, 50): two 30-byte swaps of it. With the limit 70 one is enough; minimising towards the
    target 40 (no limit) keeps both."""
    curve = curve_of([0, 10, 50], [10, 90, -100])
    cands = cands_of([(8, 52, 1, 1, 30), (8, 52, 1, 1, 30)])  # absent [9, 51) and [10, 50)
    with_limit = select(cands, curve, 70, "doa", 40)
    assert with_limit.chosen.tolist() == [0] and with_limit.peak == 70
    minimising = select(cands, curve, None, "doa", 40)
    assert minimising.chosen.tolist() == [0, 1] and minimising.peak == 70


# live 100 on [10, 20), 60 on [30, 40): A frees [10, 20), B [30, 40), 30 bytes each
TWO_T, TWO_D = [0, 10, 20, 30, 40], [10, 90, -90, 50, -60]
TWO = [(8, 22, 1, 1, 30), (28, 42, 1, 1, 30)]  # absent [9, 21) and [29, 41)


def test_a_limit_below_the_target_keeps_every_swap_over_the_limit():
    """The limit 50 cannot be met (A leaves 70): B still lowers the load over the limit (60 -> 30) and is kept,
    although 60 is under the target 70."""
    sel = select(cands_of(TWO), curve_of(TWO_T, TWO_D), 50, "doa", 70)
    assert sel.chosen.tolist() == [0, 1] and sel.peak == 70


def test_best_ranks_wdoa_against_the_limit(monkeypatch):
    """WDOA weights (live - 50) / (100 - 50) against the limit: A 1 x 10 ns, B 0.2 x 10 ns (the rest of
    their windows is at 10) (against the target
    70, B would weigh 0)."""
    seen = []

    def spy(cands, curve, limit, priority, target, scheduler=serial_schedule, scores=None):
        seen.append(None if scores is None else scores["wdoa"].tolist())
        return select_by_priority(cands, curve, limit, priority, target, scheduler, scores)

    monkeypatch.setattr(optimise, "select_by_priority", spy)
    select(cands_of(TWO), curve_of(TWO_T, TWO_D), 50, "best", 70)
    assert len(seen) == 3 and all(s == pytest.approx([10, 2]) for s in seen)


def fake_runs(monkeypatch, runs: dict):
    """Make `_select_among` see hand-made runs: {priority: (chosen, peak, stall)}."""
    def make(name):
        chosen, peak, stall = runs[name]
        return Selection(name, np.asarray(chosen, np.int64), serial_schedule(*[np.zeros(0, np.int64)] * 4),
                         peak, stall)

    monkeypatch.setattr(optimise, "select_by_priority", lambda c, cu, lim, p, *a, **k: make(p))
    monkeypatch.setattr(optimise, "select_peak_greedy", lambda *a, **k: make("peak"))


SIZES = cands_of([(0, 10, 1, 1, 10), (0, 10, 1, 1, 20), (0, 10, 1, 1, 40)])  # sizes 10, 20, 40


@pytest.mark.parametrize("runs, limit, winner", [
    # meeting the limit beats a lower-stall, lower-traffic run that does not
    ({"doa": ([2], 100, 9), "aoa": ([0], 101, 0), "wdoa": ([0], 150, 0), "peak": ([0], 120, 0)}, 100, "doa"),
    # among runs that meet it: the least stall, whatever the peak
    ({"doa": ([0], 80, 5), "aoa": ([2], 95, 0), "wdoa": ([1], 90, 1), "peak": ([0], 70, 9)}, 100, "aoa"),
    # then the least traffic (bytes swapped); the peak at the limit counts as meeting it
    ({"doa": ([0, 1], 99, 0), "aoa": ([2], 100, 0), "wdoa": ([1], 100, 0), "peak": ([0, 2], 90, 0)}, 100, "wdoa"),
    # then the lowest peak
    ({"doa": ([1], 99, 0), "aoa": ([1], 98, 0), "wdoa": ([0, 2], 50, 0), "peak": ([2], 60, 0)}, 100, "aoa"),
    # none meets it: the lowest peak, before stall and traffic
    ({"doa": ([0], 130, 0), "aoa": ([1, 2], 120, 3), "wdoa": ([0], 125, 0), "peak": ([2], 121, 0)}, 100, "aoa"),
    # no limit: the lowest peak, then the least stall, then traffic
    ({"doa": ([2], 80, 0), "aoa": ([1], 80, 0), "wdoa": ([0], 80, 2), "peak": ([1, 2], 85, 0)}, None, "aoa"),
])
def test_best_by_hand(monkeypatch, runs, limit, winner):
    fake_runs(monkeypatch, runs)
    got = _select_among(SIZES, curve_of([0, 10], [100, -100]), limit, "best", 10, serial_schedule)
    assert got.method == winner


@pytest.mark.parametrize("seed", range(6))
def test_best_is_the_best_of_the_four_runs(seed):
    """`best` against the four runs made one by one (each ranking WDOA against its own goal)."""
    rng = np.random.default_rng(400 + seed)
    n = 24
    t = np.sort(rng.choice(np.arange(0, 300), n, replace=False))
    delta = rng.integers(-30, 60, n)
    delta[-1] = -int(np.cumsum(delta)[-2])
    curve = curve_of(t, delta)
    cands = cands_of([(x, x + int(rng.integers(10, 90)), int(rng.integers(1, 8)), int(rng.integers(1, 8)),
                       int(rng.integers(1, 40))) for x in rng.integers(0, 260, 14)])
    live = np.cumsum(delta)
    target = int(np.percentile(live, 40))
    for limit in (None, int(np.percentile(live, 80)), int(live.max()) - 1):
        runs = [select_by_priority(cands, curve, limit, p, target) for p in PRIORITIES]
        runs.append(select_peak_greedy(cands, curve, limit, target))

        def key(s):
            met = limit is not None and s.peak <= limit
            return (not met, 0 if met else s.peak, s.stall_ns, int(cands["size"].to_numpy()[s.chosen].sum()),
                    s.peak)

        want = min(runs, key=key)
        got = _select_among(cands, curve, limit, "best", target, serial_schedule)
        assert key(got) == key(want)
