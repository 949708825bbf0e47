"""`plan_swaps`: which blocks to copy to the host while idle, and what that does to the peak.

Two modes:

- the recording as a straight line (default): swaps between two accesses anywhere in the trace;
- one iteration as one period of the training cycle (``iteration=k``, or ``steady_state=True`` for the
  default steady iteration): the plan is made to be repeated every step, as Zhang et al.'s planner is. The
  wrap-around intervals of blocks alive across the iteration boundary (parameters, optimizer state) are
  candidates; copies crossing the boundary are timed with the neighbouring periods on the same two serial
  copy streams (`memlens.swap.periodic`); the peaks reported are the steady-state peaks of one period.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.analysis.ati import require_accesses
from memlens.analysis.iterations import steady_iteration  # noqa: F401  (re-exported)
from memlens.analysis.outliers import ZHANG_MIN_SIZE
from memlens.swap.candidates import ATTRIBUTION, idle_intervals, swap_candidates
from memlens.swap.optimise import priority_scores, select, useful_candidates
from memlens.swap.schedule import LoadCurve, serial_schedule

SWAP_COLUMNS = ("block_id", "size", "idle_from_ns", "idle_to_ns", "out_start_ns", "out_end_ns", "in_start_ns",
                "in_end_ns", "saved_from_ns", "saved_to_ns", "stall_ns", "wraps", "crosses_boundary") + ATTRIBUTION
DEFAULT_MIN_SIZE = ZHANG_MIN_SIZE  # Zhang et al. swap blocks of at least 1 MB; memlens uses 1 MiB
PEAK_SHARE_FLOOR = 64  # on a model too small for that floor, a block of 1/64 of the peak is worth moving


def size_floor(peak_bytes: int) -> int:
    """The smallest block (bytes) a plan that follows the trace swaps: `DEFAULT_MIN_SIZE`, or 1/64 of the
    peak live bytes when that is smaller (a small model's blocks are all under 1 MiB: a fixed 1 MiB floor
    would swap nothing there)."""
    return int(min(DEFAULT_MIN_SIZE, max(int(peak_bytes) // PEAK_SHARE_FLOOR, 1)))


@dataclass
class SwapPlan:
    """A swapping plan for one device. Bytes and ns throughout (on the clock named by `clock`).

    `peak_before`: peak live bytes without swapping (of one period in steady state); `peak_after`: with the
    swaps (the steady-state peak when the plan repeats); `infinite_bandwidth_peak`: with every ATI swapped
    for free (the bound no bandwidth can beat); `transfer_bytes`: bytes copied both ways (per period);
    `stall_ns`: estimated time ops wait for copy-ins (each swap's copy-in must end by the start of the op
    that next accesses the block, its ``idle_to_ns``; ``stall_ns`` per swap is how much later it ends);
    `swaps`: one row per swap (block, size, copy times, saved window, stall, whether it wraps around the
    iteration boundary or its copies cross it, category/op/module); `met_limit`: whether
    `peak_after <= limit` (None when minimising). `bandwidth` is the link model (rates and both copy
    latencies), `min_size` the smallest block considered (`smaller_candidates`: swappable intervals of
    smaller blocks, left out by it). In steady state `iteration`, `period_ns` and `window_ns` say which period was planned. `curve_before` /
    `curve_after` (t_ns, live) are the load curves, and `candidates_table` the candidates with their
    three priorities (doa_ns, aoa, wdoa_ns), their rank under each and whether they were chosen.
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
    smaller_candidates: int = 0
    intervals: int = 0
    min_size: int = DEFAULT_MIN_SIZE
    clock: dict = field(default_factory=lambda: {"kind": "host"})
    bandwidth_text: str = ""
    steady_state: bool = False
    iteration: int | None = None
    period_ns: int | None = None
    window_ns: tuple[int, int] | None = None
    curve_before: pd.DataFrame | None = None
    curve_after: pd.DataFrame | None = None
    candidates_table: pd.DataFrame | None = None

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
                "late_copy_ins": int((self.swaps["stall_ns"] > 0).sum()) if len(self.swaps) else 0,
                "swap_count": int(len(self.swaps)), "candidates": int(self.candidates),
                "smaller_candidates": int(self.smaller_candidates),
                "idle_intervals": int(self.intervals), "min_size": int(self.min_size),
                "bandwidth": self.bandwidth, "bandwidth_text": self.bandwidth_text, "clock": self.clock,
                "steady_state": self.steady_state, "iteration": self.iteration, "period_ns": self.period_ns,
                "window_ns": list(self.window_ns) if self.window_ns else None, "swaps": swaps}


def infinite_bandwidth_peak(trace, device: str, intervals: pd.DataFrame | None = None,
                            curve: LoadCurve | None = None, scheduler=serial_schedule) -> int:
    """Peak live bytes when every ATI costs nothing to swap (bytes)."""
    intervals = idle_intervals(trace, device) if intervals is None else intervals
    curve = LoadCurve(trace, device) if curve is None else curve
    iv = intervals[intervals["idle_ns"] > 0]
    a = iv["idle_from_ns"].to_numpy(np.int64)
    b = iv["idle_to_ns"].to_numpy(np.int64)
    zero = np.zeros(len(iv), np.int64)
    free = scheduler(a, b, zero, zero)
    return curve.peak(iv["size"].to_numpy(np.int64), free)[0]


def plan_swaps(trace, bandwidth=None, limit=None, priority: str = "best", device: str | None = None,
               min_size: int = DEFAULT_MIN_SIZE, *, steady_state: bool = False,
               iteration: int | None = None, only=None) -> SwapPlan:
    """Choose ATIs to swap out to the host and prefetch back (one copy stream each way).

    `bandwidth`: a `memlens.analysis.bandwidth.BandwidthModel` or anything `BandwidthModel.parse` reads
    ('25GB/s', 'pcie4', 'zhang'); default PCIe 4.0 x16 (25 GB/s each way + 10 us per copy). `limit`: device
    memory limit in bytes (or '10GB'); None minimises the peak. `priority`: "doa", "aoa", "wdoa" (Zhang et
    al.), "peak" (re-simulating greedy on the peak) or "best" (all, keeping the best plan). `min_size`:
    smallest block worth swapping (bytes; default 1 MiB, Zhang et al.'s 1 MB floor). `iteration` (k): plan
    one period, iteration k, to be repeated (see the module docstring); `steady_state=True` without an
    iteration plans the default steady iteration (`steady_iteration`). Raises NeedsAccessesError on a trace
    without accesses and InputError for an iteration the trace does not have. `only`: a function of the
    idle-interval table (`idle_intervals`' columns) returning a boolean mask: only those intervals are
    candidates, and the infinite-bandwidth bound is theirs (an activation offload plans only the
    forward-to-backward intervals of saved tensors).
    """
    from memlens.analysis.bandwidth import BandwidthModel
    from memlens.trace import clock_of
    from memlens.plan.problem import pick_device
    from memlens.units import parse_bytes

    require_accesses(trace, "swap planning")
    model = bandwidth if isinstance(bandwidth, BandwidthModel) else (
        BandwidthModel() if bandwidth is None else BandwidthModel.parse(bandwidth))
    limit = None if limit is None else parse_bytes(limit)
    min_size = int(parse_bytes(min_size)) if isinstance(min_size, str) else int(min_size)
    device = pick_device(trace, device)
    periodic = steady_state or iteration is not None
    iterations = None
    if periodic:
        from memlens.analysis.iterations import split_iterations
        iterations = split_iterations(trace)
        if iteration is None:
            iteration = steady_iteration(iterations)
    intervals = idle_intervals(trace, device, steady_state=periodic, iteration=iteration if periodic else None,
                               iterations=iterations)
    if only is not None:
        attrs = dict(intervals.attrs)
        intervals = intervals[np.asarray(only(intervals), dtype=bool)].reset_index(drop=True)
        intervals.attrs.update(attrs)
    if periodic:
        from memlens.swap.periodic import PeriodicLoadCurve, periodic_schedule
        window = tuple(intervals.attrs["window_ns"])
        period = int(intervals.attrs["period_ns"])
        curve = PeriodicLoadCurve(trace, device, window)
        scheduler = periodic_schedule(period)
    else:
        window, period, curve, scheduler = None, None, LoadCurve(trace, device), serial_schedule
    peak_before = curve.peak()[0]
    bound = infinite_bandwidth_peak(trace, device, intervals, curve, scheduler)
    # every swappable interval once; those of blocks under min_size are only counted (a plan with no swaps
    # says how many a lower floor would see)
    swappable = swap_candidates(intervals, model, 0)
    large = swappable["size"].to_numpy(np.int64) >= max(min_size, 1)
    cands = swappable[large].reset_index(drop=True)
    smaller = int((~large).sum())
    sel = select(cands, curve, limit, priority, target=bound, scheduler=scheduler)
    chosen = cands.iloc[sel.chosen].reset_index(drop=True)
    sch = sel.schedule
    swaps = pd.DataFrame({
        "block_id": chosen["block_id"].to_numpy(np.int64), "size": chosen["size"].to_numpy(np.int64),
        "idle_from_ns": chosen["idle_from_ns"].to_numpy(np.int64),
        "idle_to_ns": chosen["idle_to_ns"].to_numpy(np.int64),
        "out_start_ns": sch.out_start, "out_end_ns": sch.out_end, "in_start_ns": sch.in_start,
        "in_end_ns": sch.in_end, "saved_from_ns": sch.out_end, "saved_to_ns": sch.in_start,
        "stall_ns": sch.stall, "wraps": chosen["wraps"].to_numpy(bool)})
    if periodic:
        w0, w1 = window
        times = swaps[["out_start_ns", "out_end_ns", "in_start_ns", "in_end_ns"]].to_numpy()
        swaps["crosses_boundary"] = ((times < w0) | (times > w1)).any(axis=1) | swaps["wraps"].to_numpy()
    else:
        swaps["crosses_boundary"] = False
    for col in ATTRIBUTION:
        swaps[col] = chosen[col].to_numpy() if col in chosen.columns else ""
    swaps = swaps.sort_values("out_start_ns", kind="stable").reset_index(drop=True)
    name = priority if priority != "best" else f"best:{sel.method}"

    t0, live0 = curve.curve()
    t1, live1 = curve.curve(chosen["size"].to_numpy(np.int64), sch)
    table = _candidates_table(cands, curve, limit if limit is not None else bound, sel.chosen)
    return SwapPlan(device=device, peak_before=int(peak_before), peak_after=int(sel.peak),
                    infinite_bandwidth_peak=int(bound), limit=limit, priority=name,
                    transfer_bytes=int(2 * swaps["size"].sum()), stall_ns=int(sel.stall_ns), swaps=swaps,
                    bandwidth=model.to_dict(), candidates=int(len(cands)), smaller_candidates=smaller,
                    intervals=int(len(intervals)),
                    min_size=min_size, clock=clock_of(trace), bandwidth_text=model.describe(),
                    steady_state=periodic, iteration=iteration if periodic else None, period_ns=period,
                    window_ns=window, curve_before=pd.DataFrame({"t_ns": t0, "live": live0}),
                    curve_after=pd.DataFrame({"t_ns": t1, "live": live1}), candidates_table=table)


def _candidates_table(cands: pd.DataFrame, curve, goal: int, chosen: np.ndarray) -> pd.DataFrame:
    """The candidates with Zhang et al.'s priorities and their rank under each (1 = first picked)."""
    scores = priority_scores(cands, curve, goal)
    out = cands[["block_id", "size", "idle_from_ns", "idle_to_ns", "out_ns", "in_ns"]].copy()
    out["doa_ns"], out["aoa"], out["wdoa_ns"] = scores["doa"], scores["aoa"], scores["wdoa"]
    for name in ("doa", "aoa", "wdoa"):
        order = np.lexsort((np.arange(len(out)), -out["size"].to_numpy(), -scores[name]))
        rank = np.empty(len(out), np.int64)
        rank[order] = np.arange(1, len(out) + 1)
        out[f"rank_{name}"] = rank
    out["useful"] = useful_candidates(cands, curve, goal)
    out["chosen"] = np.isin(np.arange(len(out)), chosen)
    return out.sort_values("rank_doa").reset_index(drop=True)
