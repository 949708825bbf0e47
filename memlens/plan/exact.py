"""Exact static planning by depth-first search over canonical solutions (after MiniMalloc, Moffitt 2023).

The search answers "do all buffers fit under `capacity` bytes?" and builds solutions bottom-up:

- canonical solutions only: every buffer sits at its *minimum offset* (the highest top of the placed
  buffers it conflicts with, rounded up to its alignment), and buffers are placed in non-decreasing
  offset order; ties are broken by a static preorder, so each canonical solution is reached once;
- dominance: a buffer is never placed at or above the top of another unplaced buffer (that one could go
  underneath first, so the gap would be wasted);
- section inference: time is cut into sections (the buffers alive just before each distinct end time,
  MiniMalloc's cross sections); in each, the floor (the highest of: the offset being placed, the tops
  placed there, the lowest minimum offset of its unplaced buffers) plus the unplaced bytes must fit
  under the capacity. It is checked after every placement, and once per new offset level before that
  level's candidates are tried: nothing placed later sits lower, so a level that fails fails the node;
- a placement fails at once when it pushes a conflicting buffer's minimum offset so high that the buffer
  no longer fits under the capacity;
- hatless pruning: when the buffer just placed conflicts with no unplaced buffer, no sibling choice can do
  better, so a failure below it fails the node;
- symmetry breaking: of identical buffers (same lifetime, size and alignment; ranked next to each other),
  the lower-ranked one is always placed first, since swapping two of them changes no plan's shape;
- temporal decomposition: when no unplaced buffer spans a section boundary any more, the two sides are
  solved independently, each with its own preorder.

Preorders are tried round-robin with a doubling node budget, as MiniMalloc does. Implemented from the
paper's description. The search itself is the compiled, resumable kernel in `_exact_kernel.py`; this
module builds its arrays and drives it in slices, checking the clock between slices.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from memlens.plan.problem import PlanProblem

FOUND, INFEASIBLE, ABORTED, TIMEOUT = "found", "infeasible", "aborted", "timeout"
PREORDERS = ("WAT", "TAW", "TWA")
# static preorder keys, all sorted descending (MiniMalloc's letters): W lifetime width, A area (bytes x
# time), Z size, C sections spanned, L lower (start), U upper (end), O overlaps; T (the largest current
# section total over the buffer's span) is computed when a partition is solved
STATIC_KEYS = "WAZCLUO"
# most (section x member) entries rescanned per placement for the unallocated floor; wider refreshes are
# skipped (the floor stays a valid but weaker bound)
REFINE_CAP = 10_000
# most (section, buffer) memberships kept for that refresh on very long traces
MEMBERS_CAP = 30_000_000
# target wall time of one kernel slice between clock checks (s)
SLICE_S = 0.02
# initial room beyond one placement (trail rows) and one split (heap slots); both grow on demand
TRAIL_SLACK = 1 << 14
HEAP_SLACK = 1 << 12


@dataclass
class ExactResult:
    """Outcome of one decision search: `status` is found / infeasible / timeout; `offsets` when found.

    `nodes`: search nodes entered over all attempts; `tries`: placements tried; `seconds`: wall time.
    """

    status: str
    offsets: np.ndarray | None
    nodes: int
    seconds: float
    tries: int = 0


class _Instance:
    """The kernel's read-only arrays for the active buffers of a problem (renumbered 0..m-1)."""

    def __init__(self, problem: PlanProblem):
        act = np.flatnonzero(problem.active)
        self.active = act
        m = self.m = len(act)
        start, end = problem.start[act], problem.end[act]
        self.size = problem.size[act].astype(np.int64)
        self.align = problem.alignment[act].astype(np.int64)
        # section k: the buffers alive just before the k-th distinct end time
        ends = np.unique(end)
        S = self.n_sec = len(ends)
        self.slo = np.searchsorted(ends, start, side="right").astype(np.int64)
        self.shi = np.searchsorted(ends, end, side="right").astype(np.int64)
        total = np.zeros(S + 1, np.int64)
        np.add.at(total, self.slo, self.size)
        np.add.at(total, self.shi, -self.size)
        self.total = np.cumsum(total)[:S]
        # cuts[k]: buffers spanning the boundary between sections k-1 and k
        cuts = np.zeros(S + 1, np.int64)
        np.add.at(cuts, self.slo + 1, 1)
        np.add.at(cuts, self.shi, -1)
        self.cuts = np.cumsum(cuts)[:S]
        span = self.shi - self.slo
        diff = np.zeros(S + 1, np.int64)
        np.add.at(diff, self.slo, 1)
        np.add.at(diff, self.shi, -1)
        width = np.cumsum(diff)[:S]
        wcum = np.concatenate([[0], np.cumsum(width)]).astype(np.int64)
        if int(span.sum()) <= MEMBERS_CAP:
            from memlens.plan._exact_kernel import section_members

            self.sec_mem = section_members(self.slo, self.shi, wcum)
            self.sec_ptr = wcum
            self.refine_cap = REFINE_CAP
        else:
            self.sec_mem = np.zeros(0, np.int32)
            self.sec_ptr = np.zeros(S + 1, np.int64)
            self.refine_cap = -1  # never refresh (every range costs more than -1)
        # the conflict graph on the renumbered buffers (rows of inactive buffers are empty)
        indptr, indices = problem.conflicts()
        renumber = np.full(problem.n, -1, np.int64)
        renumber[act] = np.arange(m)
        self.nb_ptr = np.append(indptr[act], indptr[-1]).astype(np.int64) if m else np.zeros(1, np.int64)
        self.nb_idx = renumber[indices].astype(np.int32)
        deg = np.diff(self.nb_ptr)
        life = end - start
        self.skeys = np.stack([life, self.size * life, self.size, span, start, end, deg], axis=1)
        self.skeys = self.skeys.astype(np.int64)
        self.place_room = int(3 + deg.max(initial=0) + 2 * S)
        # preorder ties: start, end, size, alignment, so identical buffers rank next to each other, and
        # each buffer's identical predecessor (or -1), which the search places first (symmetry breaking)
        self.ties = np.stack([start, end, self.size, self.align], axis=1).astype(np.int64)
        self.twin = np.full(m, -1, np.int64)
        if m:
            by = np.lexsort((np.arange(m), self.align, self.size, end, start))
            same = (np.diff(self.ties[by], axis=0) == 0).all(axis=1)
            self.twin[by[1:][same]] = by[:-1][same]
        self.split_room = int(m + S + 4)

    def heuristic(self, letters: str) -> np.ndarray:
        """Kernel key codes for a preorder string such as "WAT"."""
        codes = []
        for ch in letters:
            if ch == "T":
                codes.append(-1)
            elif ch in STATIC_KEYS:
                codes.append(STATIC_KEYS.index(ch))
            else:
                raise ValueError(f"unknown preorder key {ch!r} in {letters!r} (known: T{STATIC_KEYS})")
        return np.array(codes, np.int64)


class _Attempt:
    """The mutable state of one search attempt (one preorder, one node budget)."""

    def __init__(self, inst: _Instance, trail: np.ndarray, heap: np.ndarray):
        from memlens.plan import _exact_kernel as k

        m, S = inst.m, inst.n_sec
        self.off = np.full(m, -1, np.int64)
        self.min_off = np.zeros(m, np.int64)
        self.floor = np.zeros(S, np.int64)
        self.total = inst.total.copy()
        self.cuts = inst.cuts.copy()
        self.sol = np.zeros(m, np.int64)
        self.stamp = np.full(S, -1, np.int64)  # sections queued for a floor refresh at try `stamp`
        self.dirty = np.zeros(S, np.int64)
        self.trail, self.heap = trail, heap
        self.rec = np.zeros((2 * m + 4, k.N_FIELDS), np.int64)
        self.regs = np.zeros(k.N_REGS, np.int64)
        # the root SPLIT: every buffer as its source list, then the initial cut points
        cut_at = np.flatnonzero(self.cuts[1:] == 0) + 1
        points = np.concatenate([[0], cut_at, [S]])
        heap[:m] = np.arange(m)
        heap[m:m + len(points)] = points
        self.rec[0, [0, 1, 2, 3, 4, 5, 10]] = [k.SPLIT, 0, m, m, len(points), 0, m]
        self.regs[[k.R_SP, k.R_MODE, k.R_HEAP]] = [1, k.ADVANCE, m]


def _grow(a: np.ndarray) -> np.ndarray:
    bigger = np.zeros((2 * a.shape[0],) + a.shape[1:], a.dtype)
    bigger[:a.shape[0]] = a
    return bigger


def _run_attempt(inst: _Instance, state: _Attempt, heur: np.ndarray, capacity: int, limit: int,
                 deadline: float) -> tuple[str, int, int]:
    """Search with one preorder until found / infeasible / node limit (aborted) / deadline (timeout)."""
    from memlens.plan import _exact_kernel as k

    state.regs[k.R_LIMIT] = limit
    slice_nodes = 16
    while True:
        t = time.perf_counter()
        code = k.run(inst.size, inst.align, inst.slo, inst.shi, inst.nb_ptr, inst.nb_idx, inst.sec_ptr,
                     inst.sec_mem, inst.skeys, inst.ties, inst.twin, heur, capacity, inst.refine_cap,
                     state.off, state.min_off, state.floor, state.total, state.cuts, state.sol, state.trail,
                     state.heap, state.rec, state.regs, slice_nodes, inst.place_room, inst.split_room,
                     state.stamp, state.dirty)
        nodes, tries = int(state.regs[k.R_NODES]), int(state.regs[k.R_TRIES])
        if code == k.NEED_TRAIL:
            state.trail = _grow(state.trail)
        elif code == k.NEED_HEAP:
            state.heap = _grow(state.heap)
        elif code != k.PAUSED:
            return {k.FOUND: FOUND, k.INFEASIBLE: INFEASIBLE, k.ABORTED: ABORTED}[code], nodes, tries
        now = time.perf_counter()
        if now > deadline:
            return TIMEOUT, nodes, tries
        # aim each slice at SLICE_S of wall time, growing at most 4x per slice
        rate = slice_nodes / max(now - t, 1e-6)
        slice_nodes = int(min(max(rate * SLICE_S, 64), 4 * slice_nodes, 1 << 24))


def solve_exact(problem: PlanProblem, capacity: int, time_limit_s: float = 10.0,
                preorders: tuple[str, ...] = PREORDERS) -> ExactResult:
    """Decide whether every buffer fits below `capacity` bytes; return offsets (bytes) when it does.

    `status` is "found", "infeasible" (proven: no plan fits) or "timeout" (after `time_limit_s` seconds).
    `preorders`: MiniMalloc preorder strings (letters of `STATIC_KEYS` and T), tried round-robin.
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    capacity = int(capacity)
    inst = _Instance(problem)
    offsets = np.zeros(problem.n, np.int64)
    if inst.m == 0:
        return ExactResult(FOUND, offsets, 0, time.perf_counter() - t0)
    if (inst.total > capacity).any() or (inst.size > capacity).any():
        return ExactResult(INFEASIBLE, None, 0, time.perf_counter() - t0)
    heurs = [inst.heuristic(h) for h in preorders]
    trail = np.zeros((inst.place_room + TRAIL_SLACK, 3), np.int64)
    heap = np.zeros(inst.m + inst.split_room + HEAP_SLACK, np.int64)
    nodes = tries = 0
    limit = inst.m
    while True:
        limit *= 2
        for heur in heurs:
            state = _Attempt(inst, trail, heap)
            status, n, t = _run_attempt(inst, state, heur, capacity, limit, deadline)
            nodes, tries = nodes + n, tries + t
            trail, heap = state.trail, state.heap
            if status == ABORTED:
                continue
            if status == FOUND:
                offsets[inst.active] = state.sol
                return ExactResult(FOUND, offsets, nodes, time.perf_counter() - t0, tries)
            return ExactResult(status, None, nodes, time.perf_counter() - t0, tries)
