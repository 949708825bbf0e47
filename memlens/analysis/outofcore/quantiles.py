"""Exact quantiles of a distributed set of integers (interval lengths in ns) in two passes.

Pass 1: every piece counts its values on fine bins (`fine_bin`: the integers 0..1023 each have a bin, above
that 512 bins per factor of 2, so a bin spans 0.2% of its values); the counts add up across pieces. The
cumulative counts tell which bin holds each order statistic a quantile needs. Pass 2: every piece returns
its distinct values, with counts, inside only those bins; merged, they give the exact order statistics,
which are interpolated exactly as `numpy.quantile` (method "linear") does, so the answer is the same float.
"""
from __future__ import annotations

import numpy as np

SMALL = 1024          # integers below this get a bin each
PER_OCTAVE = 512      # bins per factor of 2 above SMALL
_SMALL_BITS = 10
N_BINS = 1 + SMALL + (64 - _SMALL_BITS) * PER_OCTAVE  # bin 0 holds negative values (none expected)


def fine_bin(values: np.ndarray) -> np.ndarray:
    """The fine bin of each int64 value; monotone non-decreasing in the value."""
    v = np.asarray(values, dtype=np.int64)
    out = np.empty(len(v), dtype=np.int64)
    small = v < SMALL
    out[small] = np.maximum(v[small], -1) + 1
    big = ~small
    if big.any():
        x = v[big].astype(np.float64)
        mant, exp = np.frexp(x)            # x = mant * 2**exp, mant in [0.5, 1)
        sub = np.minimum(np.floor((mant * 2.0 - 1.0) * PER_OCTAVE), PER_OCTAVE - 1).astype(np.int64)
        out[big] = 1 + SMALL + (exp.astype(np.int64) - 1 - _SMALL_BITS) * PER_OCTAVE + sub
    return out


def bin_counts(values: np.ndarray) -> np.ndarray:
    """Counts per fine bin (length `N_BINS`)."""
    return np.bincount(fine_bin(values), minlength=N_BINS).astype(np.int64)


def sparse_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`bin_counts` as (bins that are not empty, their counts): what a task sends back, so the driver's
    memory is the bins the data actually fills, not `N_BINS` per piece."""
    dense = bin_counts(values)
    idx = np.flatnonzero(dense)
    return idx.astype(np.int32), dense[idx]


def add_sparse(pieces) -> np.ndarray:
    """The dense per-bin counts (length `N_BINS`) of a list of `sparse_counts` results."""
    out = np.zeros(N_BINS, dtype=np.int64)
    for idx, counts in pieces:
        np.add.at(out, idx, counts)
    return out


def order_positions(n: int, qs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(previous index, next index, gamma) of each quantile in a sorted array of `n` values, exactly as
    `numpy.quantile(..., method="linear")` computes them."""
    q = np.asarray(qs, dtype=np.float64)
    try:
        from numpy.lib._function_base_impl import _QuantileMethods
        method = _QuantileMethods["linear"]
        virtual = np.asanyarray(method["get_virtual_index"](n, q))
        prev = np.floor(virtual)
        gamma = np.asanyarray(method["fix_gamma"](virtual - prev, virtual), dtype=virtual.dtype)
    except (ImportError, KeyError, TypeError):  # older numpy: the same formula
        virtual = (n - 1) * q
        prev = np.floor(virtual)
        gamma = virtual - prev
    prev_i = prev.astype(np.int64)
    next_i = prev_i + 1
    above = virtual >= n - 1
    prev_i[above] = n - 1
    next_i[above] = n - 1
    below = virtual < 0
    prev_i[below] = 0
    next_i[below] = 0
    return prev_i, next_i, gamma


def lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """numpy's quantile interpolation (`_lerp`): the same float operations in the same order."""
    a, b, t = (np.asarray(x, dtype=np.float64) for x in (a, b, t))
    diff = b - a
    out = a + diff * t
    upper = t >= 0.5
    out[upper] = (b - diff * (1 - t))[upper]
    return out


def bins_holding(counts: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The fine bin holding each 0-based order statistic `positions` (given total `counts` per bin)."""
    cum = np.cumsum(counts)
    return np.searchsorted(cum, np.asarray(positions, dtype=np.int64), side="right")


def values_in_bins(values: np.ndarray, bins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, counts) of `values` that fall in any of `bins` (pass 2 of one piece)."""
    if len(bins) == 0 or len(values) == 0:
        return np.array([], dtype=np.int64), np.array([], dtype=np.int64)
    v = np.asarray(values, dtype=np.int64)
    sel = v[np.isin(fine_bin(v), bins)]
    return np.unique(sel, return_counts=True)


def exact_quantiles(counts: np.ndarray, pieces: list[tuple[np.ndarray, np.ndarray]], qs) -> dict:
    """{q: value} from the total fine-bin `counts` and the pass-2 `pieces` (distinct values and counts
    in the needed bins, from every piece). None for each q when there are no values."""
    n = int(counts.sum())
    if n == 0:
        return {q: None for q in qs}
    prev_i, next_i, gamma = order_positions(n, qs)
    values = np.concatenate([p[0] for p in pieces]) if pieces else np.array([], dtype=np.int64)
    weights = np.concatenate([p[1] for p in pieces]) if pieces else np.array([], dtype=np.int64)
    order = np.argsort(values, kind="stable")
    values, weights = values[order], weights[order]
    cum = np.cumsum(counts)
    offsets = np.concatenate([[0], cum])  # first order statistic in each bin

    def stat(pos: int) -> float:
        b = int(np.searchsorted(cum, pos, side="right"))
        in_bin = fine_bin(values) == b
        v, w = values[in_bin], weights[in_bin]
        # merge duplicates across pieces, then walk the counts to the rank inside the bin
        uniq, inv = np.unique(v, return_inverse=True)
        tot = np.bincount(inv, weights=w).astype(np.int64)
        rank = pos - int(offsets[b])
        return float(uniq[int(np.searchsorted(np.cumsum(tot), rank, side="right"))])

    a = np.array([stat(int(p)) for p in prev_i])
    b = np.array([stat(int(p)) for p in next_i])
    result = lerp(a, b, gamma)
    return {q: float(r) for q, r in zip(qs, result)}


def needed_bins(counts: np.ndarray, qs) -> np.ndarray:
    """The fine bins pass 2 must look into for the quantiles `qs`."""
    n = int(counts.sum())
    if n == 0:
        return np.array([], dtype=np.int64)
    prev_i, next_i, _ = order_positions(n, qs)
    return np.unique(bins_holding(counts, np.concatenate([prev_i, next_i])))
