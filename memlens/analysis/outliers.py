"""The bandwidth filter and the outlier blocks: which idle intervals could be swapped, and which blocks matter.

Both work on the ATIs of `memlens.analysis.ati.access_intervals` (from the end of the op of one access to
the start of the op of the next; wrap-around intervals included in steady state), the same intervals the
swap planner takes: the lifetime edges (alloc -> first access, last access -> free) are not swaps (the data
must survive them to be copied back) and are reported beside the ATI, not here.

An access interval is *swappable* when it lasts at least the round trip of its block over the link
(`BandwidthModel.round_trip_ns`: ``size/bw_out + size/bw_in`` plus latencies; REFERENCE.md section 2).
Swapping it frees ``size`` bytes over ``[start + swap_out_ns, end - swap_in_ns]``, so it holds
``size * (length - round_trip)`` swappable byte-nanoseconds. The transfer times include the fixed latency
because the bytes are free only once the copy has completed.

Outliers are blocks ranked by how much idle memory they hold:

- ``size_x_idle`` (Li et al.): size x longest idle interval.
- ``doa`` / ``aoa`` / ``wdoa`` (Zhang et al., arXiv 1903.06631): for the interval of the block that spans
  the device's memory peak, DOA (duration of absence) is its length minus the transfer times; AOA is DOA x
  size; WDOA weights each instant of the swapped-out window by how far the load then is over a memory limit,
  ``clip((load - limit) / (peak - limit), 0, 1)``, so absence during the peak counts fully and absence while
  under the limit not at all (`wdoa_ns`, the one WDOA, which the swap planner uses too). The limit defaults
  to the device's time-weighted mean live bytes. As in the paper, only blocks of at least 1 MiB
  (`ZHANG_MIN_SIZE`) idle across the peak are candidates for these three.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.ati import access_intervals, ati_only
from memlens.analysis.bandwidth import DEFAULT, BandwidthModel
from memlens.analysis.distributions import time_weighted_mean
from memlens.analysis.live import live_curve

PRIORITIES = ("size_x_idle", "doa", "aoa", "wdoa")
ZHANG_MIN_SIZE = 1 << 20  # Zhang et al. consider blocks >= 1 MB for swapping
ATTRIBUTION = ("category", "op", "module", "stack_id", "alloc_ns", "free_ns")


def _as_intervals(trace_or_intervals, device=None, steady_state=False, iteration=None) -> pd.DataFrame:
    """The ATI rows of a frame from `access_intervals`, or of the trace's intervals."""
    if isinstance(trace_or_intervals, pd.DataFrame):
        iv = ati_only(trace_or_intervals)
        if device is not None:
            attrs = dict(iv.attrs)
            iv = iv[iv["device"].astype(str) == device]
            iv.attrs.update(attrs)
        return iv
    return ati_only(access_intervals(trace_or_intervals, device=device, steady_state=steady_state,
                                     iteration=iteration))


def bandwidth_filter(trace_or_intervals, bandwidth: BandwidthModel | str | None = None,
                     device: str | None = None, *, steady_state: bool = False,
                     iteration: int | None = None) -> pd.DataFrame:
    """The ATIs with the bandwidth filter applied (lifetime edges are not swaps: they are dropped).

    `steady_state` / `iteration` are passed to `access_intervals` when a Trace is given (a frame is used as
    it was computed).

    Adds ``round_trip_ns`` (ns to move the block out and back in), ``swappable`` (bool: length >= round
    trip), ``saved_ns`` (length - round trip, 0 when not swappable), ``swap_out_done_ns`` /
    ``swap_in_start_ns`` (the window in which the bytes are free; empty, both at start, when not swappable)
    and ``swappable_bytes_ns`` (size x saved_ns). Accepts a Trace or a frame from `access_intervals`.
    """
    bw = BandwidthModel.parse(bandwidth) if bandwidth is not None else DEFAULT
    iv = _as_intervals(trace_or_intervals, device, steady_state, iteration)
    size = iv["size"].to_numpy(dtype=np.float64)
    length = iv["length_ns"].to_numpy()
    start = iv["start_ns"].to_numpy()
    end = iv["end_ns"].to_numpy()
    # round trip = size * (1/bw_out + 1/bw_in) + both latencies, in as few passes over 10M rows as possible
    round_trip = size * (bw.swap_out_ns(1.0) - bw.out_latency_ns + bw.swap_in_ns(1.0) - bw.in_latency_ns)
    round_trip += bw.out_latency_ns + bw.in_latency_ns
    saved = length - round_trip
    swappable = saved >= 0
    np.maximum(saved, 0.0, out=saved)
    # the swapped-out window, only where there is one (an empty window at start otherwise)
    idx = np.flatnonzero(swappable)
    out_done = np.array(start, dtype=np.int64, copy=True)
    in_start = np.array(start, dtype=np.int64, copy=True)
    out_done[idx] += np.rint(bw.swap_out_ns(size[idx])).astype(np.int64)
    in_start[idx] = end[idx] - np.rint(bw.swap_in_ns(size[idx])).astype(np.int64)
    saved_bytes_ns = saved * size
    # a new frame over the same column arrays: setting columns on a copy would copy 10M-row arrays
    columns = {c: iv[c] for c in iv.columns}
    columns.update({"round_trip_ns": round_trip, "swappable": swappable, "saved_ns": saved,
                    "swap_out_done_ns": out_done, "swap_in_start_ns": in_start,
                    "swappable_bytes_ns": saved_bytes_ns})
    attrs = dict(iv.attrs)
    iv = pd.DataFrame(columns, copy=False)
    iv.attrs.update(attrs)
    iv.attrs["bandwidth"] = bw.to_dict()
    return iv


def swappable_intervals(trace_or_intervals, bandwidth: BandwidthModel | str | None = None,
                        device: str | None = None, *, steady_state: bool = False,
                        iteration: int | None = None) -> pd.DataFrame:
    """Only the ATIs long enough to swap at `bandwidth` (default PCIe 4.0 x16); see `bandwidth_filter`."""
    iv = bandwidth_filter(trace_or_intervals, bandwidth, device, steady_state=steady_state, iteration=iteration)
    return iv[iv["swappable"].to_numpy()].reset_index(drop=True)


def filter_summary(filtered: pd.DataFrame) -> dict:
    """What the bandwidth filter did to a frame from `bandwidth_filter`.

    ``intervals``, ``swappable``, ``filtered_out_fraction`` (share of intervals too short to swap),
    ``idle_bytes_ns`` (sum of size x length over all intervals: the infinite-bandwidth bound),
    ``swappable_bytes_ns`` and ``swappable_share`` (swappable / idle byte-ns), ``blocks_with_swappable``,
    and the ``bandwidth`` model and ``clock`` the figures are on.
    """
    from memlens.analysis.ati import count_distinct
    n = len(filtered)
    swappable = filtered["swappable"].to_numpy()
    idle = float(np.dot(filtered["size"].to_numpy(dtype=np.float64), filtered["length_ns"].to_numpy(np.float64)))
    saved = float(filtered["swappable_bytes_ns"].to_numpy().sum())
    return {
        "intervals": int(n),
        "swappable": int(np.count_nonzero(swappable)),
        "filtered_out_fraction": 1 - np.count_nonzero(swappable) / n if n else None,
        "idle_bytes_ns": idle,
        "swappable_bytes_ns": saved,
        "swappable_share": saved / idle if idle > 0 else None,
        "blocks_with_swappable": count_distinct(filtered["block_id"].to_numpy(dtype=np.int64)[swappable]),
        "bandwidth": filtered.attrs.get("bandwidth"),
        "clock": dict(filtered.attrs.get("clock") or {"kind": "host"}),
        "steady_state": bool(filtered.attrs.get("steady_state", False)),
        "iteration": filtered.attrs.get("iteration"),
    }


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
        iv = _as_intervals(intervals, device)
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


def _labels_at(labels: pd.Series, idx: np.ndarray) -> np.ndarray:
    """String labels of the rows `idx`, through the categorical codes when there are some (cheap on 10M
    rows, where astype(str) of the whole column is not)."""
    if isinstance(labels.dtype, pd.CategoricalDtype):
        categories = np.asarray(labels.cat.categories, dtype=object)
        return categories[labels.cat.codes.to_numpy()[idx]]
    return labels.to_numpy()[idx].astype(str)


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
