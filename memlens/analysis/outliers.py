"""Which blocks hold the most idle memory: the outlier blocks, ranked over their access time intervals.

The intervals are the ATIs after the bandwidth filter (`memlens.analysis.swappable`: which of them are long
enough to swap at a link); the ranking priorities are:

- ``size_x_idle`` (Li et al.): size x longest idle interval.
- ``doa`` / ``aoa`` / ``wdoa`` (Zhang et al., arXiv 1903.06631): for the interval of the block that spans
  the device's memory peak, DOA (duration of absence) is its length minus the transfer times; AOA is DOA x
  size; WDOA weights each instant of the swapped-out window by how far the load then is over a memory limit
  (`memlens.analysis.wdoa`, the one WDOA, which the swap planner uses too). As in the paper, only blocks of
  at least 1 MiB (`ZHANG_MIN_SIZE`) idle across the peak are candidates for these three.

The bandwidth filter and the WDOA helpers are importable from here too (`bandwidth_filter`,
`swappable_intervals`, `filter_summary`, `weight_integral`, `load_weight`, `wdoa_ns`, `wdoa_of_integral`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.bandwidth import DEFAULT, BandwidthModel
from memlens.analysis.live import live_curve
from memlens.analysis.swappable import ati_rows, bandwidth_filter, filter_summary, swappable_intervals
from memlens.analysis.wdoa import load_weight, wdoa_ns, wdoa_of_integral, weight_integral

# re-exported: notebooks, tests, benchmarks and other layers import the filter and WDOA from here
__all__ = ["ATTRIBUTION", "PRIORITIES", "ZHANG_MIN_SIZE", "bandwidth_filter", "filter_summary", "load_weight",
           "outliers", "swappable_intervals", "wdoa_ns", "wdoa_of_integral", "weight_integral"]

PRIORITIES = ("size_x_idle", "doa", "aoa", "wdoa")
ZHANG_MIN_SIZE = 1 << 20  # Zhang et al. consider blocks >= 1 MB for swapping
ATTRIBUTION = ("category", "op", "module", "stack_id", "alloc_ns", "free_ns")


def _first_in_runs(run_start: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Index of the first True of `mask` in each run (runs begin at the sorted `run_start`; -1 when none).

    Works on the (few) True positions only: their run is found by binary search, not by a run id per row.
    """
    first = np.full(len(run_start), -1, dtype=np.int64)
    idx = np.flatnonzero(mask)
    runs = np.searchsorted(run_start, idx, side="right") - 1
    new = np.ones(len(idx), dtype=bool)
    new[1:] = runs[1:] != runs[:-1]
    first[runs[new]] = idx[new]
    return first


def outliers(trace, bandwidth: BandwidthModel | str | None = None, top: int | None = 20,
             priority: str = "size_x_idle", *, device: str | None = None, min_size: int | None = None,
             limit_bytes: float | None = None, intervals: pd.DataFrame | None = None,
             include_unobserved: bool = False, steady_state: bool = False,
             iteration: int | None = None, peak_context: dict | None = None) -> pd.DataFrame:
    """Blocks ranked by idle memory, one row per block, best first (the first `top`; all with None).

    Idle means the block's ATIs (`access_intervals`; wrap-around intervals in steady state). Columns:
    ``block_id``, ``device``, ``size`` (bytes), ``max_idle_ns`` (longest ATI), ``max_idle_start_ns`` /
    ``max_idle_end_ns`` / ``max_idle_kind`` (that interval: ``access_to_access``, or ``wrap_around`` when it
    crosses the iteration boundary), ``lifetime_ns``, ``idle_fraction`` (max_idle / lifetime), ``accesses``,
    ``swappable_intervals``, ``swappable_bytes_ns`` (sum over its swappable ATIs), ``crosses_peak`` (an ATI
    spans the device's peak), ``doa_ns`` / ``aoa`` / ``wdoa_ns`` (Zhang et al.'s measures of that interval:
    DOA = ATI - swap-out - swap-in time, AOA = DOA x size, WDOA = `wdoa_ns` of its absence window; NaN when
    not idle across the peak), ``score`` (the `priority` value ranked on) and the block's attribution
    ``category``, ``op``, ``module``, ``stack_id``, ``alloc_ns``, ``free_ns``. `min_size` (bytes) drops
    smaller blocks; by default 0 for size_x_idle and 1 MiB (`ZHANG_MIN_SIZE`) for doa/aoa/wdoa, as in the
    paper. `limit_bytes` is WDOA's memory limit. `steady_state` / `iteration` select the intervals as in
    `access_intervals` (with `iteration`, the peak is the peak of that iteration). ``attrs`` name the
    ``bandwidth`` model, the ``clock``, the ``priority`` and the ``min_size`` used.

    Blocks only the allocator saw (``source == "profiler"``: workspaces inside an op) and with no recorded
    access are left out unless `include_unobserved`: their bytes are used inside the op, where no access
    can be recorded, so their lifetime is not idle time (they have no ATI in any case).

    `peak_context` ({device: {"t_peak": ns, "times", "cum": `load_weight`'s arrays, or "integral": a
    function of time giving their interpolation}}) replaces what is
    otherwise computed from `trace`'s live curves: the out-of-core engine ranks a part of the blocks
    against the whole trace's peak and load.
    """
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
    bw = BandwidthModel.parse(bandwidth) if bandwidth is not None else DEFAULT
    if intervals is not None and "swappable" in intervals.columns:
        iv = ati_rows(intervals, device)
    else:
        iv = bandwidth_filter(intervals if intervals is not None else trace, bw, device,
                              steady_state=steady_state, iteration=iteration)
    if min_size is None:
        min_size = 0 if priority == "size_x_idle" else ZHANG_MIN_SIZE

    block = iv["block_id"].to_numpy(dtype=np.int64)
    n = len(block)
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = block[1:] != block[:-1]
    run_start = np.flatnonzero(new_run)
    n_runs = len(run_start)
    length = iv["length_ns"].to_numpy(dtype=np.int64)
    start = iv["start_ns"].to_numpy(dtype=np.int64)
    end = iv["end_ns"].to_numpy(dtype=np.int64)
    size = iv["size"].to_numpy(dtype=np.int64)
    if n_runs == 0:
        return _empty_outliers()

    max_len = np.maximum.reduceat(length, run_start)
    counts = np.diff(np.append(run_start, n))
    arg = _first_in_runs(run_start, length == np.repeat(max_len, counts))
    swappable = iv["swappable"].to_numpy()
    first = run_start
    lifetime, accesses = _lifetimes_and_accesses(trace, block[first])

    dev_codes, dev_names = _codes(iv["device"])
    has_peak, doa, wdoa = _peak_measures(trace, iv, run_start, dev_codes, dev_names, limit_bytes, peak_context)

    out = pd.DataFrame({
        "block_id": block[first],
        "size": size[first],
        "max_idle_ns": max_len,
        "max_idle_start_ns": start[arg],
        "max_idle_end_ns": end[arg],
        "lifetime_ns": lifetime,
        "idle_fraction": np.where(lifetime > 0, np.minimum(max_len / np.maximum(lifetime, 1), 1.0), 0.0),
        "accesses": accesses,
        "swappable_intervals": np.add.reduceat(swappable, run_start, dtype=np.int64),
        "swappable_bytes_ns": np.add.reduceat(iv["swappable_bytes_ns"].to_numpy(dtype=np.float64), run_start),
        "crosses_peak": has_peak,
        "doa_ns": doa,
        "aoa": doa * size[first],
        "wdoa_ns": wdoa,
        "_run": np.arange(n_runs),
    }, copy=False)
    score = {"size_x_idle": out["size"].to_numpy(np.float64) * out["max_idle_ns"].to_numpy(np.float64),
             "doa": doa, "aoa": out["aoa"].to_numpy(), "wdoa": wdoa}
    out["score"] = score[priority]
    keep = out["size"].to_numpy() >= min_size
    if priority != "size_x_idle":
        keep &= has_peak
    if not include_unobserved:
        keep &= ~_unobservable(trace, out["block_id"].to_numpy(), accesses)
    ranked = out.iloc[_rank(out["score"].to_numpy(dtype=np.float64), out["size"].to_numpy(),
                            out["block_id"].to_numpy(), keep, top)]
    # labels only for the rows kept (strings for 1M blocks would cost more than the ranking)
    runs = ranked.pop("_run").to_numpy()
    ranked.insert(1, "device", dev_names[dev_codes[first[runs]]])
    wraps = iv["wraps"].to_numpy()[arg[runs]] if "wraps" in iv.columns else np.zeros(len(runs), bool)
    ranked.insert(6, "max_idle_kind", np.where(wraps, "wrap_around", ATI_KIND_LABEL))
    ranked = _attach_attribution(ranked.reset_index(drop=True), trace)
    ranked.attrs["bandwidth"] = bw.to_dict()
    ranked.attrs["bandwidth_text"] = bw.describe()
    ranked.attrs["priority"] = priority
    ranked.attrs["min_size"] = int(min_size)
    ranked.attrs["clock"] = dict(iv.attrs.get("clock") or {"kind": "host"})
    ranked.attrs["steady_state"] = bool(iv.attrs.get("steady_state", False))
    ranked.attrs["iteration"] = iv.attrs.get("iteration")
    return ranked


ATI_KIND_LABEL = "access_to_access"


def _lifetimes_and_accesses(trace, block_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lifetime ns bounded by the trace span, number of recorded accesses) of each block id."""
    from memlens.analysis.ati import block_rows
    blocks = trace.blocks
    lo, hi = trace.time_span_ns()
    ids = blocks["block_id"].to_numpy(dtype=np.int64)
    rows = block_rows(ids, np.asarray(block_ids, dtype=np.int64))
    alloc = blocks["alloc_ns"].fillna(lo).to_numpy(dtype=np.int64)
    free = blocks["free_ns"].fillna(hi).to_numpy(dtype=np.int64)
    lifetime = np.where(rows >= 0, free[np.maximum(rows, 0)] - alloc[np.maximum(rows, 0)], 0)
    acc_rows = block_rows(ids, trace.accesses["block_id"].to_numpy(dtype=np.int64))
    per_block = np.bincount(acc_rows[acc_rows >= 0], minlength=len(ids))
    accesses = np.where(rows >= 0, per_block[np.maximum(rows, 0)], 0)
    return np.maximum(lifetime, 0).astype(np.int64), accesses.astype(np.int64)


def _peak_measures(trace, iv: pd.DataFrame, run_start: np.ndarray, dev_codes: np.ndarray,
                   dev_names: np.ndarray, limit_bytes: float | None, peak_context: dict | None = None):
    """Zhang et al.'s measures per block, from the interval spanning its device's peak.

    Returns (has_peak: the block is idle across the peak, doa_ns, wdoa_ns), NaN where it is not. With an
    iteration window (``iv.attrs["window_ns"]``), the peak is that iteration's and an interval wrapping
    past the window's end covers the window's start too.
    """
    n_runs = len(run_start)
    start = iv["start_ns"].to_numpy(dtype=np.int64)
    end = iv["end_ns"].to_numpy(dtype=np.int64)
    length = iv["length_ns"].to_numpy(dtype=np.int64)
    swappable = iv["swappable"].to_numpy()
    round_trip = iv["round_trip_ns"].to_numpy(dtype=np.float64)
    window = iv.attrs.get("window_ns") if iv.attrs.get("iteration") is not None else None
    period = iv.attrs.get("period_ns") if window is not None else None
    spans_peak = np.zeros(len(iv), dtype=bool)
    curves = {}
    context = peak_context or {}
    for code, dev in enumerate(dev_names):
        if dev in context:
            if context[dev]["t_peak"] is None:
                continue
            t_peak = int(context[dev]["t_peak"])
        else:
            curves[dev] = live = live_curve(trace, dev)[0]
            if len(live) == 0:
                continue
            t = live["t_ns"].to_numpy()
            load = live["live"].to_numpy()
            if window is not None:  # the peak of the iteration (the level carried into it included)
                inside = (t >= window[0]) & (t < window[1])
                if inside.any():
                    idx = np.flatnonzero(inside)
                    t_peak = int(t[idx[int(np.argmax(load[idx]))]])
                else:
                    t_peak = int(window[0])
            else:
                t_peak = int(t[int(np.argmax(load))])
        spanning = (start <= t_peak) & (end > t_peak)
        if period is not None:
            spanning |= (start <= t_peak + period) & (end > t_peak + period)
        spans_peak |= spanning if len(dev_names) == 1 else spanning & (dev_codes == code)
    peak_idx = _first_in_runs(run_start, spans_peak)
    has_peak = peak_idx >= 0
    at_peak = peak_idx[has_peak]
    doa = np.full(n_runs, np.nan)
    doa[has_peak] = length[at_peak] - round_trip[at_peak]
    # WDOA only for the intervals that span a peak (the candidates), over their swapped-out window
    lo_w = iv["swap_out_done_ns"].to_numpy()[at_peak].astype(np.float64)
    hi_w = iv["swap_in_start_ns"].to_numpy()[at_peak].astype(np.float64)
    weighted = np.zeros(len(at_peak))
    for code, dev in enumerate(dev_names):
        on_dev = dev_codes[at_peak] == code
        if not on_dev.any():
            continue
        if dev in context and "integral" in context[dev]:
            weighted[on_dev] = wdoa_of_integral(context[dev]["integral"], lo_w[on_dev], hi_w[on_dev], window,
                                                period)
            continue
        if dev in context:
            times, cum = context[dev]["times"], context[dev]["cum"]
        else:
            times, cum, _, _ = load_weight(trace, dev, limit_bytes, live=curves[dev])
        weighted[on_dev] = wdoa_ns(times, cum, lo_w[on_dev], hi_w[on_dev], window, period)
    wdoa = np.full(n_runs, np.nan)
    wdoa[has_peak] = np.where(swappable[at_peak], weighted, 0.0)
    return has_peak, doa, wdoa


def _rank(score: np.ndarray, size: np.ndarray, block_id: np.ndarray, keep: np.ndarray,
          top: int | None) -> np.ndarray:
    """Row positions of the `top` kept rows by score (desc; NaN last), then size (desc), then block_id.

    Partitions before sorting, so ranking the top 20 of a million blocks does not sort them all.
    """
    rows = np.flatnonzero(keep)
    key = np.where(np.isnan(score[rows]), -np.inf, score[rows])
    if top is not None and len(rows) > top:
        top = max(int(top), 0)
        kth = np.partition(key, len(key) - top)[len(key) - top] if top else np.inf
        cand = key >= kth  # every row tied with the last place stays a candidate
        rows, key = rows[cand], key[cand]
    order = np.lexsort((block_id[rows], -size[rows], -key))
    rows = rows[order]
    return rows if top is None else rows[:top]


def _codes(labels: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(int codes, label strings) of a column; free for a categorical (the interval frames use them)."""
    if isinstance(labels.dtype, pd.CategoricalDtype):
        return labels.cat.codes.to_numpy(), np.asarray(labels.cat.categories, dtype=object).astype(str)
    codes, names = pd.factorize(labels, sort=True)
    return codes, np.asarray(names, dtype=object).astype(str)


def _unobservable(trace, block_ids: np.ndarray, accesses: np.ndarray) -> np.ndarray:
    """True for blocks whose accesses no instrument could see: allocator-only and never accessed."""
    if "source" not in trace.blocks.columns:
        return np.zeros(len(block_ids), dtype=bool)
    from memlens.analysis.ati import block_rows
    rows = block_rows(trace.blocks["block_id"].to_numpy(dtype=np.int64), np.asarray(block_ids, dtype=np.int64))
    source = trace.blocks["source"].to_numpy(dtype=object)[np.maximum(rows, 0)]
    return (accesses == 0) & (source == "profiler") & (rows >= 0)


def _attach_attribution(out: pd.DataFrame, trace) -> pd.DataFrame:
    """Add the blocks' attribution columns to the (few) ranked rows, looked up by block_id."""
    from memlens.analysis.ati import block_rows
    cols = [c for c in ATTRIBUTION if c in trace.blocks.columns]
    rows = block_rows(trace.blocks["block_id"].to_numpy(dtype=np.int64), out["block_id"].to_numpy(dtype=np.int64))
    picked = trace.blocks.iloc[np.maximum(rows, 0)][cols].reset_index(drop=True)
    picked[rows < 0] = None
    for c in cols:
        out[c] = picked[c].to_numpy()
    return out


def _empty_outliers() -> pd.DataFrame:
    cols = ["block_id", "device", "size", "max_idle_ns", "max_idle_start_ns", "max_idle_end_ns", "max_idle_kind",
            "lifetime_ns", "idle_fraction", "accesses", "swappable_intervals", "swappable_bytes_ns",
            "crosses_peak", "doa_ns", "aoa", "wdoa_ns", "score", *ATTRIBUTION]
    return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
