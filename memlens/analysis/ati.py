"""Access time intervals (ATI): how long each block sits between the events that touch it.

Definition (REFERENCE.md section 2, after Li et al., "Pinpointing the Memory Behaviors of DNN Training"):
the ATIs of a block are the gaps between consecutive events of ``(alloc, access, ..., access, free)``. The
first interval runs from alloc to the first access (kind ``alloc_to_first``), the middle ones between
accesses (``access_to_access``), the last from the last access to free (``last_to_free``). A block that no
op ever touched has one interval, alloc to free (``alloc_to_free``: e.g. a temporary inside an op that the
allocator saw but no op argument exposed).

Bounds: a block allocated before recording began starts at the trace start, and one still alive when
recording stopped ends at the trace end (`Trace.time_span_ns`); its first/last interval is then marked
``truncated`` because its true length is unknown (at least the value given). Several accesses of a block
by the same op at the same time count once (an in-place op reads and writes the same bytes in one event;
in a time-ordered recording such rows are adjacent, and only adjacent ones are merged). An access that
falls outside its block's recorded lifetime (a recorder's clock skew) widens the lifetime to include it
rather than producing a negative interval; how many did so is in ``attrs["accesses_outside_lifetime"]``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.distributions import ecdf, log_histogram, quantiles, size_class
from memlens.errors import NeedsAccessesError

KINDS = ("alloc_to_first", "access_to_access", "last_to_free", "alloc_to_free")
INTERVAL_COLUMNS = ("block_id", "device", "size", "start_ns", "end_ns", "length_ns", "kind", "ordinal",
                    "truncated")


def require_accesses(trace, what: str = "this analysis") -> None:
    """Raise `NeedsAccessesError` explaining why `what` cannot run on a trace without accesses."""
    if not trace.has_accesses:
        source = trace.metadata.get("source_kind", "unknown")
        raise NeedsAccessesError(
            f"{what} needs per-access data (which op read or wrote each block), and this trace "
            f"(source: {source}) has none: CUDA memory snapshots, Kineto traces and memory timelines record "
            "only allocations and frees. Record the run with memlens.record (or `memlens record`) to get "
            "accesses; lifetime-based analyses (peak, iterations, fragmentation) still work on this trace.")


def access_intervals(trace, device: str | None = None) -> pd.DataFrame:
    """Every access time interval of every block, one row per interval.

    Columns: ``block_id``, ``device`` (categorical), ``size`` (bytes), ``start_ns``, ``end_ns``,
    ``length_ns`` (ns, trace-relative), ``kind`` (categorical, one of `KINDS`), ``ordinal`` (0-based position
    of the interval within its block) and ``truncated`` (bool: bounded by the trace start/end, not by a real
    alloc/free). Rows are ordered by block (blocks table order) then time. Only blocks of `device` when
    given. Raises `memlens.errors.NeedsAccessesError` when the trace records no accesses.
    """
    require_accesses(trace, "access time interval (ATI) analysis")
    blocks = trace.blocks if device is None else trace.blocks[trace.blocks["device"] == device]
    lo, hi = trace.time_span_ns()

    block_ids = blocks["block_id"].to_numpy(dtype=np.int64)
    acc = trace.accesses
    acc_block = acc["block_id"].to_numpy(dtype=np.int64)
    acc_t = acc["t_ns"].to_numpy(dtype=np.int64)
    acc_op = acc["op_id"].to_numpy(dtype=np.int64)
    row = block_rows(block_ids, acc_block)
    known = row >= 0
    if not known.all():  # accesses of other devices' or unknown blocks
        row, acc_t, acc_op = row[known], acc_t[known], acc_op[known]
    row, order = _group_by_row(row, acc_t, acc_op, len(block_ids))
    acc_t = acc_t[order]
    if len(row) > 1:
        # one event per (block, time, op): an op reading and writing a block touches it once
        same = (row[1:] == row[:-1]) & (acc_t[1:] == acc_t[:-1])
        if same.any():
            pos = np.flatnonzero(same) + 1
            dup = acc_op[order[pos]] == acc_op[order[pos - 1]]
            if dup.any():
                keep = np.ones(len(row), dtype=bool)
                keep[pos[dup]] = False
                row, acc_t = row[keep], acc_t[keep]

    n_blocks = len(blocks)
    counts = np.bincount(row, minlength=n_blocks).astype(np.int64)
    alloc_known = blocks["alloc_ns"].notna().to_numpy()
    free_known = blocks["free_ns"].notna().to_numpy()
    start = blocks["alloc_ns"].fillna(lo).to_numpy(dtype=np.int64)
    end = blocks["free_ns"].fillna(hi).to_numpy(dtype=np.int64)

    # widen lifetimes to cover their accesses (first/last access of each row, accesses sorted by row)
    acc_offset = np.concatenate([[0], np.cumsum(counts)])
    has_acc = counts > 0
    first_acc = np.full(n_blocks, np.iinfo(np.int64).max)
    last_acc = np.full(n_blocks, np.iinfo(np.int64).min)
    first_acc[has_acc] = acc_t[acc_offset[:-1][has_acc]]
    last_acc[has_acc] = acc_t[acc_offset[1:][has_acc] - 1]
    outside = int(((first_acc < start) & has_acc).sum() + ((last_acc > end) & has_acc).sum())
    start = np.minimum(start, first_acc)
    end = np.maximum(end, last_acc)

    # block b's intervals occupy [iv_offset[b], iv_offset[b+1]): their starts are (start, accesses...), their
    # ends (accesses..., end). Accesses are grouped by row, so both are the access times with one value
    # inserted per block (np.insert copies sequentially, faster than scattering through an index array).
    n_iv = counts + 1
    iv_offset = np.concatenate([[0], np.cumsum(n_iv)])
    total = int(iv_offset[-1])
    first_pos, last_pos = iv_offset[:-1], iv_offset[1:] - 1
    iv_start = np.insert(acc_t, acc_offset[:-1], start)
    iv_end = np.insert(acc_t, acc_offset[1:], end)
    kind_code = np.ones(total, dtype=np.int8)  # access_to_access unless first/last
    kind_code[first_pos] = 0
    kind_code[last_pos] = 2
    kind_code[first_pos[counts == 0]] = 3
    truncated = np.zeros(total, dtype=bool)
    truncated[first_pos[~alloc_known]] = True
    truncated[last_pos[~free_known]] = True
    # ordinal: a running count that restarts at each block (cumsum of 1s with a reset at every block start)
    ordinal = np.ones(total, dtype=np.int64)
    if total:
        ordinal[first_pos[1:]] = 1 - n_iv[:-1]
        ordinal[0] = 0
        np.cumsum(ordinal, out=ordinal)

    devices = blocks["device"].astype("category")
    out = pd.DataFrame({
        "block_id": np.repeat(block_ids, n_iv),
        "device": pd.Categorical.from_codes(np.repeat(devices.cat.codes.to_numpy(), n_iv), devices.cat.categories),
        "size": np.repeat(blocks["size"].to_numpy(dtype=np.int64), n_iv),
        "start_ns": iv_start,
        "end_ns": iv_end,
        "length_ns": iv_end - iv_start,
        "kind": pd.Categorical.from_codes(kind_code, KINDS),
        "ordinal": ordinal,
        "truncated": truncated,
    }, copy=False)  # no consolidation copy: 10M-row columns stay as built
    out.attrs["accesses_outside_lifetime"] = outside
    out.attrs["accesses_of_unknown_blocks"] = int((~known).sum()) if device is None else 0
    out.attrs["trace_span_ns"] = (lo, hi)
    return out


def block_rows(block_ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Position in `block_ids` of each id in `wanted` (-1 when absent). A lookup table when the ids are
    dense (recorders number blocks 0..n), binary search otherwise."""
    n = len(block_ids)
    if n == 0:
        return np.full(len(wanted), -1, dtype=np.int64)
    lo, hi = int(block_ids.min()), int(block_ids.max())
    if hi - lo < 4 * n + 1024:
        lookup = np.full(hi - lo + 1, -1, dtype=np.int64)
        lookup[block_ids - lo] = np.arange(n, dtype=np.int64)
        inside = (wanted >= lo) & (wanted <= hi)
        if inside.all():
            return lookup[wanted - lo]
        out = np.full(len(wanted), -1, dtype=np.int64)
        out[inside] = lookup[wanted[inside] - lo]
        return out
    order = np.argsort(block_ids, kind="stable")
    sorted_ids = block_ids[order]
    pos = np.minimum(np.searchsorted(sorted_ids, wanted), n - 1)
    return np.where(sorted_ids[pos] == wanted, order[pos], -1)


def _group_by_row(row: np.ndarray, t: np.ndarray, op: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Accesses ordered by (row, time, op): returns (sorted rows, permutation).

    Recorders write accesses in time order; then a stable grouping by row is enough, done as one sort of
    packed int64 keys ``row << bits | position`` (several times faster than a lexsort of three keys; the
    sorted rows come back from the keys without a gather). Accesses at the same time keep their recorded
    order.
    """
    n = len(row)
    if n > 1 and np.all(t[1:] >= t[:-1]):
        bits = max(int(n - 1).bit_length(), 1)
        if n_rows < (1 << (62 - bits)):
            key = row << bits
            key |= np.arange(n, dtype=np.int64)
            key.sort()
            return key >> bits, key & ((1 << bits) - 1)
    order = np.lexsort((op, t, row))
    return row[order], order


def count_distinct(ids: np.ndarray) -> int:
    """Number of distinct non-negative ints, by counting when the range is small."""
    if len(ids) == 0:
        return 0
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo < 4 * len(ids) + 1024:
        return int(np.count_nonzero(np.bincount(ids - lo)))
    return int(pd.unique(ids).size)


def ati_stats(intervals: pd.DataFrame, *, exclude_truncated: bool = False) -> dict:
    """Summary numbers of a set of access time intervals (a frame from `access_intervals`).

    Returns ``count``, ``blocks``, ``total_ns``, ``mean_ns``, ``std_ns``, ``min_ns``, ``max_ns``,
    ``p50_ns``, ``p90_ns``, ``p99_ns`` (linear-interpolated quantiles), ``zero_count`` (intervals of length
    0, accesses at the same timestamp), ``truncated`` (intervals bounded by the trace start/end),
    ``fraction_below`` ({"1us","10us","100us","1ms","10ms"}: share of intervals shorter than that) and
    ``by_kind`` (count per kind). Times are ns. Empty input gives count 0 and None for the statistics.
    """
    iv = intervals[~intervals["truncated"]] if exclude_truncated else intervals
    lengths = iv["length_ns"].to_numpy(dtype=np.float64)
    n = len(lengths)
    q = quantiles(lengths, (0.5, 0.9, 0.99))
    thresholds = {"1us": 1e3, "10us": 1e4, "100us": 1e5, "1ms": 1e6, "10ms": 1e7}
    kinds = iv["kind"].value_counts()
    return {
        "count": int(n),
        "blocks": count_distinct(iv["block_id"].to_numpy(dtype=np.int64)),
        "total_ns": float(lengths.sum()),
        "mean_ns": float(lengths.mean()) if n else None,
        "std_ns": float(lengths.std()) if n else None,
        "min_ns": float(lengths.min()) if n else None,
        "max_ns": float(lengths.max()) if n else None,
        "p50_ns": q[0.5], "p90_ns": q[0.9], "p99_ns": q[0.99],
        "zero_count": int((lengths == 0).sum()),
        "truncated": int(iv["truncated"].sum()),
        "fraction_below": {k: (np.count_nonzero(lengths < v) / n if n else None) for k, v in thresholds.items()},
        "by_kind": {k: int(kinds.get(k, 0)) for k in KINDS},
    }


DISTRIBUTION_QUANTILES = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999)


def ati_distribution(intervals: pd.DataFrame, per_decade: int = 5, ecdf_points: int = 2000) -> dict:
    """The distribution of interval lengths, for plots: ``histogram`` (log-binned counts with the bytes of
    the blocks in each bin as ``weight``; `distributions.log_histogram`), ``ecdf`` (thinned to
    `ecdf_points`), ``quantiles`` ({q: ns} for `DISTRIBUTION_QUANTILES`) and ``count``."""
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

    ``category``/``module``/``op`` come from the block that owns the interval; ``size_class`` from its
    size (`distributions.size_class`); ``iteration`` is the iteration in which the interval starts (from
    `iterations.split_iterations`, or the frame given; intervals before the first iteration get -1).
    Columns: the group, ``count``, ``blocks``, ``bytes`` (sum of distinct block sizes), ``mean_ns``,
    ``p50_ns``, ``p90_ns``, ``p99_ns``, ``max_ns``, ``total_ns``.
    """
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {GROUPINGS}, got {by!r}")
    iv = access_intervals(trace) if intervals is None else intervals
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
