"""Check a static plan: offsets aligned and non-negative, and no two buffers sharing an address while
both are alive (half-open lifetimes).

The check replays allocs and frees in time order, keeping the live buffers in a list sorted by offset:
a new buffer must end at or below its successor's offset and start at or above its predecessor's top.
(When the live buffers never overlap, any overlap with a new one shows up at one of its two neighbours.)
It uses neither the conflict graph nor the placement code of the planners, so it does not share their
blind spots.
"""
from __future__ import annotations

import numba
import numpy as np

from memlens.errors import MemlensError
from memlens.plan.problem import PlanProblem


class InvalidPlanError(MemlensError, AssertionError):
    """A plan places two live buffers at overlapping addresses, or breaks an alignment."""


@numba.njit(cache=True, nogil=True)
def _overlapping_pairs(events: np.ndarray, is_alloc: np.ndarray, offset: np.ndarray, size: np.ndarray,
                       limit: int) -> np.ndarray:
    """Up to `limit` (earlier, later) buffer pairs live at once at overlapping addresses, replaying
    `events` (buffer indices in time order, frees first at equal times)."""
    live = np.empty(len(offset), np.int64)  # live buffers sorted by offset
    count = 0
    found = np.empty((limit, 2), np.int64)
    k = 0
    for e in range(len(events)):
        b = events[e]
        o = offset[b]
        pos = np.searchsorted(offset[live[:count]], o)
        if not is_alloc[e]:
            while live[pos] != b:  # equal offsets can only come from an overlap already reported
                pos += 1
            live[pos:count - 1] = live[pos + 1:count].copy()
            count -= 1
            continue
        if pos > 0 and offset[live[pos - 1]] + size[live[pos - 1]] > o and k < limit:
            found[k, 0] = live[pos - 1]
            found[k, 1] = b
            k += 1
        if pos < count and offset[live[pos]] < o + size[b] and k < limit:
            found[k, 0] = live[pos]
            found[k, 1] = b
            k += 1
        live[pos + 1:count + 1] = live[pos:count].copy()
        live[pos] = b
        count += 1
    return found[:k]


def plan_violations(problem: PlanProblem, offsets: np.ndarray, limit: int = 10) -> list[str]:
    """Up to `limit` human-readable violations of `offsets` (bytes) for `problem`; empty when valid."""
    offsets = np.asarray(offsets, dtype=np.int64)
    out: list[str] = []
    if offsets.shape != (problem.n,):
        return [f"expected {problem.n} offsets, got {offsets.shape}"]
    ids = problem.table["id"].to_numpy()
    for i in np.flatnonzero(offsets < 0)[:limit]:
        out.append(f"buffer {ids[i]} has a negative offset {offsets[i]}")
    for i in np.flatnonzero(offsets % problem.alignment != 0)[:limit]:
        out.append(f"buffer {ids[i]} offset {offsets[i]} is not a multiple of {problem.alignment[i]}")
    act = np.flatnonzero(problem.active)
    times = np.concatenate([problem.end[act], problem.start[act]])
    is_alloc = np.concatenate([np.zeros(len(act), bool), np.ones(len(act), bool)])
    events = np.concatenate([act, act])[np.lexsort((is_alloc, times))]
    pairs = _overlapping_pairs(events.astype(np.int64), is_alloc[np.lexsort((is_alloc, times))],
                               np.require(offsets, np.int64, ["C", "W"]),
                               np.require(problem.size, np.int64, ["C", "W"]), limit)
    for i, j in pairs.tolist():
        out.append(f"buffers {ids[i]} [{problem.start[i]}, {problem.end[i]}) at {offsets[i]}+{problem.size[i]}"
                   f" and {ids[j]} [{problem.start[j]}, {problem.end[j]}) at {offsets[j]}+{problem.size[j]}"
                   " overlap in time and address")
    return out[:limit]


def validate_plan(problem: PlanProblem, offsets: np.ndarray) -> None:
    """Raise `InvalidPlanError` listing the first violations when the plan is not valid."""
    bad = plan_violations(problem, offsets)
    if bad:
        raise InvalidPlanError("invalid plan: " + "; ".join(bad))
