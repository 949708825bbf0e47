"""Compiled merge of a device's recorded alloc/free events with the events of chosen swaps.

Every candidate the swap optimisers try is judged on the whole load curve; re-sorting the trace's events
for each try made selection quadratic-times-log in the trace length (a 20,000-block trace took minutes).
The recorded events are already in time order, so one linear merge with the few sorted swap events gives
the same curve. Imported lazily by `memlens.swap.schedule`.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _walk(base_t, base_delta, in_t, in_z, out_t, out_z, goal, keep_t, keep_live):
    """Walk the merged events; fill `keep_t`/`keep_live` when they have room for every event. Returns
    (highest live bytes, floored at 0; integral of live bytes above `goal`, byte*ns)."""
    n = len(base_t) + len(in_t) + len(out_t)
    keep = len(keep_t) == n
    i = 0
    j = 0
    k = 0
    running = 0
    peak = 0
    over = 0.0
    last_t = 0
    for p in range(n):
        if i < len(in_t) and (j >= len(base_t) or in_t[i] <= base_t[j]) and (k >= len(out_t) or in_t[i] <= out_t[k]):
            now, step = in_t[i], in_z[i]
            i += 1
        elif j < len(base_t) and (k >= len(out_t) or base_t[j] <= out_t[k]):
            now, step = base_t[j], base_delta[j]
            j += 1
        else:
            now, step = out_t[k], -out_z[k]
            k += 1
        if p > 0 and running > goal:  # the level since the previous event lasted until now
            over += float(now - last_t) * float(running - goal)
        running += step
        last_t = now
        if running > peak:
            peak = running
        if keep:
            keep_t[p] = now
            keep_live[p] = running
    return peak, over


@numba.njit(cache=True, nogil=True)
def merge_curve(base_t: np.ndarray, base_delta: np.ndarray, in_t: np.ndarray, in_z: np.ndarray,
                out_t: np.ndarray, out_z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times ns, live bytes after each event) of the recorded events merged with copy-in re-allocations
    (+size) and copy-out releases (-size).

    All three inputs are sorted by time. At equal times the copy-ins count first, then the recorded events
    (in their order), then the copy-outs: the conservative order, which never hides a peak.
    """
    n = len(base_t) + len(in_t) + len(out_t)
    t = np.empty(n, np.int64)
    live = np.empty(n, np.int64)
    _walk(base_t, base_delta, in_t, in_z, out_t, out_z, 0, t, live)
    return t, live


@numba.njit(cache=True, nogil=True)
def peak_and_overload(base_t: np.ndarray, base_delta: np.ndarray, in_t: np.ndarray, in_z: np.ndarray,
                      out_t: np.ndarray, out_z: np.ndarray, goal: int) -> tuple[int, float]:
    """(highest live bytes, floored at 0; integral over time of the live bytes above `goal`, byte*ns) of
    the curve `merge_curve` returns, without building it (the optimisers ask this once per candidate)."""
    none = np.empty(0, np.int64)
    return _walk(base_t, base_delta, in_t, in_z, out_t, out_z, goal, none, none)
