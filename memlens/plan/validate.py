"""Check a static plan: offsets aligned and non-negative, and no two buffers sharing an address while
both are alive (half-open lifetimes).

The check replays allocs and frees in time order, keeping the live buffers in a list sorted by offset:
a new buffer must end at or below its successor's offset and start at or above its predecessor's top.
(When the live buffers never overlap, any overlap with a new one shows up at one of its two neighbours.)
It uses neither the conflict graph nor the placement code of the planners, so it does not share their
blind spots.
"""
from __future__ import annotations

import numpy as np

from memlens.errors import MemlensError
from memlens.plan.problem import PlanProblem


class InvalidPlanError(MemlensError, AssertionError):
    """A plan places two live buffers at overlapping addresses, or breaks an alignment."""


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
    in_time = np.lexsort((is_alloc, times))  # frees first at equal times: lifetimes are half-open
    from memlens.plan._validate_kernel import overlapping_pairs

    pairs = overlapping_pairs(np.concatenate([act, act])[in_time].astype(np.int64), is_alloc[in_time],
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
