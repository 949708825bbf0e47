"""`memlens.plan.plan`: the best static offset plan found within a time limit, validated.

Stages, each keeping the best plan so far:
1. every published heuristic (greedy by size best/first gap, by lifetime, area, breadth, conflicts,
   online best-fit in time order, Zhang's cross-iteration-first when it applies), run concurrently on
   the compiled placement kernel (`_kernels.py`);
2. peak repair (`improve.repair_peak`): the buffers touching the top move into lower gaps;
3. the exact canonical search (`exact.py`) asked for a plan at max-live, then — when that is not found —
   a bisection of the capacity between the proven lower bound and the best height: each "found" lowers
   the best height, each "infeasible" raises the proven lower bound (so `optimal` can be proven above
   max-live too);
4. with the time left: the window search around the peak (`improve.window_search`), then the local
   search over placement orders (`improve.improve`), both from the best plan so far.
Problems above `EXACT_MAX_BUFFERS` skip stage 3. The time limit holds end to end (input, kernels, every
stage, validation): the heuristics place in slices and give up at the deadline, later stages get what is
left, and time for the final validation is kept back (`plan`).
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.plan import exact
from memlens.plan.heuristics import graph_cost_estimate_s, heuristic_names, plan_height, run_heuristic
from memlens.plan.improve import improve, repair_peak, window_search
from memlens.plan.problem import PlanProblem, as_problem
from memlens.plan.validate import validate_plan

EXACT_MAX_BUFFERS = 20_000


@dataclass
class PlanResult:
    """A validated static plan.

    `offsets`: one row per buffer (id, lower, upper, size, offset and attribution columns when the source
    has them); `height` (bytes): the arena size the plan needs; `lower_bound` (bytes): max-live, or higher
    when the exact search proved that no plan fits below it; `ratio` = height / max-live; `algorithm`:
    the method that produced the plan; `optimal`: height proven minimal; `seconds`: wall time from the
    clock's start (the call, or `started_at`: what the time limit bounds).
    """

    offsets: pd.DataFrame
    height: int
    lower_bound: int
    max_live: int
    algorithm: str
    optimal: bool
    seconds: float
    device: str | None = None
    heuristics: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    problem: PlanProblem | None = field(default=None, repr=False)

    @property
    def ratio(self) -> float:
        """Plan height over max-live (1.0 = at the lower bound)."""
        return self.height / self.max_live if self.max_live else 1.0

    @property
    def best_heuristic(self) -> tuple[str, int]:
        """(name, height in bytes) of the best single published heuristic."""
        name = min(self.heuristics, key=self.heuristics.__getitem__)  # first listed on ties
        return name, self.heuristics[name]

    def summary(self) -> dict:
        """The JSON-able facts of the plan (no per-buffer table)."""
        name, h = self.best_heuristic if self.heuristics else ("", self.height)
        return {"buffers": int(len(self.offsets)), "device": self.device, "lower_bound": int(self.lower_bound),
                "max_live": int(self.max_live), "height": int(self.height), "ratio": round(self.ratio, 6),
                "algorithm": self.algorithm, "optimal": bool(self.optimal), "seconds": round(self.seconds, 4),
                "best_heuristic": name, "best_heuristic_height": int(h),
                "heuristics": {k: int(v) for k, v in self.heuristics.items()},
                "heuristics_skipped": list(self.skipped)}

    def to_csv(self, path) -> None:
        """Write the plan in MiniMalloc's format: ``id,lower,upper,size,offset``."""
        self.offsets[["id", "lower", "upper", "size", "offset"]].to_csv(path, index=False)


class _Best:
    def __init__(self, problem: PlanProblem):
        self.problem = problem
        self.offsets: np.ndarray | None = None
        self.height = np.iinfo(np.int64).max
        self.algorithm = ""

    def offer(self, offsets: np.ndarray, algorithm: str) -> int:
        height = plan_height(self.problem, offsets)
        if height < self.height:
            self.offsets, self.height, self.algorithm = offsets, height, algorithm
        return height


def _exact_stage(problem: PlanProblem, best: _Best, lower: int, deadline: float) -> int:
    """Capacity search with the exact solver until `deadline`; returns the proven lower bound (bytes).

    Half the time goes to max-live itself (the optimum of most real and benchmark instances); then the
    capacity is bisected between the smallest value not yet tried and the best height minus one.
    """
    res = exact.solve_exact(problem, lower, time_limit_s=0.5 * max(deadline - time.perf_counter(), 0))
    if res.status == exact.FOUND:
        best.offer(res.offsets, "exact_search")
        return lower
    if res.status == exact.INFEASIBLE:
        lower += 1
    try_from = lower  # capacities below this were proven infeasible or timed out
    while try_from < best.height:
        left = deadline - time.perf_counter()
        if left <= 0.02:
            break
        target = (try_from + best.height - 1) // 2
        res = exact.solve_exact(problem, target, time_limit_s=max(left / 3, min(left, 0.5)))
        if res.status == exact.FOUND:
            best.offer(res.offsets, "exact_search")
        elif res.status == exact.INFEASIBLE:
            lower = try_from = target + 1
        else:
            try_from = target + 1
    return lower


def _run_heuristics(problem: PlanProblem, names: list[str], budget_s: float, skipped: list[str],
                    deadline: float | None = None,
                    timings: dict[str, float] | None = None) -> list[tuple[str, np.ndarray]]:
    """(name, offsets) of each heuristic in `names` order, run concurrently on the machine's cores.

    The compiled placement releases the GIL, so the graph-based heuristics run in a thread pool while
    online best-fit (pure Python, no conflict graph) runs in this thread. They stop at `deadline` (a
    `time.perf_counter()` value; default: `budget_s` seconds from now): the graph-based ones place in
    slices and give up when it passes, and none starts when building the conflict graph alone is estimated
    to overrun it. Those not done are appended to `skipped`. Online best-fit always runs (when alignment
    rules it out, the first graph-based heuristic runs to the end instead), so there is always a plan.
    `timings` receives each finished heuristic's seconds.
    """
    deadline = time.perf_counter() + budget_s if deadline is None else deadline
    graph_free = [n for n in names if n == "online_best_fit" and not (problem.alignment > 1).any()]
    graph_names = [n for n in names if n not in graph_free]
    workers = max(1, min(len(graph_names), os.cpu_count() or 1))
    must_finish = graph_names[:1] if not graph_free else []
    # the graph build is not interruptible; its estimate is for an idle machine (up to 5x off on a busy one)
    if graph_names and not must_finish and time.perf_counter() + 4 * graph_cost_estimate_s(problem)[0] >= deadline:
        skipped.extend(graph_names)
        graph_names = []
    results: dict[str, np.ndarray | None] = {}
    timings = {} if timings is None else timings

    def timed(name: str, until: float | None):
        began = time.perf_counter()
        out = run_heuristic(problem, name, deadline=until)
        if out is not None:
            timings[name] = time.perf_counter() - began
        return out

    if graph_names:
        problem.conflicts()  # built once, before the threads share it
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memlens-plan") as pool:
            futures = {name: pool.submit(timed, name, None if name in must_finish else deadline)
                       for name in graph_names}
            results.update({name: timed(name, None) for name in graph_free})
            results.update({name: f.result() for name, f in futures.items()})
    else:
        results.update({name: timed(name, None) for name in graph_free})
    skipped.extend(name for name in graph_names if results.get(name) is None)
    return [(name, results[name]) for name in names if results.get(name) is not None]


def _validation_reserve_s(problem: PlanProblem) -> float:
    """Seconds kept for the final validation and the result table: a sweep over the buffers (measured
    0.2-0.6 s for 28,000 buffers on a busy 2-core machine), with a margin."""
    return 0.1 + 3e-5 * problem.n


_kernels_ready = False


def load_kernels() -> float:
    """Load (or, the first time on a machine, compile: ~10 s) the planner's numba kernels by running them
    on a tiny problem, so that compiling never eats into a plan's time limit. Returns the seconds spent;
    0 after the first call in a process."""
    global _kernels_ready
    if _kernels_ready:
        return 0.0
    t0 = time.perf_counter()
    frame = pd.DataFrame({"id": ["a", "b", "c"], "lower": [0, 1, 2], "upper": [2, 3, 4], "size": [4, 2, 4]})
    tiny = as_problem(frame)
    offsets = run_heuristic(tiny, "greedy_size_best_fit")
    validate_plan(tiny, offsets)
    exact.solve_exact(tiny, tiny.max_live(), time_limit_s=60.0)
    _kernels_ready = True
    return time.perf_counter() - t0


def plan(source, time_limit_s: float = 5.0, alignment: int = 1, iteration: int | None = None,
         device: str | None = None, exact_search: bool = True, started_at: float | None = None) -> PlanResult:
    """Plan static offsets for a Trace, a buffer DataFrame/CSV path or a PlanProblem.

    `time_limit_s` bounds the whole call end to end (s): reading the input, loading the compiled kernels,
    the heuristics, the conflict graph, the search and the final validation; the clock starts at
    `started_at` (a `time.perf_counter()` value, e.g. when a command began) or at the call. The stages
    share the time: the heuristics stop when it runs out (those not done are listed in ``skipped``), the
    search stages get what is left, and time for the validation is kept back. Below the time one plan
    takes (reading the input, online best-fit, validation; a first-ever run also compiles the kernels,
    ~10 s) the limit cannot hold: the result is then that one plan. `alignment` (bytes) applies to every
    offset; `iteration` plans one iteration of a trace with iteration marks; `device` picks the device
    of a multi-device trace (default: the one with the largest peak). The result is validated.
    """
    t0 = time.perf_counter() if started_at is None else started_at
    # bad input fails before the kernels are compiled (that can take seconds on a cold cache)
    problem = as_problem(source, device=device, iteration=iteration, alignment=alignment)
    load_kernels()
    max_live = problem.max_live()
    best = _Best(problem)
    scores: dict[str, int] = {}
    skipped: list[str] = []
    timings: dict[str, float] = {}
    deadline = t0 + time_limit_s - _validation_reserve_s(problem)
    for name, offsets in _run_heuristics(problem, heuristic_names(problem), 0.0, skipped, deadline=deadline,
                                         timings=timings):
        scores[name] = best.offer(offsets, name)
    # an empty-lifetime buffer conflicts with nothing but still needs its bytes
    lower = max(max_live, int(problem.size.max(initial=0)))
    # the search stages need the conflict graph: skip them when building it would overrun the limit
    if 4 * graph_cost_estimate_s(problem)[0] > deadline - time.perf_counter():
        deadline = time.perf_counter()
    if best.height > lower and deadline > time.perf_counter():
        repaired = repair_peak(problem, best.offsets, target=lower,
                               time_limit_s=min(0.2 * time_limit_s, deadline - time.perf_counter()))
        best.offer(repaired, f"peak_repair({best.algorithm})")
    if best.height > lower and exact_search and problem.n <= EXACT_MAX_BUFFERS and deadline > time.perf_counter():
        lower = _exact_stage(problem, best, lower, min(deadline, t0 + 0.6 * time_limit_s))
    # the local search starts with one full placement (not interruptible): only worth starting when a few
    # more fit in the time; a full placement takes what the slowest heuristic took (or the estimate)
    placement_s = max([v for k, v in timings.items() if k != "online_best_fit"] or
                      [2 * graph_cost_estimate_s(problem)[1]])
    if best.height > lower and time.perf_counter() < deadline:
        source = best.algorithm
        left = deadline - time.perf_counter()
        share = 0.5 if 3 * placement_s < 0.5 * left else 1.0  # all of it when no local search would follow
        best.offer(window_search(problem, best.offsets, time_limit_s=share * left, target=lower),
                   f"window_search({source})")
    if best.height > lower and time.perf_counter() + 3 * placement_s < deadline:
        # start from the best plan itself: placing its buffers in offset order, each at the lowest gap,
        # reproduces it or does better (every buffer below it in the plan ends at or under its offset)
        start = np.lexsort((problem.start, best.offsets))
        source = best.algorithm
        res = improve(problem, start, "first", time_limit_s=deadline - time.perf_counter(), target=lower)
        best.offer(res.offsets, f"local_search({source})")
    validate_plan(problem, best.offsets)
    table = problem.table.copy()
    table["offset"] = best.offsets
    return PlanResult(offsets=table, height=int(best.height), lower_bound=int(lower), max_live=int(max_live),
                      algorithm=best.algorithm, optimal=bool(best.height <= lower),
                      seconds=time.perf_counter() - t0, device=problem.device, heuristics=scores,
                      skipped=skipped, problem=problem)
