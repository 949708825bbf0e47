"""The published greedy heuristics for static offset planning, as orderings plus one placement routine.

Every heuristic is "sort the buffers by some key, then place each in turn at the best (smallest
fitting) or first (lowest) gap left by the already-placed buffers that conflict with it in time":

- ``size``: largest first (TFLite's greedy memory planner, SINGA SmartMemPool, MemoMalloc) — best or first gap
- ``lifetime``: longest lifetime first (MemoMalloc "greedy by longest")
- ``area``: largest size x lifetime first
- ``breadth``: largest live bytes during the buffer's lifetime first (MemoMalloc "greedy by breadth")
- ``conflicts``: most conflicting buffers first (TVM USMP "greedy by conflicts")
- ``online``: in order of allocation, best gap among the live buffers (ONNX Runtime's arena best-fit)
- ``zhang``: buffers alive across iterations first, then by size (Zhang et al.'s SmartMemPool)
"""
from __future__ import annotations

import time

import numpy as np

from memlens.plan.problem import PlanProblem


SLICE_S = 0.02  # with a deadline, the placement runs in slices of about this many seconds


def place_in_order(problem: PlanProblem, order: np.ndarray, fit: str = "best",
                   prefix: int = 0, offsets: np.ndarray | None = None,
                   deadline: float | None = None) -> np.ndarray | None:
    """Offsets (bytes, int64) from placing buffers in `order`, each in the best or first fitting gap.

    A gap is a free address range below, between or above the placed buffers that conflict with the
    buffer in time; "best" takes the smallest gap that fits (lowest on ties), "first" the lowest. When no
    gap below the top fits, the buffer goes on top of its conflicts. With `prefix` > 0, the first
    `prefix` buffers of `order` keep their `offsets` (a previous run's) and only the rest are placed.

    With a `deadline` (a `time.perf_counter()` value), the placement runs in slices of ~20 ms (each slice
    continues from the previous one's offsets, so the result is the same) and returns None when the
    deadline passes before it is done.
    """
    if fit not in ("best", "first"):
        raise ValueError(f"fit must be 'best' or 'first', not {fit!r}")
    from memlens.plan._kernels import place

    indptr, indices = problem.conflicts()
    prefix = int(prefix) if offsets is not None else 0
    prior = _kernel_array(offsets if offsets is not None and prefix else np.zeros(problem.n, np.int64))
    size, align, order = _kernel_array(problem.size), _kernel_array(problem.alignment), _kernel_array(order)
    if deadline is None:
        return place(indptr, indices, size, align, order, fit == "best", prefix, prior)
    done, step = prefix, 512
    while True:
        if time.perf_counter() >= deadline:
            return None
        end = min(len(order), done + step)
        began = time.perf_counter()
        # placing order[:end] with order[:done] kept is the same sequence of decisions as one full run
        prior = place(indptr, indices, size, align, order[:end], fit == "best", done, prior)
        done = end
        if done >= len(order):
            return prior
        took = time.perf_counter() - began
        step = int(min(max(step * SLICE_S / max(took, 1e-5), 64), len(order)))


def _kernel_array(values) -> np.ndarray:
    """int64, contiguous and writable: one compiled signature for every caller (read-only arrays from
    pandas would otherwise compile a second copy of the kernel)."""
    return np.require(values, np.int64, ["C", "W"])


def _lifetime_max_live(problem: PlanProblem) -> np.ndarray:
    """For each buffer, the largest live bytes at any instant of its lifetime (range max, sparse table)."""
    times, live = problem.live_profile()
    if len(live) == 0:
        return np.zeros(problem.n, np.int64)
    lo = np.searchsorted(times, problem.start, side="right") - 1
    hi = np.searchsorted(times, problem.end, side="left") - 1  # last section inside [start, end)
    lo = np.clip(lo, 0, len(live) - 1)
    hi = np.clip(np.maximum(hi, lo), 0, len(live) - 1)
    table = [live]
    span = 1
    while 2 * span <= len(live):
        prev = table[-1]
        table.append(np.maximum(prev[:-span], prev[span:]))
        span *= 2
    length = hi - lo + 1
    level = np.floor(np.log2(length)).astype(np.int64)
    out = np.zeros(problem.n, np.int64)
    for lv in np.unique(level):
        sel = level == lv
        t = table[lv]
        out[sel] = np.maximum(t[lo[sel]], t[hi[sel] - (1 << lv) + 1])
    return out


def _order(*keys_last_primary: np.ndarray) -> np.ndarray:
    """np.lexsort with the buffer index as the final tie-break, so orders are deterministic."""
    n = len(keys_last_primary[0])
    return np.lexsort((np.arange(n),) + keys_last_primary)


def order_by(problem: PlanProblem, key: str) -> np.ndarray:
    """The buffer order of heuristic `key` (see the module docstring), as an index array."""
    size = problem.size.astype(np.float64)
    length = (problem.end - problem.start).astype(np.float64)
    if key == "size":
        return _order(-length, -size)
    if key == "lifetime":
        return _order(-size, -length)
    if key == "area":
        return _order(-size, -size * length)
    if key == "breadth":
        return _order(-size, -_lifetime_max_live(problem).astype(np.float64))
    if key == "conflicts":
        indptr, _ = problem.conflicts()
        return _order(-size, -np.diff(indptr).astype(np.float64))
    if key == "online":
        return _order(-size, problem.start)
    if key == "zhang":
        cross = problem.table.get("cross_iteration")
        first = np.zeros(problem.n) if cross is None else -cross.to_numpy(dtype=np.float64)
        return _order(-length, -size, first)
    raise ValueError(f"unknown heuristic order {key!r}")


# (name, order key, fit) of the published heuristics, in the order the portfolio tries them
HEURISTICS: tuple[tuple[str, str, str], ...] = (
    ("online_best_fit", "online", "best"),  # first: it needs no conflict graph (see online.py)
    ("greedy_size_best_fit", "size", "best"),
    ("greedy_area_best_fit", "area", "best"),
    ("greedy_breadth_best_fit", "breadth", "best"),
    ("greedy_size_first_fit", "size", "first"),
    ("greedy_lifetime_best_fit", "lifetime", "best"),
    ("greedy_conflicts_best_fit", "conflicts", "best"),
)


def plan_height(problem: PlanProblem, offsets: np.ndarray) -> int:
    """Arena height of a plan: the highest buffer end, in bytes."""
    return int((offsets + problem.size).max(initial=0))


def run_heuristic(problem: PlanProblem, name: str, deadline: float | None = None) -> np.ndarray | None:
    """Offsets of the named heuristic (a name in `HEURISTICS`); None when a `deadline` (a
    `time.perf_counter()` value) passes before a graph-based heuristic is done (online best-fit, which
    needs no conflict graph, always finishes)."""
    if name == "online_best_fit" and not (problem.alignment > 1).any():
        from memlens.plan.online import online_best_fit
        return online_best_fit(problem)  # same offsets as the generic placement, without the conflict graph
    for hname, key, fit in HEURISTICS:
        if hname == name:
            return place_in_order(problem, order_by(problem, key), fit, deadline=deadline)
    if name == "zhang_size_best_fit":
        return place_in_order(problem, order_by(problem, "zhang"), "best", deadline=deadline)
    raise ValueError(f"unknown heuristic {name!r}")


def graph_cost_estimate_s(problem: PlanProblem) -> tuple[float, float]:
    """(seconds to build the conflict graph, seconds per graph-based heuristic), rough estimates from the
    buffer count and the number of conflicting pairs (`PlanProblem.conflict_pairs`).

    Calibrated on a 2-core machine with `benchmarks/plan_speed.py`: 61,752 buffers and 33M pairs build in
    0.3 s and place in 0.6-1.9 s per heuristic (the per-buffer sort of placed neighbours dominates).
    """
    pairs = problem.conflict_pairs()
    build = 0.0 if problem._conflicts is not None else 1.5e-8 * pairs + 1e-6 * problem.n
    return build, 6e-8 * pairs + 2e-6 * problem.n


def heuristic_names(problem: PlanProblem) -> list[str]:
    """The heuristics that apply to `problem` (Zhang's order only when some buffer crosses iterations)."""
    names = [h[0] for h in HEURISTICS]
    cross = problem.table.get("cross_iteration")
    if cross is not None and bool(cross.any()):
        names.insert(1, "zhang_size_best_fit")
    return names

