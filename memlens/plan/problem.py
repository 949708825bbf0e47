"""The static offset planning problem (dynamic storage allocation) built from a trace or a buffer CSV.

A problem is a set of buffers, each with a half-open lifetime ``[start, end)`` on some time axis, a size
in bytes and an offset alignment in bytes. Two buffers *conflict* when both have positive size and their
lifetimes intersect; a plan gives every buffer an offset so that conflicting buffers never share an
address. The lower bound of any plan's height is max-live: the largest total size alive at one instant.

Traces are planned on their global event order (``alloc_seq`` / ``free_seq``) rather than timestamps,
because equal timestamps are common and only the order of allocs and frees matters for a static plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.errors import InputError

# columns of a block carried into a plan's table for attribution when the trace has them
ATTRIBUTION_COLUMNS = ("block_id", "category", "op", "module", "alloc_ns", "free_ns")


@dataclass
class PlanProblem:
    """Buffers to place: int64 arrays `start`, `end` (half-open), `size` (bytes), `alignment` (bytes).

    `table` holds one row per buffer (ids and attribution); its row order matches the arrays.
    """

    start: np.ndarray
    end: np.ndarray
    size: np.ndarray
    alignment: np.ndarray
    table: pd.DataFrame
    device: str | None = None
    source: str = ""
    _conflicts: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        """Number of buffers."""
        return int(len(self.size))

    @property
    def active(self) -> np.ndarray:
        """Mask of buffers that can conflict at all (positive size and a non-empty lifetime)."""
        return (self.size > 0) & (self.end > self.start)

    def max_live(self) -> int:
        """Max over time of the total size of live buffers, in bytes: the lower bound of any plan."""
        times, live = self.live_profile()
        return int(live.max()) if len(live) else 0

    def live_profile(self) -> tuple[np.ndarray, np.ndarray]:
        """(event times, live bytes just after each time) over the distinct event times.

        Frees at a time come before allocs at the same time (half-open lifetimes).
        """
        act = self.active
        s, e, z = self.start[act], self.end[act], self.size[act]
        if len(z) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        t = np.concatenate([s, e])
        d = np.concatenate([z, -z])
        times, inv = np.unique(t, return_inverse=True)
        delta = np.bincount(inv, weights=d, minlength=len(times))
        return times, np.cumsum(delta).round().astype(np.int64)

    def conflicts(self) -> tuple[np.ndarray, np.ndarray]:
        """Conflict graph in CSR form: ``indices[indptr[i]:indptr[i+1]]`` are the buffers conflicting with i.

        Built by a compiled sweep over the buffers sorted by start (`_kernels.conflict_csr`); each row lists
        its neighbours in start order.
        """
        if self._conflicts is not None:
            return self._conflicts
        from memlens.plan._kernels import conflict_csr

        order, hi = self._start_sweep()
        pairs = int(np.maximum(hi - np.arange(len(order)) - 1, 0).sum())
        probe = np.zeros(0, np.int32 if max(2 * pairs, self.n) < 2**31 - 1 else np.int64)
        self._conflicts = conflict_csr(order, hi, self.n, probe)
        return self._conflicts

    def conflict_pairs(self) -> int:
        """Number of conflicting buffer pairs, counted without building the graph."""
        if self._conflicts is not None:
            return len(self._conflicts[1]) // 2
        order, hi = self._start_sweep()
        return int(np.maximum(hi - np.arange(len(order)) - 1, 0).sum())

    def _start_sweep(self) -> tuple[np.ndarray, np.ndarray]:
        """(active buffers sorted by start then index, int64; for each, the first position in that order
        starting at or after its end): positions between conflict with it."""
        act = np.flatnonzero(self.active)
        order = act[np.lexsort((act, self.start[act]))].astype(np.int64)
        hi = np.searchsorted(self.start[order], self.end[order], side="left").astype(np.int64)
        return order, hi

    def subset(self, mask: np.ndarray) -> "PlanProblem":
        """The problem restricted to the buffers in boolean `mask`."""
        return PlanProblem(self.start[mask], self.end[mask], self.size[mask], self.alignment[mask],
                           self.table[mask].reset_index(drop=True), self.device, self.source)


MAX_FOOTPRINT = float(2**62)  # bytes: room for offsets + sizes in int64 arithmetic


def _aligned(values: np.ndarray, alignment: int) -> np.ndarray:
    if alignment < 1:
        raise InputError(f"alignment must be a positive number of bytes, got {alignment}")
    return np.maximum(values, alignment)


def problem_from_frame(df: pd.DataFrame, alignment: int = 1, source: str = "frame") -> PlanProblem:
    """A problem from a DataFrame with MiniMalloc's columns ``id, lower, upper, size[, alignment]``."""
    missing = [c for c in ("lower", "upper", "size") if c not in df.columns]
    if missing:
        raise InputError(f"buffer table lacks column(s) {', '.join(missing)} (expected id,lower,upper,size)")
    df = df.reset_index(drop=True)
    start = df["lower"].to_numpy(np.int64)
    end = df["upper"].to_numpy(np.int64)
    size = df["size"].to_numpy(np.int64)
    if (size < 0).any() or (end < start).any():
        raise InputError("buffer table has a negative size or an upper bound below its lower bound")
    align = np.full(len(df), 1, np.int64)
    if "alignment" in df.columns:
        align = df["alignment"].fillna(1).to_numpy(np.int64)
    table = pd.DataFrame({"id": (df["id"] if "id" in df.columns else pd.Series(range(len(df)))).astype(str),
                          "lower": start, "upper": end, "size": size})
    for col in ATTRIBUTION_COLUMNS:
        if col in df.columns:
            table[col] = df[col].to_numpy()
    align = _aligned(align, alignment)
    # offsets are int64: a layout of every buffer end to end, each padded to its alignment, must fit (an
    # int64-max size would overflow into a wrong plan or a crash)
    if (align < 1).any():
        raise InputError("buffer table has an alignment below 1 byte")
    footprint = float(np.maximum(size, align).astype(np.float64).sum() + align.astype(np.float64).sum())
    if footprint >= MAX_FOOTPRINT:
        raise InputError(f"buffer sizes (with their alignment) add up to {footprint:.3g} bytes, beyond the "
                         f"{MAX_FOOTPRINT:.3g} bytes an int64 plan can lay out")
    return PlanProblem(start, end, size, align, table, None, source)


def problem_from_csv(path, alignment: int = 1) -> PlanProblem:
    """A problem from a MiniMalloc CSV file (``id,lower,upper,size[,alignment]``)."""
    from memlens.io.lifetimes_csv import read_lifetimes_csv
    try:
        return problem_from_frame(read_lifetimes_csv(path), alignment, source=str(path))
    except InputError as exc:  # name the file, as every input error does
        if exc.path is None:
            raise InputError(exc.message, path) from None
        raise


def _iteration_window(trace, iteration: int) -> tuple[int, int]:
    """[start, end] ns of iteration `iteration`: from the ops' ``iteration`` marks when the trace has them,
    otherwise from `memlens.analysis.iterations.split_iterations` (optimizer steps, or the detected
    repeating allocation pattern)."""
    ops = trace.ops
    it = ops["iteration"] if "iteration" in ops.columns else None
    if it is not None and not it.isna().all() and (it >= 0).any():
        sel = ops[it == iteration]
        if len(sel) == 0:
            known = sorted(int(v) for v in it.dropna().unique() if v >= 0)
            raise InputError(f"iteration {iteration} is not in the trace (iterations: {known[:10]}"
                             f"{'...' if len(known) > 10 else ''})")
        return int(sel["start_ns"].min()), int(sel["end_ns"].max())
    from memlens.analysis.iterations import split_iterations

    split = split_iterations(trace)
    if (split["source"] == "none").all():
        raise InputError("the trace has no iteration marks, no optimizer steps and no repeating allocation "
                         "pattern to split it by (record with memlens.step() to mark iterations)")
    row = split[split["iteration"] == iteration]
    if len(row) == 0:
        raise InputError(f"iteration {iteration} is not in the trace ({len(split)} iterations "
                         f"{split['source'].iloc[0]}: 0..{len(split) - 1})")
    return int(row["start_ns"].iloc[0]), int(row["end_ns"].iloc[0])


def pick_device(trace, device: str | None = None) -> str:
    """`device` checked against the trace, or the device with the largest peak live bytes."""
    devices = trace.devices
    if not devices:
        raise InputError("the trace has no blocks to plan")
    if device is not None:
        if device not in devices:
            raise InputError(f"device '{device}' is not in the trace (devices: {', '.join(devices)})")
        return device
    peaks = trace.peak_live_bytes()
    return max(devices, key=lambda d: (peaks.get(d, 0), d))


def problem_from_trace(trace, device: str | None = None, iteration: int | None = None,
                       alignment: int = 1) -> PlanProblem:
    """A problem from one device of a Trace, on the trace's event order.

    With `iteration`, only the blocks alive during that iteration (by the ops' ``iteration`` marks, else
    by optimizer steps or the detected repeating pattern) are kept; blocks alive across its boundaries are clipped to it and flagged ``cross_iteration`` (Zhang et
    al. place them first, since they stay in the pool from one iteration to the next).
    """
    device = pick_device(trace, device)
    lt = trace.lifetimes(device)
    start = lt["start_seq"].to_numpy(np.int64)
    end = lt["end_seq"].to_numpy(np.int64)
    if len(end):
        big = np.iinfo(np.int64).max
        top = int(np.max(np.where(end == big, start, end), initial=0)) + 1
        end = np.where(end == big, top, end)
    cross = np.zeros(len(lt), bool)
    if iteration is not None:
        w0, w1 = _iteration_window(trace, iteration)
        s_ns, e_ns = lt["start_ns"].to_numpy(np.int64), lt["end_ns"].to_numpy(np.int64)
        keep = (s_ns < w1) & (e_ns > w0)
        before, after = s_ns < w0, e_ns > w1
        cross = (before | after)[keep]
        lo, hi = (int(start[keep].min()) - 1, int(end[keep].max()) + 1) if keep.any() else (0, 1)
        start = np.where(before, lo, start)[keep]
        end = np.where(after, hi, end)[keep]
        lt = lt[keep]
    table = pd.DataFrame({"id": lt["block_id"].astype(str).to_numpy(), "lower": start, "upper": end,
                          "size": lt["size"].to_numpy(np.int64)})
    for col in ATTRIBUTION_COLUMNS:
        if col in lt.columns:
            table[col] = lt[col].to_numpy()
    table["cross_iteration"] = cross
    align = np.ones(len(lt), np.int64)
    if "alignment" in lt.columns:
        align = lt["alignment"].fillna(1).to_numpy(np.int64)
    return PlanProblem(start, end, table["size"].to_numpy(), _aligned(align, alignment), table, device,
                       trace.metadata.get("source_path", trace.metadata.get("source_kind", "trace")))


def as_problem(source, device: str | None = None, iteration: int | None = None,
               alignment: int = 1) -> PlanProblem:
    """A PlanProblem from a PlanProblem, a Trace, a DataFrame (MiniMalloc columns) or a path."""
    from memlens.trace import Trace

    if isinstance(source, PlanProblem):
        return source
    if isinstance(source, Trace):
        return problem_from_trace(source, device, iteration, alignment)
    if isinstance(source, pd.DataFrame):
        return problem_from_frame(source, alignment)
    if isinstance(source, (str, Path)):
        from memlens.io.detect import detect_format, load
        if detect_format(source) == "lifetimes_csv":
            return problem_from_csv(source, alignment)
        return problem_from_trace(load(source), device, iteration, alignment)
    raise InputError(f"cannot plan a {type(source).__name__}: pass a Trace, a DataFrame with "
                     "id,lower,upper,size, or a path")
