"""The Python recorder's own time taken out of its clock, once the recording is over.

The compiled recorder keeps a clock that leaves out its own time as it records (native/clock.h). The Python
recorder stamps with `time.perf_counter_ns()` and logs, instead, every stretch of its own work as an interval
[start, end) of that raw clock: the Python around each op (`__torch_dispatch__` before the op runs and the op
record after it), its hooks (modules, optimizer, step marks), and the weak-reference callbacks that log frees.
After the recording every raw time t becomes t minus the recorder's own time before t (`OwnTime.onto`), so
a gap between two ops holds the program's time, not the recorder's. A time inside one of those intervals (a
block discovered during an op record, a free logged by a callback) lands at the interval's start: where the
program was when the recorder took over.

What no Python code can time stays on the clock: the dispatch-mode machinery that calls `__torch_dispatch__`
and returns from it, the profiler's allocation callbacks, and cache effects. All times are in ns.
"""
from __future__ import annotations

import numpy as np


class OwnTime:
    """The union of the recorder's own intervals, sorted and disjoint, with the own time before each."""

    __slots__ = ("starts", "lengths", "before")

    def __init__(self, starts: np.ndarray, ends: np.ndarray):
        """`starts`, `ends`: int64 raw ns of the logged intervals, in any order, possibly overlapping or
        nested (a free callback inside an op record); empty intervals are ignored."""
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        if len(starts) == 0:
            self.starts = self.lengths = self.before = np.zeros(0, dtype=np.int64)
            return
        reach = np.maximum.accumulate(ends)
        # a new merged interval begins where an interval starts after everything before it has ended
        head = np.ones(len(starts), dtype=bool)
        head[1:] = starts[1:] > reach[:-1]
        group_end = np.empty(int(head.sum()), dtype=np.int64)
        last = np.flatnonzero(np.append(head[1:], True))      # the last interval of each merged one
        group_end[:] = reach[last]
        self.starts = starts[head]
        self.lengths = group_end - self.starts
        self.before = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])

    @classmethod
    def of_log(cls, log) -> "OwnTime":
        """From a flat int64 log of (start, end) pairs (an `array('q')`)."""
        log = log[:len(log) // 2 * 2]         # a copy: a thread still in an op may append to the live log
        pairs = np.frombuffer(log, dtype=np.int64).reshape(-1, 2) if len(log) else np.empty((0, 2), np.int64)
        return cls(pairs[:, 0], pairs[:, 1])

    @property
    def total_ns(self) -> int:
        """All the recorder's own time (ns)."""
        return int(self.lengths.sum())

    def own_until(self, t) -> np.ndarray:
        """The recorder's own time (ns) in (-inf, t] for each raw time t (int64 array)."""
        t = np.asarray(t, dtype=np.int64)
        k = np.searchsorted(self.starts, t, side="right") - 1
        if len(self.starts) == 0:
            return np.zeros(t.shape, dtype=np.int64)
        safe = np.maximum(k, 0)
        inside = np.minimum(np.maximum(t - self.starts[safe], 0), self.lengths[safe])
        return np.where(k >= 0, self.before[safe] + inside, 0)

    def onto(self, t) -> np.ndarray:
        """Raw times (int64 ns) on the clock without the recorder's own time; order is kept (t1 <= t2 stays
        t1' <= t2')."""
        t = np.asarray(t, dtype=np.int64)
        return t - self.own_until(t)


def session_onto_own_clock(session, allocator, clock: tuple[int, int]) -> None:
    """Move a finished Python-recorder session's times (ops, blocks, frees, its stop) and `allocator`'s
    (its events' unix times, a CUDA snapshot's `time_us`) onto the clock without the recorder's own time;
    `session.own_ns` becomes that time (ns). `clock` is (unix ns, perf_counter ns) read together at the
    start: it places the allocator's unix times on the raw clock. Left on the raw host clock when kernel
    times were collected (CUDA): the trace then moves onto the measured kernel clock, whose correlation of
    kernels to ops reads raw launch times. The log is consumed (a second call changes nothing)."""
    stream = session.buf.own
    own = OwnTime.of_log(stream.data)
    stream.replace(np.empty((0, 2), np.int64))
    session.own_extend = stream.data.extend
    if own.total_ns == 0 or (allocator is not None and allocator.kernels is not None and len(allocator.kernels)):
        return
    buf = session.buf
    ops = buf.ops.to_numpy()
    ops[:, 2] = own.onto(ops[:, 2])
    ops[:, 3] = own.onto(ops[:, 3])
    buf.ops.replace(ops)
    blocks = buf.blocks.to_numpy()
    blocks[:, 4] = own.onto(blocks[:, 4])  # -1 (alive before the recording) stays -1: no own time precedes it
    buf.blocks.replace(blocks)
    frees = buf.frees.to_numpy()
    frees[:, 1] = own.onto(frees[:, 1])
    buf.frees.replace(frees)
    session.own_ns = int(own.own_until(np.array([session.t_stop]))[0])   # all logged after the start
    session.t_stop = int(own.onto(np.array([session.t_stop]))[0])
    if allocator is not None:
        _allocator_onto(own, allocator, clock)


def _allocator_onto(own: OwnTime, allocator, clock: tuple[int, int]) -> None:
    """The allocator events' unix times (and a CUDA snapshot's µs ones) moved onto the recorder's clock
    without its own time, still as unix times: `assemble` places them with the same offset as before."""
    wall0, perf0 = clock
    events = allocator.events
    if events is not None and len(events):
        events = events.copy()      # a DataFrame or `Columns`: the instruments' table is left as it was
        events["t_unix_ns"] = own.onto(np.asarray(events["t_unix_ns"], dtype=np.int64) - wall0 + perf0) + wall0 - perf0
        allocator.events = events
    snapshot = allocator.snapshot
    if snapshot:
        entries = [e for trace in snapshot.get("device_traces") or [] for e in trace
                   if isinstance(e, dict) and isinstance(e.get("time_us"), (int, float)) and e.get("time_us")]
        if entries:
            raw = np.array([int(e["time_us"]) * 1000 for e in entries], dtype=np.int64) - wall0 + perf0
            moved = (own.onto(raw) + wall0 - perf0) // 1000
            for entry, t_us in zip(entries, moved.tolist()):
                entry["time_us"] = t_us
