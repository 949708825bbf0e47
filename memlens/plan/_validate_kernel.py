"""Compiled sweep of the plan validator (`memlens.plan.validate`), kept apart from the planners' kernels
so that the check shares no code with what it checks; imported lazily (numba is heavy to import)."""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def overlapping_pairs(events: np.ndarray, is_alloc: np.ndarray, offset: np.ndarray, size: np.ndarray,
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
