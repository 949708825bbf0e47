"""Anytime improvement of a static plan: local search over placement orders, aimed at the peak.

A plan is an order plus a fit rule (best/first gap); its height is set by the buffers whose top touches
it (the *critical* buffers). Each step moves a critical buffer earlier in the order, or swaps it with an
earlier buffer it conflicts with, and re-places only the suffix of the order that changed. Moves that do
not raise the height are kept (sideways moves let the search cross plateaus), so the search walks
towards orders where the peak window is packed first. This is the hill climbing TVM's USMP uses on top
of greedy-by-size, steered to the peak window.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from memlens.plan.heuristics import place_in_order, plan_height
from memlens.plan.problem import PlanProblem


@dataclass
class ImproveResult:
    """Best plan found: offsets (bytes), height (bytes), its order and fit, and search statistics."""

    offsets: np.ndarray
    height: int
    order: np.ndarray
    fit: str
    steps: int
    improvements: int


def improve(problem: PlanProblem, order: np.ndarray, fit: str = "best", time_limit_s: float = 1.0,
            target: int = 0, seed: int = 0, max_steps: int | None = None) -> ImproveResult:
    """Local search from `order` for `time_limit_s` seconds (or `max_steps`), stopping at `target` bytes.

    Returns the best plan seen; never worse than the starting order's plan.
    """
    rng = np.random.default_rng(seed)
    deadline = time.perf_counter() + time_limit_s
    order = np.asarray(order).copy()
    began = time.perf_counter()
    offsets = place_in_order(problem, order, fit)
    height = plan_height(problem, offsets)
    best = ImproveResult(offsets, height, order.copy(), fit, 0, 0)
    if problem.n < 2:
        return best
    indptr, indices = problem.conflicts()
    pos = np.empty(problem.n, np.int64)
    steps = 0
    # the last step's duration (at first: a full placement's, the most a step re-places): a step that
    # would end past the deadline is not started, and one that runs past it is abandoned
    step_s = time.perf_counter() - began
    while (height > target and time.perf_counter() + step_s < deadline
           and (max_steps is None or steps < max_steps)):
        began = time.perf_counter()
        steps += 1
        pos[order] = np.arange(problem.n)
        tops = offsets + problem.size
        critical = np.flatnonzero(tops == height)
        c = int(rng.choice(critical))
        pc = int(pos[c])
        if pc == 0:
            continue
        nb = indices[indptr[c]:indptr[c + 1]]
        earlier = nb[pos[nb] < pc]
        candidate = order.copy()
        if len(earlier) and rng.random() < 0.5:
            d = int(rng.choice(earlier))
            pd_ = int(pos[d])
            candidate[pd_], candidate[pc] = c, d
            first = pd_
        else:
            first = int(rng.integers(0, pc))
            candidate[first + 1:pc + 1] = order[first:pc]
            candidate[first] = c
        new_offsets = place_in_order(problem, candidate, fit, prefix=first, offsets=offsets, deadline=deadline)
        if new_offsets is None:
            break
        new_height = plan_height(problem, new_offsets)
        if new_height <= height:
            order, offsets, height = candidate, new_offsets, new_height
            if height < best.height:
                best = ImproveResult(offsets, height, order.copy(), fit, steps, best.improvements + 1)
        step_s = time.perf_counter() - began
    best.steps = steps
    return best


def _lowest_fit(problem: PlanProblem, i: int, offsets: np.ndarray, limit: int, skip: int = -1) -> int | None:
    """Lowest aligned offset where buffer i fits among its conflicts' current places with its top at most
    `limit` bytes (ignoring buffer `skip`); None when there is no such place."""
    indptr, indices = problem.conflicts()
    nb = indices[indptr[i]:indptr[i + 1]]
    if skip >= 0:
        nb = nb[nb != skip]
    z, a = int(problem.size[i]), int(problem.alignment[i])
    lo = offsets[nb]
    srt = lo.argsort()
    lo = lo[srt]
    hi = np.maximum.accumulate(lo + problem.size[nb][srt])
    prev = np.zeros(len(lo) + 1, np.int64)
    prev[1:] = hi
    if a > 1:
        prev = -(-prev // a) * a
    room = np.append(lo, np.iinfo(np.int64).max) - prev
    ok = np.flatnonzero((room >= z) & (prev + z <= limit))
    return int(prev[ok[0]]) if len(ok) else None


def repair_peak(problem: PlanProblem, offsets: np.ndarray, time_limit_s: float = 1.0, target: int = 0,
                max_ejections: int = 16) -> np.ndarray:
    """Lower a plan's height by moving the buffers that touch it into lower gaps (bytes in, bytes out).

    Each round, every buffer whose top equals the height moves to the lowest place where it fits below the
    height, all other buffers staying put; a buffer with no such place may eject one of its conflicting
    buffers (largest first, up to `max_ejections` tries), which must then fit below the height elsewhere.
    Stops when a top buffer cannot move, at `target`, or at the time limit. Every move keeps the plan valid.
    """
    deadline = time.perf_counter() + time_limit_s
    off = np.asarray(offsets, dtype=np.int64).copy()
    indptr, indices = problem.conflicts()
    size = problem.size
    while time.perf_counter() < deadline:
        tops = off + size
        height = int(tops.max(initial=0))
        if height <= target:
            break
        stuck = False
        for c in np.flatnonzero(tops == height).tolist():
            if time.perf_counter() >= deadline:
                break
            o = _lowest_fit(problem, c, off, height - 1)
            if o is not None:
                off[c] = o
                continue
            nb = indices[indptr[c]:indptr[c + 1]]
            moved = False
            for d in nb[np.argsort(-size[nb], kind="stable")][:max_ejections].tolist():
                oc = _lowest_fit(problem, c, off, height - 1, skip=d)
                if oc is None:
                    continue
                old_c, old_d = off[c], off[d]
                off[c] = oc
                od = _lowest_fit(problem, d, off, height - 1)
                if od is not None:
                    off[d] = od
                    moved = True
                    break
                off[c], off[d] = old_c, old_d
            if not moved:
                stuck = True
                break
        if stuck:
            break
    return off


def window_search(problem: PlanProblem, offsets: np.ndarray, time_limit_s: float = 1.0, target: int = 0,
                  seed: int = 0) -> np.ndarray:
    """Large-neighbourhood search around the peak (bytes in, bytes out).

    Each step picks a buffer touching the top, frees it and every buffer it conflicts with whose top lies
    above a random level, and re-places the freed buffers (largest first, randomly perturbed, best or
    first gap) around the buffers that stay. A step is kept when the height does not grow and the number
    of buffers touching the top does not grow either, so the search drifts across plateaus towards lower
    plans. Returns the best offsets seen; every step keeps the plan valid.
    """
    rng = np.random.default_rng(seed)
    deadline = time.perf_counter() + time_limit_s
    off = np.asarray(offsets, dtype=np.int64).copy()
    indptr, indices = problem.conflicts()
    size = problem.size
    tops = off + size
    height = int(tops.max(initial=0))
    touching = int((tops == height).sum())
    best, best_height = off.copy(), height
    step_s = 0.0  # the last step's duration: a step that would end past the deadline is not started
    while height > target and time.perf_counter() + step_s < deadline:
        began = time.perf_counter()
        c = int(rng.choice(np.flatnonzero(tops == height)))
        nb = indices[indptr[c]:indptr[c + 1]]
        level = int(off[c] * rng.random())
        free = np.append(nb[tops[nb] > level], c)
        keep = np.ones(problem.n, bool)
        keep[free] = False
        noise = rng.random(len(free)) * rng.choice([0.0, 0.3, 1.0])
        freed = free[np.argsort(-size[free] * (1.0 + noise), kind="stable")]
        order = np.concatenate([np.flatnonzero(keep), freed])
        trial = place_in_order(problem, order, "best" if rng.random() < 0.5 else "first",
                               prefix=problem.n - len(freed), offsets=off, deadline=deadline)
        if trial is None:
            break
        trial_tops = trial + size
        new_height = int(trial_tops.max(initial=0))
        new_touching = int((trial_tops == new_height).sum())
        if (new_height, new_touching) <= (height, touching):
            off, tops, height, touching = trial, trial_tops, new_height, new_touching
            if height < best_height:
                best, best_height = off.copy(), height
        step_s = time.perf_counter() - began
    return best
