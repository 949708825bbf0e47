"""How much a block's absence weighs against the memory peak: Zhang et al.'s weighted duration of absence
(WDOA, arXiv 1903.06631), the one WDOA of memlens (the outlier ranking and the swap planner both use it).

Each instant of a swapped-out window weighs by how far the device's load then is over a memory limit,
``clip((load - limit) / (peak - limit), 0, 1)``: absence during the peak counts fully, absence while under
the limit not at all. The limit defaults to the device's time-weighted mean live bytes (`load_weight`).
The weight's cumulative integral over the load curve is piecewise linear, so a window's WDOA (ns) is the
difference of two interpolations (`wdoa_ns`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.distributions import time_weighted_mean
from memlens.analysis.live import live_curve


def weight_integral(t: np.ndarray, load: np.ndarray, limit: float, t_end: float):
    """(times, cumulative integral) of the WDOA load weight ``clip((load - limit) / (peak - limit), 0, 1)``
    over a step curve (`load` bytes from each `t` ns until the next, the last until `t_end`). The integral
    is piecewise linear with breakpoints at `t`, so ``np.interp`` evaluates it anywhere (`wdoa_ns`)."""
    t = np.asarray(t, dtype=np.float64)
    load = np.asarray(load, dtype=np.float64)
    if len(t) == 0:
        return np.zeros(1), np.zeros(1)
    peak = float(load.max())
    weight = np.clip((load - limit) / max(peak - limit, 1.0), 0.0, 1.0)
    times = np.append(t, max(float(t_end), t[-1]))
    cum = np.concatenate([[0.0], np.cumsum(weight * np.diff(times))])
    return times, cum


def load_weight(trace, device: str, limit_bytes: float | None, live: pd.DataFrame | None = None):
    """(times, cumulative weight integral, limit, peak) for WDOA on `device` (see `weight_integral`).

    The limit defaults to the device's time-weighted mean live bytes. `live` is
    `live.live_curve(trace, device)[0]` when the caller has it already.
    """
    if live is None:
        live, _ = live_curve(trace, device)
    t = live["t_ns"].to_numpy(dtype=np.float64)
    load = live["live"].to_numpy(dtype=np.float64)
    if len(t) == 0:
        return np.zeros(1), np.zeros(1), 0.0, 0.0
    _, hi = trace.time_span_ns()
    peak = float(load.max())
    limit = time_weighted_mean(t, load, hi) if limit_bytes is None else float(limit_bytes)
    times, cum = weight_integral(t, load, limit, hi)
    return times, cum, limit, peak


def wdoa_ns(times: np.ndarray, cum: np.ndarray, lo, hi, window: tuple[int, int] | None = None,
            period_ns: int | None = None) -> np.ndarray:
    """Zhang et al.'s weighted duration of absence (ns) of the absence windows ``[lo, hi)``: the integral
    over the window of the load weight ``clip((load - limit) / (peak - limit), 0, 1)`` (`load_weight` gives
    `times` and its cumulative integral `cum`). The one WDOA of memlens: the outliers and the swap planner
    both rank by it.

    With `window` and `period_ns` (steady state), a window ending past the period's end wraps around:
    ``[lo, w1)`` plus ``[w0, hi - period)``. Empty windows (hi <= lo) weigh 0.
    """
    return wdoa_of_integral(lambda x: np.interp(x, times, cum), lo, hi, window, period_ns)


def wdoa_of_integral(integral, lo, hi, window: tuple[int, int] | None = None,
                     period_ns: int | None = None) -> np.ndarray:
    """`wdoa_ns` with the cumulative weight integral given as a function of time (ns -> ns): the
    out-of-core engine evaluates it a piece of the curve at a time."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.maximum(np.asarray(hi, dtype=np.float64), lo)
    if window is None or period_ns is None:
        return integral(hi) - integral(lo)
    w0, w1 = float(window[0]), float(window[1])
    first_hi = np.minimum(hi, w1)
    out = integral(first_hi) - integral(np.minimum(lo, first_hi))
    rest = np.clip(hi - period_ns, w0, w1)
    return out + np.where(hi > w1, integral(rest) - integral(np.asarray([w0])), 0.0)
