"""Choosing which idle intervals to swap.

- ``doa`` / ``aoa`` / ``wdoa``: Zhang et al.'s priorities, computed once on the load before swapping, as in
  the paper: DOA (duration of absence) = ATI - swap-out time - swap-in time; AOA = DOA x size; WDOA = the
  absence window weighted by how far the load is then over the limit (`memlens.analysis.wdoa.wdoa_ns`,
  the same WDOA the outlier ranking shows). Candidates are taken in priority order; a pick is kept only
  when it adds no stall, does not raise the peak and lowers the load over the goal (bytes x time above
  it), until the peak is at most the limit. The goal is the limit, or the infinite-bandwidth peak when
  minimising.
- ``peak``: peak-targeted greedy with re-simulation: find the current peak instant, try the largest
  candidates whose absence would cover it, keep the one that lowers (peak, time spent at the peak) the
  most (then the overload) without adding stall; repeat until under the limit or nothing helps.

Every selection ends with a pruning pass: a chosen swap whose removal neither raises the peak, nor the load
over the goal, nor the stall is dropped (it costs traffic and saves nothing).
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

    def __init__(self, cands: pd.DataFrame, curve: LoadCurve, goal: int, scheduler=serial_schedule):
        self.goal = goal
        self.a = cands["idle_from_ns"].to_numpy(np.int64)
        self.b = cands["idle_to_ns"].to_numpy(np.int64)
        self.o = cands["out_ns"].to_numpy(np.int64)
        self.i = cands["in_ns"].to_numpy(np.int64)
        self.z = cands["size"].to_numpy(np.int64)
        self.curve = curve
        self.scheduler = scheduler

    def schedule(self, chosen) -> Schedule:
        c = np.asarray(chosen, dtype=np.int64)
        return self.scheduler(self.a[c], self.b[c], self.o[c], self.i[c])

    def __call__(self, chosen, max_stall: int | None = None) -> tuple[int, float, int, Schedule]:
        """(peak bytes, byte*ns above the goal, stall ns, schedule) with the candidates `chosen` swapped.

        With `max_stall` (ns), a schedule stalling longer is returned without simulating the curve (peak
        and overload come back as +inf): the callers reject such a set whatever its curve.
        """
        c = np.asarray(chosen, dtype=np.int64)
        sched = self.schedule(c)
        stall = int(sched.stall.sum())
        if max_stall is not None and stall > max_stall:
            return np.iinfo(np.int64).max, float("inf"), stall, sched
        peak, over = self.curve.peak_and_overload(self.z[c], sched, self.goal)
        return peak, over, stall, sched

    def peak_instant(self, chosen) -> int:
        c = np.asarray(chosen, dtype=np.int64)
        return self.curve.peak(self.z[c], self.schedule(c))[1]


def priority_scores(cands: pd.DataFrame, curve: LoadCurve, goal: int) -> dict[str, np.ndarray]:
    """Zhang et al.'s three priorities of each candidate on the load before swapping:
    {"doa": ns, "aoa": byte*ns, "wdoa": ns} (`memlens.analysis.wdoa.wdoa_ns` with limit `goal`)."""
    from memlens.analysis.wdoa import wdoa_ns, weight_integral

    doa = cands["doa_ns"].to_numpy(np.float64)
    z = cands["size"].to_numpy(np.float64)
    t, live = curve.curve()
    end_t = getattr(curve, "w1", t[-1] if len(t) else 0)
    times, cum = weight_integral(t, live, float(goal), float(end_t))
    lo = (cands["idle_from_ns"] + cands["out_ns"]).to_numpy(np.float64)
    hi = (cands["idle_to_ns"] - cands["in_ns"]).to_numpy(np.float64)
    window = (curve.w0, curve.w1) if hasattr(curve, "w0") else None
    period = getattr(curve, "period", None)
    if window is not None:  # fold the windows that start past the period's end back into it
        late = lo >= window[1]
        lo, hi = np.where(late, lo - period, lo), np.where(late, hi - period, hi)
    wdoa = wdoa_ns(times, cum, lo, hi, window, period) if len(cands) else np.zeros(0)
    return {"doa": doa, "aoa": doa * z, "wdoa": np.asarray(wdoa, np.float64)}


def _prune(ev: _Evaluator, chosen: list[int], peak: int, over: float, stall: int, sched: Schedule):
    """Drop every chosen swap whose removal raises neither the peak, the overload nor the stall (the most
    recent picks first: the early ones were chosen when the load was highest)."""
    for k in list(reversed(chosen)):
        trial = [c for c in chosen if c != k]
        p2, o2, s2, sch2 = ev(trial, max_stall=stall)
        if s2 <= stall and p2 <= peak and o2 <= over:
            chosen, peak, over, stall, sched = trial, p2, o2, s2, sch2
    return chosen, peak, over, stall, sched


def select_by_priority(cands: pd.DataFrame, curve: LoadCurve, limit: int | None, priority: str,
                       target: int, scheduler=serial_schedule, scores: dict | None = None) -> Selection:
    """Zhang et al.'s selection: candidates in `priority` order until the peak is at most the limit."""
    goal = limit if limit is not None else target
    ev = _Evaluator(cands, curve, goal, scheduler)
    chosen: list[int] = []
    peak, over, stall, sched = ev(chosen)
    scores = priority_scores(cands, curve, goal) if scores is None else scores
    score = scores[priority]
    order = np.lexsort((np.arange(len(cands)), -ev.z, -score))
    for k in order.tolist():
        if peak <= goal:
            break
        if priority == "wdoa" and score[k] <= 0:
            break  # absent only while the load is under the limit: cannot help
        trial = chosen + [k]
        p2, o2, s2, sch2 = ev(trial, max_stall=stall)
        if s2 <= stall and p2 <= peak and o2 < over:
            chosen, peak, over, stall, sched = trial, p2, o2, s2, sch2
    chosen, peak, over, stall, sched = _prune(ev, chosen, peak, over, stall, sched)
    return Selection(priority, np.asarray(chosen, np.int64), sched, peak, stall)


def select_peak_greedy(cands: pd.DataFrame, curve: LoadCurve, limit: int | None, target: int,
                       scheduler=serial_schedule) -> Selection:
    """Re-simulating greedy aimed at the current peak instant (see the module docstring)."""
    goal = limit if limit is not None else target
    ev = _Evaluator(cands, curve, goal, scheduler)
    chosen: list[int] = []
    peak, over, stall, sched = ev(chosen)
    win_a, win_b = ev.a + ev.o, ev.b - ev.i  # where a lone swap would free the block
    period = getattr(curve, "period", None)
    excluded = np.zeros(len(cands), bool)
    while peak > goal:
        t_peak = ev.peak_instant(chosen)
        covers = (win_a <= t_peak) & (win_b > t_peak)
        if period is not None:  # windows past the period's end cover its start in the next period
            covers |= (win_a <= t_peak + period) & (win_b > t_peak + period)
        cover = np.flatnonzero(~excluded & covers)
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
    chosen, peak, over, stall, sched = _prune(ev, chosen, peak, over, stall, sched)
    return Selection("peak", np.asarray(chosen, np.int64), sched, peak, stall)


def useful_candidates(cands: pd.DataFrame, curve: LoadCurve, goal: int) -> np.ndarray:
    """Mask of the candidates whose absence window meets some instant where the recorded load exceeds `goal`
    (swaps only lower the load, so the others can never help). Periodic curves fold the windows."""
    t, live = curve.curve()
    if len(cands) == 0 or len(t) == 0:
        return np.zeros(len(cands), bool)
    a = (cands["idle_from_ns"] + cands["out_ns"]).to_numpy(np.int64)
    b = (cands["idle_to_ns"] - cands["in_ns"]).to_numpy(np.int64)
    over = np.concatenate([(live > goal).astype(np.int64), [0]])
    hits = np.concatenate([[0], np.cumsum(over)])

    def meets(lo_t, hi_t):
        # the level in force at lo_t (none before the first event), then every event in (lo_t, hi_t): the
        # block is still there during the events at lo_t and back before those at hi_t (`LoadCurve`)
        lo = np.maximum(np.searchsorted(t, lo_t, side="right") - 1, 0)
        hi = np.searchsorted(t, hi_t, side="left")
        return ((hits[hi] - hits[lo]) > 0) & (lo_t < hi_t)  # an empty window meets no instant

    period = getattr(curve, "period", None)
    if period is None:
        return meets(a, b)
    w0, w1 = curve.w0, curve.w1
    late = a >= w1
    a, b = np.where(late, a - period, a), np.where(late, b - period, b)
    useful = meets(a, np.minimum(b, w1))
    wrapped = b > w1
    return useful | (wrapped & meets(np.full(len(a), w0), b - period))


def select(cands: pd.DataFrame, curve: LoadCurve, limit: int | None, priority: str, target: int,
           scheduler=serial_schedule) -> Selection:
    """Run `priority` ("doa", "aoa", "wdoa", "peak" or "best": all of them, keeping the lowest peak,
    then the least stall, then the least traffic)."""
    if priority not in PRIORITIES + ("peak", "best"):
        raise ValueError(f"unknown priority {priority!r}")
    useful = np.flatnonzero(useful_candidates(cands, curve, limit if limit is not None else target))
    sel = _select_among(cands.iloc[useful].reset_index(drop=True), curve, limit, priority, target, scheduler)
    sel.chosen = useful[sel.chosen]
    return sel


def _select_among(cands: pd.DataFrame, curve: LoadCurve, limit: int | None, priority: str,
                  target: int, scheduler) -> Selection:
    if priority in PRIORITIES:
        return select_by_priority(cands, curve, limit, priority, target, scheduler)
    if priority == "peak":
        return select_peak_greedy(cands, curve, limit, target, scheduler)
    goal = limit if limit is not None else target
    scores = priority_scores(cands, curve, goal)
    runs = [select_by_priority(cands, curve, limit, p, target, scheduler, scores) for p in PRIORITIES]
    runs.append(select_peak_greedy(cands, curve, limit, target, scheduler))
    sizes = cands["size"].to_numpy(np.int64)

    def key(sel: Selection):
        met = limit is not None and sel.peak <= limit
        return (not met, sel.peak if not met else 0, sel.stall_ns, int(sizes[sel.chosen].sum()), sel.peak)

    return min(runs, key=key)
