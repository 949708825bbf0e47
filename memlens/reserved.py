"""Reserved bytes over time: what PyTorch's caching allocator held from the device, as the source recorded it.

One function for every consumer (the report, ``memlens info``, fragmentation, diff, the simulator's
"recorded" row), so that they cannot disagree. It sits beside `memlens.trace` (it reads only a Trace's
tables) so that analyses and the simulator can both depend on it.

How the curve is built (CUDA snapshots): reserved bytes change only at ``segment_alloc`` / ``segment_map``
(+size) and ``segment_free`` / ``segment_unmap`` (-size) entries. A recording often starts warm (segments
reserved before ``_record_memory_history``): the level at the start is the final ``segments`` total walked
back through the net of the recorded segment events, as the simulator's warm start does
(`memlens.simulate.warmstart`). Reserved memory can never be below the bytes of live blocks; when the file
contradicts that (segments missing from the final state, a ring buffer that dropped segment events), the
starting level is raised to the smallest value that keeps ``reserved >= live`` everywhere, and ``raised_by``
says by how much. Without final segments the starting level is that smallest consistent value (a lower
bound, said in ``basis``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

RESERVE_ACTIONS = ("segment_alloc", "segment_map")
RELEASE_ACTIONS = ("segment_free", "segment_unmap")


@dataclass
class ReservedCurve:
    """Reserved bytes on one device. Arrays are aligned: the level after each of the device's events in
    event order (``seq``, ``t_ns``), preceded by one row at the trace start (``seq`` -1) for the level
    when recording began. Bytes and nanoseconds."""

    device: str
    seq: np.ndarray
    t_ns: np.ndarray
    reserved: np.ndarray
    initial: int
    final: int
    peak: int
    peak_ns: int
    basis: str       # how the level is known (see the module docstring)
    raised_by: int   # bytes added to the starting level so that reserved >= live bytes (0 when consistent)

    def frame(self) -> pd.DataFrame:
        """The curve as a DataFrame: ``seq``, ``t_ns``, ``reserved`` (bytes)."""
        return pd.DataFrame({"seq": self.seq, "t_ns": self.t_ns, "reserved": self.reserved})

    def at(self, seq) -> np.ndarray:
        """Reserved bytes in effect just after global event position(s) `seq` (the last change at or
        before it)."""
        pos = np.searchsorted(self.seq, np.asarray(seq, dtype=np.int64), side="right") - 1
        return self.reserved[np.clip(pos, 0, None)]


def segment_deltas(action: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Change of reserved bytes at each event row (+size for a reservation, -size for a release, else 0)."""
    action = np.asarray(action, dtype=object)
    size = np.asarray(size, dtype=np.int64)
    return np.where(np.isin(action, RESERVE_ACTIONS), size,
                    np.where(np.isin(action, RELEASE_ACTIONS), -size, 0)).astype(np.int64)


def reserved_curve(trace, device: str) -> ReservedCurve | None:
    """The reserved-bytes curve of `device` (see the module docstring), or None when the trace records no
    allocator segments and no segment events for it (e.g. a memlens recording on CPU)."""
    ev = trace.events
    if ev is not None and len(ev):
        ev = ev[ev["device"].astype(str) == device].sort_values("seq", kind="stable")
    else:
        ev = None
    segs = trace.segments
    has_final = segs is not None and len(segs) > 0 and (segs["device"].astype(str) == device).any()
    deltas = segment_deltas(ev["action"].to_numpy(), ev["size"].to_numpy()) if ev is not None \
        else np.zeros(0, np.int64)
    if not has_final and not deltas.any():
        return None
    lo, hi = trace.time_span_ns()
    seq = np.concatenate([[-1], ev["seq"].to_numpy(dtype=np.int64)]) if ev is not None else np.array([-1])
    t_ns = np.concatenate([[lo], ev["t_ns"].to_numpy(dtype=np.int64)]) if ev is not None else np.array([lo])
    running = np.concatenate([[0], np.cumsum(deltas)])
    final_total = int(segs.loc[segs["device"].astype(str) == device, "total_size"].sum()) if has_final else None
    # the smallest starting level at which reserved >= live bytes after every alloc / free
    live = trace.live_bytes(device)
    need = 0
    if len(live):
        pos = np.searchsorted(seq, live["seq"].to_numpy(dtype=np.int64), side="right") - 1
        need = max(0, int((live["live"].to_numpy(dtype=np.int64) - running[np.clip(pos, 0, None)]).max()))
    if final_total is not None:
        initial = final_total - int(running[-1])
        basis = ("final segments walked back through the segment events" if deltas.any()
                 else "final segments (no segment events recorded)")
    else:
        initial = 0
        basis = "segment events only; the level at the start is the least that holds the live blocks"
    raised_by = max(0, need - initial, -int(running.min()) - initial)
    initial += raised_by
    reserved = initial + running
    if len(t_ns) == 1:  # constant level: make it a segment over the whole trace
        seq, t_ns, reserved = np.array([-1, -1]), np.array([lo, hi]), np.repeat(reserved, 2)
    at = int(np.argmax(reserved))
    return ReservedCurve(device=device, seq=seq, t_ns=t_ns, reserved=reserved.astype(np.int64),
                         initial=int(initial), final=int(reserved[-1]), peak=int(reserved[at]),
                         peak_ns=int(t_ns[at]), basis=basis, raised_by=int(raised_by))


def reserved_curves(trace) -> dict[str, ReservedCurve]:
    """`reserved_curve` of every device that has one."""
    devices = set(trace.devices)
    if trace.segments is not None and len(trace.segments):
        devices |= set(trace.segments["device"].astype(str))
    out = {}
    for dev in sorted(devices):
        curve = reserved_curve(trace, dev)
        if curve is not None:
            out[dev] = curve
    return out
