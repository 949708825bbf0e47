"""Which idle intervals could be swapped: the bandwidth filter over a trace's access time intervals (ATIs).

It works on the ATIs of `memlens.analysis.ati.access_intervals` (from the end of the op of one access to
the start of the op of the next; wrap-around intervals included in steady state), the same intervals the
swap planner takes: the lifetime edges (alloc -> first access, last access -> free) are not swaps (the data
must survive them to be copied back) and are reported beside the ATI, not here.

An access interval is *swappable* when it lasts at least the round trip of its block over the link
(`BandwidthModel.round_trip_ns`: ``size/bw_out + size/bw_in`` plus latencies).
Swapping it frees ``size`` bytes over ``[start + swap_out_ns, end - swap_in_ns]``, so it holds
``size * (length - round_trip)`` swappable byte-nanoseconds. The transfer times include the fixed latency
because the bytes are free only once the copy has completed.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.ati import access_intervals, ati_only
from memlens.analysis.bandwidth import DEFAULT, BandwidthModel


def ati_rows(trace_or_intervals, device=None, steady_state=False, iteration=None) -> pd.DataFrame:
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
    iv = ati_rows(trace_or_intervals, device, steady_state, iteration)
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
