"""Timing of chosen swaps on two serial copy streams, and the memory curve they leave.

Swap-outs share one device->host stream, in order of when their block goes idle: each starts when its
block's op ends or when the previous copy-out finishes, whichever is later. Swap-ins share one
host->device stream: each is first timed as late as its deadline allows (the next access, or the next
copy-in's start), then pushed later where it must wait for its own copy-out or the previous copy-in; a
copy-in ending after its deadline stalls the op that needs the block (the stall is counted, first order:
later times are not shifted). A swapped block's bytes are free from the end of its copy-out to the start
of its copy-in.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Schedule:
    """Per chosen swap (same order as the inputs): copy-out/copy-in start and end, stall (all ns)."""

    out_start: np.ndarray
    out_end: np.ndarray
    in_start: np.ndarray
    in_end: np.ndarray
    stall: np.ndarray

    @property
    def saving(self) -> np.ndarray:
        """True where the block is really off the device for a while (copy-out ends before copy-in)."""
        return self.out_end < self.in_start


def serial_schedule(idle_from: np.ndarray, idle_to: np.ndarray, out_ns: np.ndarray,
                    in_ns: np.ndarray) -> Schedule:
    """Time the swaps on one copy-out and one copy-in stream (vectorised max-plus scans)."""
    n = len(idle_from)
    if n == 0:
        z = np.zeros(0, np.int64)
        return Schedule(z, z, z, z, z)
    # copy-outs in idle order: end_i = S_i + max_{j<=i}(ready_j - S_{j-1})
    o = np.lexsort((idle_to, idle_from))
    s = np.cumsum(out_ns[o])
    out_end = np.empty(n, np.int64)
    out_end[o] = s + np.maximum.accumulate(idle_from[o] - (s - out_ns[o]))
    out_start = out_end - out_ns
    # copy-ins in deadline order: latest start_i = C_{i-1} + min_{j>=i}(deadline_j - C_j)
    q = np.lexsort((idle_from, idle_to))
    c = np.cumsum(in_ns[q])
    prev_c = c - in_ns[q]
    latest = prev_c + np.minimum.accumulate((idle_to[q] - c)[::-1])[::-1]
    ready = np.maximum(latest, out_end[q])
    in_end = np.empty(n, np.int64)
    in_end[q] = c + np.maximum.accumulate(ready - prev_c)
    in_start = in_end - in_ns
    stall = np.maximum(in_end - idle_to, 0)
    return Schedule(out_start, out_end, in_start, in_end, stall)


class LoadCurve:
    """Live bytes of one device over time (ns), with swaps subtracted on demand.

    Base events keep the trace's order (`Trace.live_bytes`); at equal times a copy-in's re-allocation
    counts before the trace's events and a copy-out's release after them (the conservative order).
    """

    def __init__(self, trace, device: str):
        live = trace.live_bytes(device)
        self.t = np.require(live["t_ns"].to_numpy(np.int64), np.int64, ["C", "W"])
        self.delta = np.require(live["delta"].to_numpy(np.int64), np.int64, ["C", "W"])

    def curve(self, size: np.ndarray | None = None, sched: Schedule | None = None):
        """(times, live bytes after each event) with the saving windows of `sched` subtracted."""
        if sched is None or len(size) == 0:
            return self.t, np.cumsum(self.delta)
        from memlens.swap._kernels import merge_curve

        return merge_curve(self.t, self.delta, *self._swap_events(size, sched))

    def peak_and_overload(self, size: np.ndarray, sched: Schedule, goal: int) -> tuple[int, float]:
        """(peak live bytes, floored at 0; byte*ns above `goal`) with the saving windows of `sched` subtracted."""
        from memlens.swap._kernels import peak_and_overload

        if len(self.t) == 0:
            return 0, 0.0
        peak, over = peak_and_overload(self.t, self.delta, *self._swap_events(size, sched), int(goal))
        return int(peak), float(over)

    @staticmethod
    def _swap_events(size: np.ndarray, sched: Schedule):
        """(copy-in times, sizes, copy-out times, sizes), each sorted by time, of the swaps that save."""
        eff = sched.saving
        z = np.require(size[eff], np.int64, ["C", "W"])
        ins = np.argsort(sched.in_start[eff], kind="stable")
        outs = np.argsort(sched.out_end[eff], kind="stable")
        return sched.in_start[eff][ins], z[ins], sched.out_end[eff][outs], z[outs]

    def peak(self, size=None, sched=None) -> tuple[int, int, int]:
        """(peak bytes, time of the first peak in ns, ns spent at the peak)."""
        t, live = self.curve(size, sched)
        if len(live) == 0:
            return 0, 0, 0
        k = int(np.argmax(live))
        top = int(live[k])
        dur = np.diff(t, append=t[-1])
        return max(top, 0), int(t[k]), int(dur[live == top].sum())

    @staticmethod
    def overload_integral(t: np.ndarray, live: np.ndarray, limit: float, a: np.ndarray,
                          b: np.ndarray) -> np.ndarray:
        """For each window [a, b): integral over time of max(0, live - limit), in byte*ns."""
        if len(t) == 0:
            return np.zeros(len(a))
        over = np.maximum(live.astype(np.float64) - limit, 0.0)
        seg = np.diff(t, append=t[-1]).astype(np.float64) * over
        cum = np.concatenate([[0.0], np.cumsum(seg)])

        def integral_to(x):
            k = np.searchsorted(t, x, side="right") - 1
            inside = k >= 0
            kk = np.clip(k, 0, len(t) - 1)
            return np.where(inside, cum[kk] + (x - t[kk]) * over[kk], 0.0)

        return np.maximum(integral_to(b) - integral_to(a), 0.0)
