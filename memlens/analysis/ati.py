"""Summaries of access time intervals (ATI): statistics, distributions for plots, and statistics per group.

What an ATI is, and the lifetime edges reported beside it, is defined where the intervals are computed,
`memlens.analysis.ati_intervals`; its names are re-exported here, so analyses, figures and commands import
everything ATI from ``memlens.analysis.ati``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.ati_intervals import ATI_KIND, EDGE_KINDS, KINDS, access_intervals, ati_only, count_distinct
from memlens.analysis.ati_intervals import block_rows, require_accesses  # noqa: F401  (re-exported)
from memlens.analysis.distributions import ecdf, log_histogram, quantiles, size_class


def _length_stats(lengths: np.ndarray) -> dict:
    n = len(lengths)
    q = quantiles(lengths, (0.5, 0.9, 0.99))
    return {"count": int(n), "total_ns": float(lengths.sum()),
            "mean_ns": float(lengths.mean()) if n else None, "std_ns": float(lengths.std()) if n else None,
            "min_ns": float(lengths.min()) if n else None, "max_ns": float(lengths.max()) if n else None,
            "p50_ns": q[0.5], "p90_ns": q[0.9], "p99_ns": q[0.99]}


def ati_stats(intervals: pd.DataFrame, *, exclude_truncated: bool = False) -> dict:
    """Summary numbers of the ATIs of a frame from `access_intervals`, with the lifetime edges beside them.

    The headline is the ATI only (``access_to_access`` rows, wrap-arounds included): ``count``, ``blocks``,
    ``total_ns``, ``mean_ns``, ``std_ns``, ``min_ns``, ``max_ns``, ``p50_ns``, ``p90_ns``, ``p99_ns``
    (linear-interpolated quantiles), ``zero_count`` (ATIs of length 0), ``wrap_around`` (steady-state ATIs
    crossing an iteration boundary) and ``fraction_below`` ({"1us","10us","100us","1ms","10ms"}: share of
    ATIs shorter than that). Beside it, never mixed in: ``edges`` ({kind: the same statistics} for
    ``alloc_to_first``, ``last_to_free``, ``alloc_to_free``), ``truncated`` (edges bounded by the trace
    start/end) and ``by_kind`` (count per kind). ``clock`` names the clock the times are on. Times are ns;
    empty input gives count 0 and None for the statistics. `exclude_truncated` drops truncated edges.
    """
    iv = intervals[~intervals["truncated"].to_numpy()] if exclude_truncated else intervals
    kind = iv["kind"].to_numpy()
    is_ati = kind == ATI_KIND
    lengths = iv["length_ns"].to_numpy(dtype=np.float64)
    ati_len = lengths[is_ati]
    n = len(ati_len)
    thresholds = {"1us": 1e3, "10us": 1e4, "100us": 1e5, "1ms": 1e6, "10ms": 1e7}
    kinds = iv["kind"].value_counts()
    wraps = iv["wraps"].to_numpy()[is_ati] if "wraps" in iv.columns else np.zeros(n, bool)
    out = _length_stats(ati_len)
    out.update({
        "blocks": count_distinct(iv["block_id"].to_numpy(dtype=np.int64)[is_ati]),
        "zero_count": int((ati_len == 0).sum()),
        "wrap_around": int(np.count_nonzero(wraps)),
        "fraction_below": {k: (np.count_nonzero(ati_len < v) / n if n else None) for k, v in thresholds.items()},
        "edges": {k: _length_stats(lengths[kind == k]) for k in EDGE_KINDS},
        "truncated": int(iv["truncated"].sum()),
        "by_kind": {k: int(kinds.get(k, 0)) for k in KINDS},
        "clock": dict(intervals.attrs.get("clock") or {"kind": "host"}),
        "steady_state": bool(intervals.attrs.get("steady_state", False)),
        "iteration": intervals.attrs.get("iteration"),
        "iteration_default": bool(intervals.attrs.get("iteration_default", False)),
        "period_ns": intervals.attrs.get("period_ns"),
    })
    return out


DISTRIBUTION_QUANTILES = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999)


def ati_distribution(intervals: pd.DataFrame, per_decade: int = 5, ecdf_points: int = 2000) -> dict:
    """The distribution of the ATI lengths (``access_to_access`` rows only), for plots: ``histogram`` (log-binned counts with the bytes of
    the blocks in each bin as ``weight``; `distributions.log_histogram`), ``ecdf`` (thinned to
    `ecdf_points`), ``quantiles`` ({q: ns} for `DISTRIBUTION_QUANTILES`) and ``count``."""
    intervals = ati_only(intervals)
    lengths = intervals["length_ns"].to_numpy(dtype=np.float64)
    return {
        "count": int(len(lengths)),
        "histogram": log_histogram(lengths, per_decade=per_decade, weights=intervals["size"].to_numpy()),
        "ecdf": ecdf(lengths, max_points=ecdf_points),
        "quantiles": quantiles(lengths, DISTRIBUTION_QUANTILES),
    }


GROUPINGS = ("kind", "category", "module", "op", "size_class", "iteration", "device")


def ati_by(trace, by: str, intervals: pd.DataFrame | None = None, iterations: pd.DataFrame | None = None,
           ) -> pd.DataFrame:
    """ATI statistics per group: one row per value of `by` (one of `GROUPINGS`).

    Only ATI rows are grouped, except by ``kind``, which shows the lifetime edges beside the ATI.

    ``category``/``module``/``op`` come from the block that owns the interval; ``size_class`` from its
    size (`distributions.size_class`); ``iteration`` is the iteration in which the interval starts (from
    `iterations.split_iterations`, or the frame given; intervals before the first iteration get -1).
    Columns: the group, ``count``, ``blocks``, ``bytes`` (sum of distinct block sizes), ``mean_ns``,
    ``p50_ns``, ``p90_ns``, ``p99_ns``, ``max_ns``, ``total_ns``.
    """
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {GROUPINGS}, got {by!r}")
    iv = access_intervals(trace) if intervals is None else intervals
    if by != "kind":  # the ATI per group; the lifetime edges only in the per-kind view, beside it
        iv = ati_only(iv)
    key = group_key(trace, iv, by, iterations)
    frame = pd.DataFrame({by: key, "block_id": iv["block_id"].to_numpy(),
                          "size": iv["size"].to_numpy(), "length_ns": iv["length_ns"].to_numpy()})
    grouped = frame.groupby(by, observed=True, sort=True)
    lengths = grouped["length_ns"]
    out = pd.DataFrame({
        "count": lengths.size(),
        "blocks": grouped["block_id"].nunique(),
        "mean_ns": lengths.mean(),
        "p50_ns": lengths.quantile(0.5),
        "p90_ns": lengths.quantile(0.9),
        "p99_ns": lengths.quantile(0.99),
        "max_ns": lengths.max(),
        "total_ns": lengths.sum(),
    })
    distinct = frame.drop_duplicates("block_id")
    out.insert(2, "bytes", distinct.groupby(by, observed=True)["size"].sum().reindex(out.index).fillna(0)
               .astype(np.int64))
    return out.reset_index()


def group_key(trace, intervals: pd.DataFrame, by: str, iterations: pd.DataFrame | None = None) -> np.ndarray:
    """The group label of each interval for `ati_by` (array aligned with `intervals`)."""
    if by in ("kind", "device"):
        return intervals[by].to_numpy()
    if by == "size_class":
        return size_class(intervals["size"].to_numpy())
    if by == "iteration":
        if iterations is None:
            from memlens.analysis.iterations import split_iterations
            iterations = split_iterations(trace)
        return iteration_of(intervals["start_ns"].to_numpy(), iterations)
    attrs = trace.blocks[["block_id", by]].drop_duplicates("block_id")
    ids = attrs["block_id"].to_numpy(dtype=np.int64)
    order = np.argsort(ids)
    pos = np.searchsorted(ids[order], intervals["block_id"].to_numpy(dtype=np.int64))
    values = attrs[by].to_numpy(dtype=object)[order][np.minimum(pos, len(ids) - 1)]
    return np.where(values == "", "(unknown)", values)


def iteration_of(t_ns: np.ndarray, iterations: pd.DataFrame) -> np.ndarray:
    """Iteration number containing each time in `t_ns` (-1 before the first or when there are none).

    `iterations` is a frame with ``iteration``, ``start_ns``, ``end_ns`` sorted by start; a time at or past
    an iteration's start belongs to it until the next one starts (the last runs to its end_ns).
    """
    if iterations is None or len(iterations) == 0:
        return np.full(len(t_ns), -1, dtype=np.int64)
    starts = iterations["start_ns"].to_numpy(dtype=np.int64)
    idx = np.searchsorted(starts, np.asarray(t_ns, dtype=np.int64), side="right") - 1
    labels = iterations["iteration"].to_numpy(dtype=np.int64)
    out = np.where(idx >= 0, labels[np.maximum(idx, 0)], -1)
    last_end = int(iterations["end_ns"].iloc[-1])
    return np.where(np.asarray(t_ns) > last_end, -1, out)
