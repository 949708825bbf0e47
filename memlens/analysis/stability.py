"""Per-iteration statistics and how similar consecutive iterations are (the "stable pattern" finding).

Similarities between iteration k-1 and k, each in [0, 1] (1 = identical):

- ``blocks``: multiset Jaccard of the allocations' (op, size), weighted by bytes: sum over (op, size) of
  size x min(count) / sum of size x max(count) - the share of allocated bytes that recur identically
  (a few-byte scalar the profiler attributes to a neighbouring op does not move it).
- ``bytes``: smaller / larger allocated bytes; ``peak``: smaller / larger peak live bytes;
  ``duration``: shorter / longer wall time.
- ``ati`` (traces with accesses): 1 - total-variation distance between the two iterations' log-binned ATI
  histograms (access->access intervals only, placed in the iteration where they start). Per block, matched
  across iterations: `memlens.analysis.block_stability`.

The stability score is the median over consecutive pairs of each pair's mean similarity: robust to one
warm-up step and to a partial last step, which would otherwise dominate a mean.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.ati import access_intervals, ati_only, iteration_of
from memlens.analysis.ati_intervals import access_op_edges
from memlens.analysis.distributions import log_bins
from memlens.analysis.iterations import split_iterations
from memlens.analysis.live import live_curve

COMPONENTS = ("blocks", "bytes", "peak", "duration", "ati")


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    hi = np.maximum(a, b)
    return np.where(hi > 0, np.minimum(a, b) / np.where(hi > 0, hi, 1), 1.0)


def iteration_stats(trace, iterations: pd.DataFrame | None = None,
                    intervals: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per iteration: ``iteration``, ``start_ns``, ``end_ns``, ``duration_ns``, ``allocations``,
    ``allocated_bytes``, ``frees``, ``freed_bytes``, ``peak_live_bytes`` (all devices together, including
    what was live when the iteration began) and, with accesses, ``accesses``, ``ati_p50_ns``,
    ``ati_p90_ns``, ``ati_max_ns`` of the intervals that start in it (`intervals`: the trace's
    `access_intervals`, when the caller has them)."""
    its = split_iterations(trace) if iterations is None else iterations
    labels = its["iteration"].to_numpy(dtype=np.int64)
    out = its[["iteration", "start_ns", "end_ns"]].copy().reset_index(drop=True)
    out["duration_ns"] = out["end_ns"] - out["start_ns"]
    b = trace.blocks
    alloc_it = iteration_of(b["alloc_ns"].to_numpy("float64", na_value=-1).astype(np.int64), its)
    alloc_it = np.where(b["alloc_ns"].notna().to_numpy(), alloc_it, -1)
    free_it = np.where(b["free_ns"].notna().to_numpy(),
                       iteration_of(b["free_ns"].to_numpy("float64", na_value=-1).astype(np.int64), its), -1)
    size = b["size"].to_numpy(dtype=np.int64)
    index = pd.Index(labels)
    for name, it in (("allocations", alloc_it), ("frees", free_it)):
        frame = pd.DataFrame({"it": it, "size": size})
        grouped = frame[frame["it"] >= 0].groupby("it")["size"]
        out[name] = grouped.size().reindex(index, fill_value=0).to_numpy()
        out["allocated_bytes" if name == "allocations" else "freed_bytes"] = \
            grouped.sum().reindex(index, fill_value=0).to_numpy()
    out["peak_live_bytes"] = _peak_per_window(trace, out["start_ns"].to_numpy(), out["end_ns"].to_numpy())
    if trace.has_accesses:
        iv = ati_only(access_intervals(trace) if intervals is None else intervals)
        it = iteration_of(iv["start_ns"].to_numpy(), its)
        frame = pd.DataFrame({"it": it, "length": iv["length_ns"].to_numpy()})
        grouped = frame[frame["it"] >= 0].groupby("it")["length"]
        acc = trace.accesses  # an access belongs to the iteration its op starts in
        op_start, _ = access_op_edges(trace, acc["op_id"].to_numpy(dtype=np.int64),
                                  acc["t_ns"].to_numpy(dtype=np.int64))
        acc_it = iteration_of(op_start, its)
        out["accesses"] = pd.Series(acc_it[acc_it >= 0]).value_counts().reindex(index, fill_value=0).to_numpy()
        for col, q in (("ati_p50_ns", 0.5), ("ati_p90_ns", 0.9)):
            out[col] = grouped.quantile(q).reindex(index).to_numpy()
        out["ati_max_ns"] = grouped.max().reindex(index).to_numpy()
    return out


def _peak_per_window(trace, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Max live bytes (all devices) within each sorted, non-overlapping window [start, end), counting the
    level already live when the window opens."""
    live, _ = live_curve(trace)
    t = live["t_ns"].to_numpy()
    value = live["live"].to_numpy(dtype=np.int64)
    if len(t) == 0 or len(starts) == 0:
        return np.zeros(len(starts), dtype=np.int64)
    first = np.searchsorted(t, starts, side="left")
    last = np.searchsorted(t, ends, side="left")
    carried = np.where(first > 0, value[np.maximum(first - 1, 0)], 0)
    padded = np.append(value, np.iinfo(np.int64).min)
    bounds = np.minimum(np.ravel(np.column_stack([first, last])), len(value))
    inside = np.maximum.reduceat(padded, bounds)[0::2]  # even slots: [first, last)
    inside = np.where(last > first, inside, np.iinfo(np.int64).min)
    return np.maximum(np.maximum(inside, carried), 0)


def _multiset_similarity(trace, its: pd.DataFrame) -> pd.Series:
    """Bytes-weighted multiset Jaccard of consecutive iterations' allocations, keyed by (op, size)."""
    b = trace.blocks[trace.blocks["alloc_ns"].notna()]
    it = iteration_of(b["alloc_ns"].to_numpy(dtype=np.int64), its)
    op_code, _ = pd.factorize(b["op"].to_numpy(dtype=object))
    size = b["size"].to_numpy(dtype=np.int64)
    frame = pd.DataFrame({"it": it, "op": op_code, "size": size}, copy=False)
    counts = frame[frame["it"] >= 0].groupby(["it", "op", "size"]).size().rename("n").reset_index()
    labels = its["iteration"].to_numpy(dtype=np.int64)
    next_of = dict(zip(labels[:-1], labels[1:]))
    shifted = counts.assign(it=counts["it"].map(next_of)).dropna(subset=["it"]).astype({"it": np.int64})
    merged = counts.merge(shifted, on=["it", "op", "size"], how="outer", suffixes=("", "_prev")).fillna(0)
    merged = merged[merged["it"].isin(labels[1:])]
    merged["lo"] = np.minimum(merged["n"], merged["n_prev"]) * merged["size"]
    merged["hi"] = np.maximum(merged["n"], merged["n_prev"]) * merged["size"]
    sums = merged.groupby("it")[["lo", "hi"]].sum()
    sim = (sums["lo"] / sums["hi"].where(sums["hi"] > 0)).fillna(1.0)
    return sim.reindex(labels[1:], fill_value=1.0)


def _ati_similarity(trace, its: pd.DataFrame, iv: pd.DataFrame | None) -> pd.Series | None:
    if iv is None:
        return None
    iv = ati_only(iv)
    labels = its["iteration"].to_numpy(dtype=np.int64)
    it = iteration_of(iv["start_ns"].to_numpy(), its)
    length = iv["length_ns"].to_numpy(dtype=np.float64)
    edges = log_bins(length, per_decade=5)
    bin_idx = np.clip(np.searchsorted(edges, length, side="right") - 1, 0, len(edges) - 2)
    pos = np.searchsorted(labels, it)
    ok = (it >= 0) & (pos < len(labels))
    hist = np.zeros((len(labels), len(edges) - 1))
    np.add.at(hist, (pos[ok], bin_idx[ok]), 1.0)
    totals = hist.sum(axis=1, keepdims=True)
    prob = hist / np.where(totals > 0, totals, 1)
    overlap = np.minimum(prob[1:], prob[:-1]).sum(axis=1)
    both_empty = (totals[1:, 0] == 0) & (totals[:-1, 0] == 0)
    return pd.Series(np.where(both_empty, 1.0, overlap), index=labels[1:])


def iteration_stability(trace, iterations: pd.DataFrame | None = None,
                        intervals: pd.DataFrame | None = None) -> dict:
    """How alike consecutive iterations are.

    Returns ``iterations`` (count), ``source``, ``pairs`` (DataFrame: ``iteration`` and one column per
    similarity in `COMPONENTS` present, plus ``mean``), ``score`` (median of the pairs' means; None with
    fewer than two iterations), ``mean_score``, ``min_score`` and ``components`` (median of each).
    `intervals` are the trace's `access_intervals` when the caller has them (computed once otherwise).
    """
    its = split_iterations(trace) if iterations is None else iterations
    its = its.sort_values("start_ns").reset_index(drop=True)
    result = {"iterations": int(len(its)), "source": str(its["source"].iloc[0]) if len(its) else "none"}
    if len(its) < 2:
        return {**result, "pairs": pd.DataFrame(), "score": None, "mean_score": None, "min_score": None,
                "components": {}}
    if intervals is None and trace.has_accesses:
        intervals = access_intervals(trace)
    stats = iteration_stats(trace, its, intervals)
    pairs = pd.DataFrame({"iteration": its["iteration"].to_numpy()[1:]})
    pairs["blocks"] = _multiset_similarity(trace, its).to_numpy()
    for name, col in (("bytes", "allocated_bytes"), ("peak", "peak_live_bytes"), ("duration", "duration_ns")):
        v = stats[col].to_numpy()
        pairs[name] = _ratio(v[1:], v[:-1])
    ati = _ati_similarity(trace, its, intervals)
    if ati is not None:
        pairs["ati"] = ati.to_numpy()
    parts = [c for c in COMPONENTS if c in pairs]
    pairs["mean"] = pairs[parts].mean(axis=1)
    return {**result, "pairs": pairs, "score": float(pairs["mean"].median()),
            "mean_score": float(pairs["mean"].mean()), "min_score": float(pairs["mean"].min()),
            "components": {c: float(pairs[c].median()) for c in parts}}
