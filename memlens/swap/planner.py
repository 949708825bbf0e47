"""`plan_swaps`: which blocks to copy to the host while idle, and what that does to the peak."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.analysis.ati import require_accesses
from memlens.swap.candidates import ATTRIBUTION, idle_intervals, swap_candidates
from memlens.swap.optimise import select
from memlens.swap.schedule import LoadCurve, serial_schedule

SWAP_COLUMNS = ("block_id", "size", "idle_from_ns", "idle_to_ns", "out_start_ns", "out_end_ns", "in_start_ns",
                "in_end_ns", "saved_from_ns", "saved_to_ns", "stall_ns") + ATTRIBUTION


@dataclass
class SwapPlan:
    """A swapping plan for one device. Bytes and ns throughout.

    `peak_before`: recorded peak live bytes; `peak_after`: with the swaps; `infinite_bandwidth_peak`: with
    every idle interval between accesses swapped for free (the bound no bandwidth can beat);
    `transfer_bytes`: bytes copied both ways; `stall_ns`: estimated time ops wait for copy-ins; `swaps`: one
    row per swap (block, size, copy times, saved window, stall, category/op/module); `met_limit`: whether
    `peak_after <= limit` (None when minimising).
    """

    device: str
    peak_before: int
    peak_after: int
    infinite_bandwidth_peak: int
    limit: int | None
    priority: str
    transfer_bytes: int
    stall_ns: int
    swaps: pd.DataFrame
    bandwidth: dict = field(default_factory=dict)
    candidates: int = 0
    intervals: int = 0

    @property
    def met_limit(self) -> bool | None:
        """True when the plan brings the peak to the limit or below (None without a limit)."""
        return None if self.limit is None else self.peak_after <= self.limit

    @property
    def saved_bytes(self) -> int:
        """Peak reduction, bytes."""
        return self.peak_before - self.peak_after

    def summary(self) -> dict:
        """JSON-ready facts, with the swaps as a list of dicts."""
        swaps = self.swaps.astype(object).where(self.swaps.notna(), None).to_dict("records")
        return {"device": self.device, "peak_before": int(self.peak_before), "peak_after": int(self.peak_after),
                "infinite_bandwidth_peak": int(self.infinite_bandwidth_peak), "limit": self.limit,
                "met_limit": self.met_limit, "priority": self.priority, "saved_bytes": int(self.saved_bytes),
                "transfer_bytes": int(self.transfer_bytes), "stall_ns": int(self.stall_ns),
                "swap_count": int(len(self.swaps)), "candidates": int(self.candidates),
                "idle_intervals": int(self.intervals), "bandwidth": self.bandwidth, "swaps": swaps}


def infinite_bandwidth_peak(trace, device: str, intervals: pd.DataFrame | None = None) -> int:
    """Peak live bytes when every idle interval between two accesses costs nothing to swap (bytes)."""
    intervals = idle_intervals(trace, device) if intervals is None else intervals
    iv = intervals[intervals["idle_ns"] > 0]
    a = iv["idle_from_ns"].to_numpy(np.int64)
    b = iv["idle_to_ns"].to_numpy(np.int64)
    free = serial_schedule(a, b, np.zeros(len(iv), np.int64), np.zeros(len(iv), np.int64))
    return LoadCurve(trace, device).peak(iv["size"].to_numpy(np.int64), free)[0]


def plan_swaps(trace, bandwidth=None, limit=None, priority: str = "best", device: str | None = None,
               min_size: int = 0) -> SwapPlan:
    """Choose idle intervals to swap out to the host and prefetch back (one copy stream each way).

    `bandwidth`: a `memlens.analysis.bandwidth.BandwidthModel` or anything `BandwidthModel.parse` reads
    ('25GB/s', 'pcie4', 'zhang'); default PCIe 4.0 x16. `limit`: device memory limit in bytes (or '10GB');
    None minimises the peak. `priority`: "doa", "aoa", "wdoa" (Zhang et al.), "peak" (re-simulating greedy
    on the peak) or "best" (all, keeping the best plan). `min_size`: smallest block worth swapping (bytes;
    Zhang et al. use 1 MB). Raises NeedsAccessesError on a trace without accesses.
    """
    from memlens.analysis.bandwidth import BandwidthModel
    from memlens.plan.problem import pick_device
    from memlens.units import parse_bytes

    require_accesses(trace, "swap planning")
    model = bandwidth if isinstance(bandwidth, BandwidthModel) else (
        BandwidthModel() if bandwidth is None else BandwidthModel.parse(bandwidth))
    limit = None if limit is None else parse_bytes(limit)
    device = pick_device(trace, device)
    intervals = idle_intervals(trace, device)
    curve = LoadCurve(trace, device)
    peak_before = curve.peak()[0]
    bound = infinite_bandwidth_peak(trace, device, intervals)
    cands = swap_candidates(intervals, model, min_size)
    sel = select(cands, curve, limit, priority, target=bound)
    chosen = cands.iloc[sel.chosen].reset_index(drop=True)
    sch = sel.schedule
    swaps = pd.DataFrame({
        "block_id": chosen["block_id"].to_numpy(np.int64), "size": chosen["size"].to_numpy(np.int64),
        "idle_from_ns": chosen["idle_from_ns"].to_numpy(np.int64),
        "idle_to_ns": chosen["idle_to_ns"].to_numpy(np.int64),
        "out_start_ns": sch.out_start, "out_end_ns": sch.out_end, "in_start_ns": sch.in_start,
        "in_end_ns": sch.in_end, "saved_from_ns": sch.out_end, "saved_to_ns": sch.in_start,
        "stall_ns": sch.stall})
    for col in ATTRIBUTION:
        swaps[col] = chosen[col].to_numpy() if col in chosen.columns else ""
    swaps = swaps.sort_values("out_start_ns", kind="stable").reset_index(drop=True)
    name = priority if priority != "best" else f"best:{sel.method}"
    return SwapPlan(device=device, peak_before=int(peak_before), peak_after=int(sel.peak),
                    infinite_bandwidth_peak=int(bound), limit=limit, priority=name,
                    transfer_bytes=int(2 * swaps["size"].sum()), stall_ns=int(sel.stall_ns), swaps=swaps,
                    bandwidth=model.to_dict(), candidates=int(len(cands)), intervals=int(len(intervals)))
