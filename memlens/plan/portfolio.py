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
Problems above `EXACT_MAX_BUFFERS` skip stage 3. The numba kernels are compiled (first run on a machine)
or loaded before the clock starts (`load_kernels`).
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
# the heuristics run within max(time_limit_s, this) seconds; on instances so large that some are estimated
# not to fit they are skipped (online best-fit, which needs no conflict graph, always runs). 62,000
# buffers of a training trace need about 5 s on 2 cores, so every heuristic runs there.
MIN_HEURISTIC_BUDGET_S = 8.0


@dataclass
class PlanResult:
    """A validated static plan.

    `offsets`: one row per buffer (id, lower, upper, size, offset and attribution columns when the source
    has them); `height` (bytes): the arena size the plan needs; `lower_bound` (bytes): max-live, or higher
    when the exact search proved that no plan fits below it; `ratio` = height / max-live; `algorithm`:
    the method that produced the plan; `optimal`: height proven minimal; `seconds`: wall time (after
    `load_kernels`, which compiles the numba kernels once per machine).
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


def _run_heuristics(problem: PlanProblem, names: list[str], budget_s: float,
                    skipped: list[str]) -> list[tuple[str, np.ndarray]]:
    """(name, offsets) of each heuristic in `names` order, run concurrently on the machine's cores.

    The compiled placement releases the GIL, so the graph-based heuristics run in a thread pool while
    online best-fit (pure Python, no conflict graph) runs in this thread. Heuristics estimated not to
    finish within `budget_s` seconds are appended to `skipped` instead (online best-fit always runs).
    """
    graph_free = [n for n in names if n == "online_best_fit" and not (problem.alignment > 1).any()]
    graph_names = [n for n in names if n not in graph_free]
    workers = max(1, min(len(graph_names), os.cpu_count() or 1))
    build, per = graph_cost_estimate_s(problem)
    rounds = int(max(budget_s - build, 0.0) // max(per, 1e-9))
    fits = rounds * workers if graph_free else max(rounds * workers, 1)  # at least one heuristic runs
    run_now, skipped[len(skipped):] = graph_names[:fits], graph_names[fits:]
    results: dict[str, np.ndarray] = {}
    if run_now:
        problem.conflicts()  # built once, before the threads share it
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memlens-plan") as pool:
            futures = {name: pool.submit(run_heuristic, problem, name) for name in run_now}
            results.update({name: run_heuristic(problem, name) for name in graph_free})
            results.update({name: f.result() for name, f in futures.items()})
    else:
        results.update({name: run_heuristic(problem, name) for name in graph_free})
    return [(name, results[name]) for name in names if name in results]


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
         device: str | None = None, exact_search: bool = True) -> PlanResult:
    """Plan static offsets for a Trace, a buffer DataFrame/CSV path or a PlanProblem.

    `time_limit_s` bounds the whole search (s); the heuristics get at least `MIN_HEURISTIC_BUDGET_S`, and
    on instances so large that they would overrun it the remaining ones are skipped (listed in
    ``skipped``); `alignment` (bytes) applies to every offset; `iteration` plans one iteration of a trace
    with iteration marks; `device` picks the device of a multi-device trace (default: the one with the
    largest peak). The result is validated.
    """
    # bad input fails before the kernels are compiled (that can take seconds on a cold cache)
    problem = as_problem(source, device=device, iteration=iteration, alignment=alignment)
    load_kernels()
    t0 = time.perf_counter()
    max_live = problem.max_live()
    best = _Best(problem)
    scores: dict[str, int] = {}
    skipped: list[str] = []
    budget = max(time_limit_s, MIN_HEURISTIC_BUDGET_S)
    for name, offsets in _run_heuristics(problem, heuristic_names(problem), budget, skipped):
        scores[name] = best.offer(offsets, name)
    # an empty-lifetime buffer conflicts with nothing but still needs its bytes
    lower = max(max_live, int(problem.size.max(initial=0)))
    deadline = t0 + time_limit_s
    # the search stages need the conflict graph: skip them when building it would overrun the limit
    if graph_cost_estimate_s(problem)[0] > deadline - time.perf_counter():
        deadline = time.perf_counter()
    if best.height > lower and deadline > time.perf_counter():
        repaired = repair_peak(problem, best.offsets, target=lower,
                               time_limit_s=min(0.2 * time_limit_s, deadline - time.perf_counter()))
        best.offer(repaired, f"peak_repair({best.algorithm})")
    if best.height > lower and exact_search and problem.n <= EXACT_MAX_BUFFERS and deadline > time.perf_counter():
        lower = _exact_stage(problem, best, lower, min(deadline, t0 + 0.6 * time_limit_s))
    if best.height > lower and time.perf_counter() < deadline:
        source = best.algorithm
        left = deadline - time.perf_counter()
        best.offer(window_search(problem, best.offsets, time_limit_s=0.5 * left, target=lower),
                   f"window_search({source})")
    # the local search starts with one full placement: only worth starting when a few more fit in the time
    if best.height > lower and time.perf_counter() + 3 * graph_cost_estimate_s(problem)[1] < deadline:
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
