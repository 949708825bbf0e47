"""Distributions of durations and sizes: quantiles, log-binned histograms, ECDFs, size classes.

Shared by the ATI, outlier and iteration analyses. Durations are ns, sizes bytes; everything takes numpy
arrays and is vectorised.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

# size classes that match how PyTorch's caching allocator treats blocks: <= 1 MiB goes to the small pool
SIZE_CLASS_EDGES = (0, 4 << 10, 1 << 20, 16 << 20, 256 << 20)
SIZE_CLASS_LABELS = ("< 4 KiB", "4 KiB - 1 MiB", "1 - 16 MiB", "16 - 256 MiB", ">= 256 MiB")


def quantiles(values, qs=(0.5, 0.9, 0.99)) -> dict[float, float | None]:
    """{q: value} with linear interpolation; None for each q when `values` is empty."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return {q: None for q in qs}
    return {q: float(v) for q, v in zip(qs, np.quantile(values, qs))}


def log_bins(values, per_decade: int = 5, floor: float = 1.0) -> np.ndarray:
    """Log-spaced bin edges covering `values` (ns or bytes), `per_decade` bins per factor of 10.

    Values below `floor` (zero-length intervals) fall into a first bin ``[0, floor)``; edges are exact powers
    of 10^(1/per_decade) so that histograms of different traces line up.
    """
    values = np.asarray(values, dtype=np.float64)
    positive = values[values >= floor]
    hi = positive.max() if len(positive) else floor
    top = int(np.ceil(np.log10(hi) * per_decade + 1e-9)) if hi > floor else int(np.log10(floor) * per_decade) + 1
    bottom = int(np.floor(np.log10(floor) * per_decade))
    edges = 10.0 ** (np.arange(bottom, max(top, bottom + 1) + 1) / per_decade)
    if edges[-1] <= hi:
        edges = np.append(edges, edges[-1] * 10 ** (1 / per_decade))
    return np.concatenate([[0.0], edges])


def log_histogram(values, per_decade: int = 5, floor: float = 1.0, weights=None) -> pd.DataFrame:
    """Histogram on log-spaced bins (`log_bins`): columns ``lo``, ``hi``, ``count``, ``fraction``
    (of all values) and, with `weights` (e.g. block sizes), ``weight`` and ``weight_fraction``."""
    values = np.asarray(values, dtype=np.float64)
    edges = log_bins(values, per_decade, floor)
    counts, _ = np.histogram(values, bins=edges)
    out = pd.DataFrame({"lo": edges[:-1], "hi": edges[1:], "count": counts.astype(np.int64)})
    total = max(len(values), 1)
    out["fraction"] = out["count"] / total
    if weights is not None:
        w, _ = np.histogram(values, bins=edges, weights=np.asarray(weights, dtype=np.float64))
        out["weight"] = w
        out["weight_fraction"] = w / (w.sum() if w.sum() > 0 else 1.0)
    return out


def ecdf(values, max_points: int | None = 2000) -> pd.DataFrame:
    """Empirical CDF: columns ``value`` (sorted distinct values) and ``fraction`` (share <= value).

    With `max_points`, the curve is thinned to at most that many points chosen evenly in rank (the first
    and last are kept), which keeps a 10-million-interval ECDF plottable without changing its shape.
    """
    values = np.sort(np.asarray(values, dtype=np.float64))
    n = len(values)
    if n == 0:
        return pd.DataFrame({"value": np.array([], dtype=np.float64), "fraction": np.array([], dtype=np.float64)})
    # last occurrence of each distinct value gives the fraction <= it
    is_last = np.ones(n, dtype=bool)
    is_last[:-1] = values[1:] != values[:-1]
    idx = np.flatnonzero(is_last)
    if max_points is not None and len(idx) > max_points:
        pick = np.unique(np.linspace(0, len(idx) - 1, max_points).round().astype(np.int64))
        idx = idx[pick]
    return pd.DataFrame({"value": values[idx], "fraction": (idx + 1) / n})


def size_class(sizes) -> np.ndarray:
    """Label of each size (bytes) among `SIZE_CLASS_LABELS` (object array)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    idx = np.searchsorted(np.asarray(SIZE_CLASS_EDGES[1:]), sizes, side="right")
    return np.asarray(SIZE_CLASS_LABELS, dtype=object)[idx]


def time_weighted_mean(t_ns, values, t_end_ns: int | None = None) -> float:
    """Mean of a step function (`values[i]` holds from `t_ns[i]` to `t_ns[i+1]`) over its time span."""
    t = np.asarray(t_ns, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if len(t) == 0:
        return 0.0
    end = t[-1] if t_end_ns is None else float(t_end_ns)
    dt = np.diff(np.append(t, end))
    span = dt.sum()
    return float((v * dt).sum() / span) if span > 0 else float(v.mean())
