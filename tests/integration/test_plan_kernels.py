"""The compiled planner kernels against plain-Python references written from their definitions:
the conflict graph, greedy placement (best/first gap, alignment, kept prefixes, always-live buffers)
and the plan validator."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memlens.plan import as_problem, plan, plan_violations
from memlens.plan.heuristics import HEURISTICS, order_by, place_in_order, plan_height
from memlens.plan.portfolio import _run_heuristics


def random_problem(seed: int, n: int = 40, horizon: int = 30, always: int = 0, align: bool = False):
    rng = np.random.default_rng(seed)
    lo = rng.integers(0, horizon, n)
    hi = lo + rng.integers(0, 8, n)  # some empty lifetimes
    size = rng.integers(0, 50, n)  # some zero sizes
    rows = [(int(a), int(b), int(z)) for a, b, z in zip(lo, hi, size)]
    rows += [(0, horizon + 8, int(rng.integers(1, 50))) for _ in range(always)]
    df = pd.DataFrame([(f"b{i}", a, b, z) for i, (a, b, z) in enumerate(rows)],
                      columns=["id", "lower", "upper", "size"])
    if align:
        df["alignment"] = rng.choice([1, 4, 16], len(df))
    return as_problem(df)


def reference_neighbours(p) -> list[set[int]]:
    act = p.active
    return [{j for j in range(p.n) if j != i and act[i] and act[j]
             and p.start[i] < p.end[j] and p.start[j] < p.end[i]} for i in range(p.n)]


def reference_place(p, order, fit, kept: dict[int, int] | None = None) -> list[int]:
    """Greedy placement by its definition: try every candidate offset (0 and each placed neighbour's top,
    rounded up to the alignment) in increasing order; "first" takes the lowest that fits, "best" the one
    whose gap up to the next neighbour above is smallest (lowest on ties), else the top. `kept`: buffers
    already placed (index -> offset) before the others of `order` are."""
    nbrs = reference_neighbours(p)
    off: dict[int, int] = dict(kept or {})
    for i in order.tolist():
        if i in off:
            continue
        z, a = int(p.size[i]), int(p.alignment[i])
        placed = [(off[j], off[j] + int(p.size[j])) for j in nbrs[i] if j in off]
        top = max((t for _, t in placed), default=0)
        choices = []
        for floor in sorted({0} | {t for _, t in placed}):
            o = -(-floor // a) * a
            if any(lo < o + max(z, 1) and o < t for lo, t in placed):
                continue  # not a free gap's bottom
            above = [lo for lo, _ in placed if lo >= o]
            if not above:
                continue  # the unbounded gap on top: only when nothing fits below
            room = min(above) - o
            if room >= z:
                choices.append((room if fit == "best" else 0, o, floor))
        o = -(-top // a) * a if not choices else -(-min(choices)[2] // a) * a
        off[i] = o
    return [off[i] for i in range(p.n)]


@pytest.mark.parametrize("seed", range(12))
def test_conflict_graph_matches_pairwise_definition(seed):
    p = random_problem(seed, always=seed % 3)
    indptr, indices = p.conflicts()
    got = [set(indices[indptr[i]:indptr[i + 1]].tolist()) for i in range(p.n)]
    assert got == reference_neighbours(p)
    # each row in start order (the search code relies on a deterministic order)
    for i in range(p.n):
        row = indices[indptr[i]:indptr[i + 1]]
        assert list(zip(p.start[row], row)) == sorted(zip(p.start[row], row))


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("fit", ["best", "first"])
def test_placement_matches_reference(seed, fit):
    p = random_problem(seed, always=(seed % 4), align=seed % 2 == 1)
    order = np.random.default_rng(seed).permutation(p.n)
    got = place_in_order(p, order, fit)
    assert got.tolist() == reference_place(p, order, fit)
    assert plan_violations(p, got) == []


@pytest.mark.parametrize("fit", ["best", "first"])
def test_placement_keeps_a_prefix_and_places_the_rest(fit):
    p = random_problem(3, always=2)
    order = order_by(p, "size")
    full = place_in_order(p, order, fit)
    half = p.n // 2
    # move the prefix up by the whole plan's height: still a valid placement of those buffers, and not
    # where a fresh placement would put them, so the rest must be placed around the moved ones
    lift = int(plan_height(p, full))
    shifted = full.copy()
    shifted[order[:half]] += lift
    shifted[order[half:]] = -1  # whatever is here for the rest must be ignored
    again = place_in_order(p, order, fit, prefix=half, offsets=shifted)
    assert again[order[:half]].tolist() == (full[order[:half]] + lift).tolist()
    kept = {int(i): int(full[i]) + lift for i in order[:half]}
    assert again.tolist() == reference_place(p, order, fit, kept)
    assert again.tolist() != full.tolist()
    assert plan_violations(p, again) == []


def test_always_live_buffers_stack_like_any_other():
    # three buffers alive throughout plus short ones: the always-live ones are merged from their own list
    df = pd.DataFrame({"id": list("abcdef"), "lower": [0, 0, 0, 1, 2, 3], "upper": [9, 9, 9, 3, 4, 5],
                       "size": [10, 20, 30, 5, 5, 5]})
    p = as_problem(df)
    off = place_in_order(p, np.arange(6), "best")
    assert off.tolist() == [0, 10, 30, 60, 65, 60]
    assert plan_height(p, off) == 70 == p.max_live()


@pytest.mark.parametrize("seed", range(20))
def test_validator_agrees_with_pairwise_check(seed):
    p = random_problem(seed, n=30, horizon=20, always=seed % 2)
    rng = np.random.default_rng(seed)
    offsets = rng.integers(0, 200, p.n) if seed % 2 else place_in_order(p, rng.permutation(p.n), "best")
    nbrs = reference_neighbours(p)
    clash = any(offsets[i] < offsets[j] + p.size[j] and offsets[j] < offsets[i] + p.size[i]
                for i in range(p.n) for j in nbrs[i])
    bad = plan_violations(p, offsets, limit=50)
    assert bool(bad) == clash
    for text in bad:  # every reported pair really overlaps
        assert "overlap in time and address" in text


def test_heuristics_run_concurrently_give_the_sequential_results():
    p = random_problem(7, n=300, horizon=120, always=3)
    names = [h[0] for h in HEURISTICS]
    skipped: list[str] = []
    together = dict(_run_heuristics(p, names, budget_s=60.0, skipped=skipped))
    assert skipped == [] and list(together) == names
    for name, key, fit in HEURISTICS:
        assert together[name].tolist() == place_in_order(p, order_by(p, key), fit).tolist()


def test_heuristics_over_budget_are_skipped_but_online_best_fit_runs():
    p = random_problem(8, n=200, horizon=80)
    skipped: list[str] = []
    got = dict(_run_heuristics(p, [h[0] for h in HEURISTICS], budget_s=0.0, skipped=skipped))
    assert list(got) == ["online_best_fit"] and len(skipped) == len(HEURISTICS) - 1
    result = plan(p, time_limit_s=0.0)
    assert list(result.heuristics) == ["online_best_fit"]  # no time: the one plan that always runs


@pytest.mark.parametrize("fit", ["best", "first"])
def test_sliced_placement_is_the_same_placement(fit, monkeypatch):
    """With a deadline the placement runs in slices (each continuing from the last one's offsets); tiny
    slices must give exactly the one-call result, also after a kept prefix. A passed deadline gives None."""
    import time

    import memlens.plan.heuristics as heuristics
    p = random_problem(11, n=2000, horizon=400, always=3, align=True)
    order = order_by(p, "size")
    whole = place_in_order(p, order, fit)
    monkeypatch.setattr(heuristics, "SLICE_S", 1e-9)  # every slice the minimum of 64 buffers
    far = time.perf_counter() + 600
    assert place_in_order(p, order, fit, deadline=far).tolist() == whole.tolist()
    kept = place_in_order(p, order, fit, prefix=700, offsets=whole + 64, deadline=far)
    assert kept.tolist() == place_in_order(p, order, fit, prefix=700, offsets=whole + 64).tolist()
    assert place_in_order(p, order, fit, deadline=time.perf_counter() - 1) is None


def test_importing_the_planners_does_not_import_numba():
    """numba (~0.5 s) loads on the first plan or swap, not on import."""
    import subprocess
    import sys

    code = "import sys, memlens, memlens.plan, memlens.swap; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
