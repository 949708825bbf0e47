"""One iteration as one period of a cycle: the load curve and the copy schedule of a plan that repeats.

A plan made for iteration k runs again in k+1, k+2, ...: a copy that starts near the end of one period and
ends in the next, or a block swapped out across the boundary (the wrap-around interval of a parameter or an
optimizer state), must be accounted in every period. Following SINGA's planner, which lays out several
iterations to handle this, the chosen swaps are copied into neighbouring periods (shifted by the period)
and timed together on the two serial copy streams; the middle copy is the steady-state schedule, checked
to repeat exactly. The load of the period is the recorded load of iteration k (the level carried into it
included) with every swap's absence window wrapped into ``[w0, w1)``.
"""
from __future__ import annotations

import numpy as np

from memlens.swap.schedule import LoadCurve, Schedule, serial_schedule

COPIES = 5  # periods laid out around the one planned (-2..2): queues settle within one period either side


class PeriodicLoadCurve(LoadCurve):
    """Live bytes of one device over one period ``[w0, w1)`` (ns): the level carried into the window, then
    the recorded events inside it. Swaps are subtracted modulo the period."""

    def __init__(self, trace, device: str, window: tuple[int, int]):
        live = trace.live_bytes(device)
        t = live["t_ns"].to_numpy(np.int64)
        delta = live["delta"].to_numpy(np.int64)
        w0, w1 = int(window[0]), int(window[1])
        self.w0, self.w1, self.period = w0, w1, w1 - w0
        before = t < w0
        inside = (t >= w0) & (t < w1)
        carried = int(delta[before].sum())
        self.t = np.require(np.concatenate([[w0], t[inside]]), np.int64, ["C", "W"])
        self.delta = np.require(np.concatenate([[carried], delta[inside]]), np.int64, ["C", "W"])

    def wrap(self, t: np.ndarray) -> np.ndarray:
        """Times folded into the window [w0, w1)."""
        return self.w0 + np.mod(np.asarray(t, np.int64) - self.w0, self.period)

    def _swap_events(self, size: np.ndarray, sched: Schedule):
        """Copy-in and copy-out events of the saving swaps, folded into the period.

        A window ``[out_end, in_start)`` shorter than a period folds to ``[r, q)``; when it wraps (q < r)
        the block is absent over ``[w0, q)`` and ``[r, w1)``: one release just before ``w0`` (before the
        carried level, so it never shows as a spike at ``w0``), the return at q, the release again at r.
        """
        eff = sched.saving
        z = np.require(size[eff], np.int64, ["C", "W"])
        release = self.wrap(sched.out_end[eff])
        back = self.wrap(sched.in_start[eff])
        wrapped = back < release
        out_t = np.concatenate([release, np.full(int(wrapped.sum()), self.w0 - 1, np.int64)])
        out_z = np.concatenate([z, z[wrapped]])
        ins = np.argsort(back, kind="stable")
        outs = np.argsort(out_t, kind="stable")
        return (np.require(back[ins], np.int64, ["C", "W"]), np.require(z[ins], np.int64, ["C", "W"]),
                np.require(out_t[outs], np.int64, ["C", "W"]), np.require(out_z[outs], np.int64, ["C", "W"]))

    def curve(self, size: np.ndarray | None = None, sched: Schedule | None = None):
        """(times, live bytes after each event) of the period, swaps folded in; the helper event placed
        before ``w0`` and the ones at ``w1`` are dropped."""
        t, live = super().curve(size, sched)
        keep = (t >= self.w0) & (t < self.w1)
        if sched is None or size is None or len(size) == 0:
            return t, live
        return t[keep], live[keep]

    def peak(self, size=None, sched=None) -> tuple[int, int, int]:
        """(peak bytes, time of the first peak in ns, ns spent at the peak) within the period."""
        t, live = self.curve(size, sched)
        if len(live) == 0:
            return 0, self.w0, 0
        k = int(np.argmax(live))
        top = int(live[k])
        dur = np.diff(t, append=self.w1)
        return max(top, 0), int(t[k]), int(dur[live == top].sum())


def periodic_schedule(period_ns: int):
    """A scheduler (same signature as `serial_schedule`) for swaps that repeat every `period_ns`.

    The swaps are laid out in `COPIES` consecutive periods and timed together on the two serial streams;
    the middle copy is returned. When the copies on either side of it are not the middle one shifted by a
    period (the streams are saturated: the queue grows every period), every swap is marked with a stall of
    one period, so that no selection keeps such a set.
    """
    def schedule(idle_from: np.ndarray, idle_to: np.ndarray, out_ns: np.ndarray, in_ns: np.ndarray) -> Schedule:
        n = len(idle_from)
        if n == 0:
            return serial_schedule(idle_from, idle_to, out_ns, in_ns)
        shifts = (np.arange(COPIES, dtype=np.int64) - COPIES // 2) * period_ns
        a = (idle_from[None, :] + shifts[:, None]).ravel()
        b = (idle_to[None, :] + shifts[:, None]).ravel()
        s = serial_schedule(a, b, np.tile(out_ns, COPIES), np.tile(in_ns, COPIES))
        mid = slice((COPIES // 2) * n, (COPIES // 2 + 1) * n)
        nxt = slice((COPIES // 2 + 1) * n, (COPIES // 2 + 2) * n)
        prv = slice((COPIES // 2 - 1) * n, (COPIES // 2) * n)
        parts = [s.out_start, s.out_end, s.in_start, s.in_end]
        settled = all(np.array_equal(p[nxt] - period_ns, p[mid]) and np.array_equal(p[prv] + period_ns, p[mid])
                      for p in parts)
        stall = s.stall[mid].copy()
        if not settled:
            stall = np.maximum(stall, period_ns)
        return Schedule(s.out_start[mid], s.out_end[mid], s.in_start[mid], s.in_end[mid], stall)

    return schedule
