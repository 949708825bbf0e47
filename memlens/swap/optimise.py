"""Choosing which idle intervals to swap.

- ``doa`` / ``aoa`` / ``wdoa``: Zhang et al.'s priorities (duration of absence; DOA x size; DOA weighted by
  how far the load is over the limit — here the integral of the overload across the interval, recomputed
  after every pick). Candidates are taken in priority order; a pick is kept when it adds no stall, does
  not raise the peak and lowers the overload (bytes x time above the goal), until the peak is under the
  limit. The goal is the limit, or the infinite-bandwidth peak when minimising.
- ``peak``: peak-targeted greedy with re-simulation: find the current peak instant, try the largest
  candidates whose absence would cover it, keep the one that lowers (peak, time spent at the peak) the
  most (then the overload: bytes x time above the goal) without adding stall; repeat until under the limit or nothing helps.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from memlens.swap.schedule import LoadCurve, Schedule, serial_schedule

PRIORITIES = ("doa", "aoa", "wdoa")
PEAK_TRIES = 8


@dataclass
class Selection:
    """Chosen candidates (row positions), their schedule and the resulting peak (bytes) and stall (ns)."""

    method: str
    chosen: np.ndarray
    schedule: Schedule
    peak: int
    stall_ns: int


class _Evaluator:
    """Simulates a set of chosen swaps: (peak, overload above the goal, stall, schedule)."""

    def __init__(self, cands: pd.DataFrame, curve: LoadCurve, goal: int):
        self.goal = goal
        self.a = cands["idle_from_ns"].to_numpy(np.int64)
        self.b = cands["idle_to_ns"].to_numpy(np.int64)
        self.o = cands["out_ns"].to_numpy(np.int64)
        self.i = cands["in_ns"].to_numpy(np.int64)
        self.z = cands["size"].to_numpy(np.int64)
        self.curve = curve

    def __call__(self, chosen, max_stall: int | None = None) -> tuple[int, float, int, Schedule]:
        """(peak bytes, byte*ns above the goal, stall ns, schedule) with the candidates `chosen` swapped.

        With `max_stall` (ns), a schedule stalling longer is returned without simulating the curve (peak
        and overload come back as +inf): the callers reject such a set whatever its curve.
        """
        c = np.asarray(chosen, dtype=np.int64)
        sched = serial_schedule(self.a[c], self.b[c], self.o[c], self.i[c])
        stall = int(sched.stall.sum())
        if max_stall is not None and stall > max_stall:
            return np.iinfo(np.int64).max, float("inf"), stall, sched
        peak, over = self.curve.peak_and_overload(self.z[c], sched, self.goal)
        return peak, over, stall, sched

    def peak_instant(self, chosen) -> int:
        c = np.asarray(chosen, dtype=np.int64)
        return self.curve.peak(self.z[c], serial_schedule(self.a[c], self.b[c], self.o[c], self.i[c]))[1]


def select_by_priority(cands: pd.DataFrame, curve: LoadCurve, limit: int | None, priority: str,
                       target: int) -> Selection:
    """Zhang et al.'s selection: candidates in `priority` order until the peak is at most the limit."""
    goal = limit if limit is not None else target
    ev = _Evaluator(cands, curve, goal)
    chosen: list[int] = []
    peak, over, stall, sched = ev(chosen)
    doa = cands["doa_ns"].to_numpy(np.float64)
    static = doa if priority == "doa" else doa * ev.z
    remaining = np.ones(len(cands), bool)
    weight = None  # WDOA's weights, recomputed only when a pick changed the curve
    while remaining.any() and peak > goal:
        if priority == "wdoa":
            if weight is None:
                t, live = curve.curve(ev.z[np.asarray(chosen, np.int64)], sched)
                weight = LoadCurve.overload_integral(t, live, goal, ev.a + ev.o, ev.b - ev.i)
            score = np.where(remaining, weight, -1.0)
            if score.max() <= 0:
                break
        else:
            score = np.where(remaining, static, -np.inf)
        k = int(np.argmax(score))
        remaining[k] = False
        trial = chosen + [k]
        p2, o2, s2, sch2 = ev(trial, max_stall=stall)
        if s2 <= stall and p2 <= peak and o2 < over:
            chosen, peak, over, stall, sched = trial, p2, o2, s2, sch2
            weight = None
    return Selection(priority, np.asarray(chosen, np.int64), sched, peak, stall)


def select_peak_greedy(cands: pd.DataFrame, curve: LoadCurve, limit: int | None, target: int) -> Selection:
    """Re-simulating greedy aimed at the current peak instant (see the module docstring)."""
    goal = limit if limit is not None else target
    ev = _Evaluator(cands, curve, goal)
    chosen: list[int] = []
    peak, over, stall, sched = ev(chosen)
    win_a, win_b = ev.a + ev.o, ev.b - ev.i  # where a lone swap would free the block
    excluded = np.zeros(len(cands), bool)
    while peak > goal:
        t_peak = ev.peak_instant(chosen)
        cover = np.flatnonzero(~excluded & (win_a <= t_peak) & (win_b > t_peak))
        if len(cover) == 0:
            break
        tries = cover[np.lexsort((-ev.b[cover] + ev.a[cover], -ev.z[cover]))][:PEAK_TRIES]
        best = None
        for k in tries.tolist():
            p2, o2, s2, sch2 = ev(chosen + [k], max_stall=stall)
            if s2 <= stall and p2 <= peak and o2 < over and (best is None or (p2, o2) < best[:2]):
                best = (p2, o2, s2, sch2, k)
        if best is None:
            excluded[tries] = True
            continue
        peak, over, stall, sched, k = best
        chosen.append(k)
        excluded[k] = True
    return Selection("peak", np.asarray(chosen, np.int64), sched, peak, stall)


def useful_candidates(cands: pd.DataFrame, curve: LoadCurve, goal: int) -> np.ndarray:
    """Mask of the candidates whose absence window meets some instant where the recorded load exceeds `goal`
    (swaps only lower the load, so the others can never help)."""
    t, live = curve.curve()
    if len(cands) == 0 or len(t) == 0:
        return np.zeros(len(cands), bool)
    a = (cands["idle_from_ns"] + cands["out_ns"]).to_numpy(np.int64)
    b = (cands["idle_to_ns"] - cands["in_ns"]).to_numpy(np.int64)
    lo = np.clip(np.searchsorted(t, a, side="right") - 1, 0, len(t) - 1)
    hi = np.clip(np.searchsorted(t, b, side="left"), 0, len(t))
    hi = np.maximum(hi, lo + 1)
    over = np.concatenate([(live > goal).astype(np.int64), [0]])
    hits = np.concatenate([[0], np.cumsum(over)])
    return (hits[hi] - hits[lo]) > 0


def select(cands: pd.DataFrame, curve: LoadCurve, limit: int | None, priority: str, target: int) -> Selection:
    """Run `priority` ("doa", "aoa", "wdoa", "peak" or "best": all of them, keeping the lowest peak,
    then the least stall, then the least traffic)."""
    if priority not in PRIORITIES + ("peak", "best"):
        raise ValueError(f"unknown priority {priority!r}")
    useful = np.flatnonzero(useful_candidates(cands, curve, limit if limit is not None else target))
    sel = _select_among(cands.iloc[useful].reset_index(drop=True), curve, limit, priority, target)
    sel.chosen = useful[sel.chosen]
    return sel


def _select_among(cands: pd.DataFrame, curve: LoadCurve, limit: int | None, priority: str,
                  target: int) -> Selection:
    if priority in PRIORITIES:
        return select_by_priority(cands, curve, limit, priority, target)
    if priority == "peak":
        return select_peak_greedy(cands, curve, limit, target)
    runs = [select_by_priority(cands, curve, limit, p, target) for p in PRIORITIES]
    runs.append(select_peak_greedy(cands, curve, limit, target))
    sizes = cands["size"].to_numpy(np.int64)

    def key(sel: Selection):
        met = limit is not None and sel.peak <= limit
        return (not met, sel.peak if not met else 0, sel.stall_ns, int(sizes[sel.chosen].sum()), sel.peak)

    return min(runs, key=key)
