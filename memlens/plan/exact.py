"""Exact static planning by depth-first search over canonical solutions (after MiniMalloc, Moffitt 2023).

The search answers "do all buffers fit under `capacity` bytes?" and builds solutions bottom-up:

- canonical solutions only: every buffer sits at its *minimum offset* (the highest top of the placed
  buffers it conflicts with), and buffers are placed in non-decreasing offset order; ties are broken by a
  static preorder, so each canonical solution is reached once;
- dominance: a buffer is never placed at or above the top of another unplaced buffer (that one could go
  underneath first, so the gap would be wasted);
- section inference: the time axis is cut into sections at every start/end; in each section, the floor
  (highest placed top, or the lowest minimum offset of its unplaced buffers) plus the unplaced bytes must
  fit under the capacity;
- hatless pruning: when the buffer just placed conflicts with no unplaced buffer, no sibling choice can do
  better, so a failure below it fails the node;
- temporal decomposition: when no unplaced buffer spans a section boundary, the two sides are solved
  independently.

Preorders are tried round-robin with a doubling node budget, as MiniMalloc does. Implemented from the
paper's description; the state updates are vectorised with numpy over sections and conflict lists.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from memlens.plan.problem import PlanProblem

FOUND, INFEASIBLE, ABORTED, TIMEOUT = "found", "infeasible", "aborted", "timeout"
_INF = np.iinfo(np.int64).max // 4
# largest section x member block refreshed per try for the unallocated-floor bound (elements)
_REFINE_CAP = 40_000
# largest number of (section, buffer) memberships kept for that bound
_MEMBERS_CAP = 30_000_000


@dataclass
class ExactResult:
    """Outcome of one decision search: `status` is found / infeasible / timeout; `offsets` when found."""

    status: str
    offsets: np.ndarray | None
    nodes: int
    seconds: float


class _Timeout(Exception):
    """The search ran past its deadline."""


class _NodeLimit(Exception):
    """The search expanded more nodes than it was allowed."""


class _Search:
    """The state of one decision search; see the module docstring for the rules."""

    def __init__(self, problem: PlanProblem, capacity: int, deadline: float):
        self.p = problem
        self.capacity = int(capacity)
        self.deadline = deadline
        act = problem.active
        self.buffers = np.flatnonzero(act)
        times = np.unique(np.concatenate([problem.start[act], problem.end[act]]))
        self.sec_lo = np.searchsorted(times, problem.start)
        self.sec_hi = np.searchsorted(times, problem.end)
        n_sec = max(len(times) - 1, 0)
        self.size = problem.size
        self.align = problem.alignment
        total = np.zeros(n_sec + 1, np.int64)
        np.add.at(total, self.sec_lo[act], problem.size[act])
        np.add.at(total, self.sec_hi[act], -problem.size[act])
        self.total = np.cumsum(total)[:n_sec]
        self.floor = np.zeros(n_sec, np.int64)
        cuts = np.zeros(n_sec + 1, np.int64)
        np.add.at(cuts, self.sec_lo[act] + 1, 1)
        np.add.at(cuts, self.sec_hi[act], -1)
        self.cuts = np.cumsum(cuts)[:n_sec]  # cuts[k]: buffers spanning the boundary before section k
        self.indptr, self.indices = problem.conflicts()
        # min offset of each unplaced buffer, _INF once placed; the extra last slot pads `members`
        self.left_min = np.append(np.where(act, 0, _INF), _INF)
        self.off = np.full(problem.n, -1, np.int64)
        self.solution = np.zeros(problem.n, np.int64)
        # the buffers alive in each section, padded with the sentinel index n (for the unallocated floor);
        # left out (no refinement) when the table would be too large
        span = np.where(act, self.sec_hi - self.sec_lo, 0)
        diff = np.zeros(n_sec + 1, np.int64)
        np.add.at(diff, self.sec_lo[act], 1)
        np.add.at(diff, self.sec_hi[act], -1)
        width = np.cumsum(diff)[:n_sec]
        if int(span.sum()) <= _MEMBERS_CAP:
            buf = np.repeat(np.arange(problem.n, dtype=np.int32), span)
            sec = np.arange(len(buf)) - np.repeat(np.cumsum(span) - span, span) + self.sec_lo[buf]
            self.members = np.full((n_sec, int(width.max(initial=0))), problem.n, np.int32)
            by_sec = np.argsort(sec, kind="stable")
            col = np.arange(len(sec)) - np.repeat(np.cumsum(width) - width, width)
            self.members[sec[by_sec], col] = buf[by_sec]
        else:
            self.members = np.full((n_sec, 0), problem.n, np.int32)
        # per buffer: its neighbours, and (section span, span of the sections its placement can affect)
        self.sizes = problem.size.tolist()
        self.aligned = bool((problem.alignment > 1).any())
        self.nbrs = [self.indices[self.indptr[i]:self.indptr[i + 1]] for i in range(problem.n)]
        self.spans = []
        for i in range(problem.n):
            lo, hi, nb = int(self.sec_lo[i]), int(self.sec_hi[i]), self.nbrs[i]
            ra, rb = lo, hi
            if len(nb):
                ra, rb = min(lo, int(self.sec_lo[nb].min())), max(hi, int(self.sec_hi[nb].max()))
            width = self.members.shape[1]
            if width == 0:
                ra, rb = lo, lo
            elif (rb - ra) * width > _REFINE_CAP:  # too wide to refresh at every try: b's own sections only
                ra, rb = (lo, hi) if (hi - lo) * width <= _REFINE_CAP else (lo, lo)
            self.spans.append((lo, hi, ra, rb))
        self.nodes = 0
        self.node_budget = _INF
        self.keys: dict[str, np.ndarray] = {}
        self._initial = (self.total.copy(), self.cuts.copy())

    def reset(self) -> None:
        """Back to the empty assignment (an aborted search leaves its state half-updated)."""
        self.total, self.cuts = self._initial[0].copy(), self._initial[1].copy()
        self.floor[:] = 0
        self.left_min = np.append(np.where(self.p.active, 0, _INF), _INF)
        self.off[:] = -1
        self.nodes = 0

    def solve_all(self, heuristic: str) -> bool:
        """Solve every initially independent time partition; True when all fit."""
        n_sec = len(self.floor)
        zero = (np.flatnonzero(self.cuts[1:] == 0) + 1).tolist()
        bounds = [0] + zero + [n_sec]
        for a, c in zip(bounds[:-1], bounds[1:]):
            b = self.buffers
            part = b[(self.sec_lo[b] < c) & (self.sec_hi[b] > a)]
            if len(part) and not self.solve_partition(part, a, c, heuristic):
                return False
        return True

    # ---- preorders ------------------------------------------------------------------------------
    def preorder(self, buffers: np.ndarray, heuristic: str) -> np.ndarray:
        """`buffers` sorted by a MiniMalloc-style key string: W width (sections), A area, T section total."""
        p = self.p
        if "T" not in self.keys:
            sec_total = self.total
            # largest section total over each buffer's span (sparse table range max)
            table = [sec_total]
            span = 1
            while 2 * span <= len(sec_total):
                table.append(np.maximum(table[-1][:-span], table[-1][span:]))
                span *= 2
            lo, hi = self.sec_lo, np.maximum(self.sec_hi - 1, self.sec_lo)
            lv = np.floor(np.log2(np.maximum(hi - lo + 1, 1))).astype(np.int64)
            tmax = np.zeros(p.n, np.int64)
            for level in np.unique(lv[self.buffers]):
                sel = (lv == level) & p.active
                tmax[sel] = np.maximum(table[level][lo[sel]], table[level][hi[sel] - (1 << level) + 1])
            self.keys["T"] = tmax
            self.keys["W"] = (self.sec_hi - self.sec_lo).astype(np.int64)
            self.keys["A"] = p.size * (p.end - p.start)
            self.keys["Z"] = p.size
        cols = [-self.keys[c][buffers] for c in reversed(heuristic)]
        return buffers[np.lexsort([buffers] + cols)]

    # ---- search -----------------------------------------------------------------------------------
    def solve_partition(self, buffers: np.ndarray, sec_a: int, sec_b: int, heuristic: str) -> bool:
        order = self.preorder(buffers, heuristic)
        rank = np.empty(self.p.n, np.int64)
        rank[order] = np.arange(len(order))
        return self._dfs(order, rank, sec_a, sec_b, 0, -1, heuristic)

    def _check(self, a: int, b: int, offset: int) -> bool:
        return bool((np.maximum(self.floor[a:b], offset) + self.total[a:b]).max(initial=0) <= self.capacity)

    def _dfs(self, order, rank, sec_a, sec_b, last_off, last_rank, heuristic) -> bool:
        self.nodes += 1
        if self.nodes > self.node_budget:
            raise _NodeLimit
        if (self.nodes & 255) == 0 and time.perf_counter() > self.deadline:
            raise _Timeout
        left = order[self.off[order] < 0]
        if len(left) == 0:
            self.solution[order] = self.off[order]
            return True
        mo = self.left_min[left]
        srt = np.lexsort((rank[left], mo))
        left, mo = left[srt], mo[srt]
        min_height = int((mo + self.size[left]).min())
        checked_level = -1
        for b, o in zip(left.tolist(), mo.tolist()):
            if o >= min_height:
                break  # dominance: sorted by offset, so every later candidate leaves a gap too
            if o < last_off or (o == last_off and rank[b] < last_rank):
                continue  # not canonical
            if o != checked_level:
                # nothing placed from here on sits below o: if the sections cannot hold their unplaced bytes
                # above max(floor, o), neither this level nor any higher one can work
                if not self._check(sec_a, sec_b, o):
                    break
                checked_level = o
            found, hatless = self._try(b, o, order, rank, sec_a, sec_b, heuristic)
            if found:
                return True
            if hatless:
                return False
        return False

    def _try(self, b, o, order, rank, sec_a, sec_b, heuristic) -> tuple[bool, bool]:
        """Place b at o, update the bounds, recurse when they hold, undo. Returns (found, hatless)."""
        z = self.sizes[b]
        top = o + z
        lo, hi, ra, rb = self.spans[b]
        off, left_min = self.off, self.left_min
        off[b] = o
        nb = self.nbrs[b]
        nb = nb[off[nb] < 0]
        hatless = len(nb) == 0
        old_min = left_min[nb]
        if self.aligned:
            a = self.align[nb]
            raised = np.maximum(old_min, -(-top // a) * a)
        else:
            raised = np.maximum(old_min, top)
        left_min[b] = _INF
        left_min[nb] = raised
        self.total[lo:hi] -= z
        old_floor = self.floor[lo:hi].copy()
        self.floor[lo:hi] = top
        # the unallocated floor: in every section b's placement can affect (b's span and its neighbours'
        # spans, when that is small enough to refresh), no unplaced buffer can sit below its minimum offset
        saved = None
        if ra < rb:
            seg = self.floor[ra:rb]
            saved = seg.copy()
            sec_min = left_min[self.members[ra:rb]].min(axis=1)
            sec_min[sec_min == _INF] = 0
            np.maximum(seg, sec_min, out=seg)
        found = False
        ca, cb = max(min(ra, lo), sec_a), min(max(rb, hi), sec_b)
        # outside [ca, cb) nothing changed, and the level check at o already covered it
        if (np.maximum(self.floor[ca:cb], o) + self.total[ca:cb]).max(initial=0) <= self.capacity:
            found = self._descend(b, lo, hi, order, rank, sec_a, sec_b, o, heuristic)
        if saved is not None:
            self.floor[ra:rb] = saved
        self.floor[lo:hi] = old_floor
        left_min[nb] = old_min
        left_min[b] = o
        self.total[lo:hi] += z
        off[b] = -1
        return found, hatless

    def _descend(self, b, lo, hi, order, rank, sec_a, sec_b, o, heuristic) -> bool:
        """Recurse after placing b, splitting into independent partitions where no cut remains."""
        self.cuts[lo + 1:hi] -= 1
        try:
            zero = np.flatnonzero(self.cuts[lo + 1:hi] == 0) + lo + 1
            if len(zero) == 0:
                return self._dfs(order, rank, sec_a, sec_b, o, int(rank[b]), heuristic)
            bounds = [sec_a] + zero.tolist() + [sec_b]
            left = order[self.off[order] < 0]
            for a, c in zip(bounds[:-1], bounds[1:]):
                part = left[(self.sec_lo[left] < c) & (self.sec_hi[left] > a)]
                if len(part) and not self.solve_partition(part, a, c, heuristic):
                    return False
            self.solution[order] = np.where(self.off[order] >= 0, self.off[order], self.solution[order])
            return True
        finally:
            self.cuts[lo + 1:hi] += 1


PREORDERS = ("WAT", "TAW", "TWA")


def solve_exact(problem: PlanProblem, capacity: int, time_limit_s: float = 10.0,
                preorders: tuple[str, ...] = PREORDERS) -> ExactResult:
    """Decide whether every buffer fits below `capacity` bytes; return offsets when it does.

    `status` is "found", "infeasible" (proven: no plan fits) or "timeout".
    """
    t0 = time.perf_counter()
    search = _Search(problem, capacity, t0 + time_limit_s)
    n_sec = len(search.floor)
    if problem.n == 0 or len(search.buffers) == 0:
        return ExactResult(FOUND, np.zeros(problem.n, np.int64), 0, 0.0)
    if (search.total > capacity).any() or (problem.size > capacity).any():
        return ExactResult(INFEASIBLE, None, 0, time.perf_counter() - t0)
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 20 * problem.n + 1000))
    budget = max(problem.n, 64)
    try:
        while True:
            budget *= 2
            for heuristic in preorders:
                search.reset()
                search.node_budget = budget
                try:
                    ok = search.solve_all(heuristic)
                except _NodeLimit:
                    continue
                status = FOUND if ok else INFEASIBLE
                return ExactResult(status, search.solution.copy() if ok else None, search.nodes,
                                   time.perf_counter() - t0)
    except _Timeout:
        return ExactResult(TIMEOUT, None, search.nodes, time.perf_counter() - t0)
    finally:
        sys.setrecursionlimit(old_limit)
