"""Check a static plan: offsets aligned and non-negative, and no two buffers sharing an address while
both are alive (half-open lifetimes).

The check sweeps the *address* axis (the planners reason along the time axis), so it does not share
code or blind spots with the conflict graph the planners use.
"""
from __future__ import annotations

import numpy as np

from memlens.errors import MemlensError
from memlens.plan.problem import PlanProblem

_CHUNK_PAIRS = 4_000_000


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
    order = act[np.lexsort((act, offsets[act]))]
    lo = offsets[order]
    hi = lo + problem.size[order]
    # the buffers after position p whose lowest address is below p's top share addresses with p
    end_pos = np.searchsorted(lo, hi, side="left")
    counts = np.maximum(end_pos - np.arange(len(order)) - 1, 0)
    starts = np.concatenate([[0], np.cumsum(counts)])
    p = 0
    while p < len(order) and len(out) < limit:
        q = int(np.searchsorted(starts, starts[p] + _CHUNK_PAIRS, side="right")) - 1
        q = max(q, p + 1)
        c = counts[p:q]
        first = np.repeat(np.arange(p, q), c)
        second = first + 1 + np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
        a, b = order[first], order[second]
        clash = (problem.start[a] < problem.end[b]) & (problem.start[b] < problem.end[a])
        for i, j in zip(a[clash][:limit], b[clash][:limit]):
            out.append(f"buffers {ids[i]} [{problem.start[i]}, {problem.end[i]}) at {offsets[i]}+{problem.size[i]}"
                       f" and {ids[j]} [{problem.start[j]}, {problem.end[j]}) at {offsets[j]}+{problem.size[j]}"
                       " overlap in time and address")
        p = q
    return out[:limit]


def validate_plan(problem: PlanProblem, offsets: np.ndarray) -> None:
    """Raise `InvalidPlanError` listing the first violations when the plan is not valid."""
    bad = plan_violations(problem, offsets)
    if bad:
        raise InvalidPlanError("invalid plan: " + "; ".join(bad))
