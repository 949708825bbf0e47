"""Where each block sits in the explorer's timeline: x on a time or event-index axis, y on a compacted address axis.

Computed once per device (vectorised; about a second for a million blocks) and shared by every redraw.

- Time axis: ns from the trace start (`Trace.lifetimes`: unknown alloc -> trace start, unknown free -> end),
  so idle gaps between steps show as empty stretches.
- Event-index axis: the block's alloc/free position in the trace's global event order (`alloc_seq` /
  `free_seq`, ranked densely over the device's events); accesses are placed by interpolating their time
  between the surrounding events, so a burst of activity gets room that the time axis would squeeze.
- Address axis: real addresses are sparse (CUDA segments far apart, CPU heap and mmap regions terabytes
  apart), so occupied address regions are laid end to end with small gaps (`compress_gaps`). `y0` is the
  compacted start in bytes; the real address stays in `addr` for the details. Blocks without an address
  (sources that record none) have NaN `y0` and are shown in the stacked live-memory view only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.clock import clock_label


@dataclass
class Factor:
    """A string column factorised once: `codes` per block and the distinct `names`."""

    codes: np.ndarray
    names: np.ndarray

    @classmethod
    def of(cls, values: pd.Series) -> "Factor":
        codes, names = pd.factorize(values.astype(str), sort=True)
        return cls(codes.astype(np.int32), np.asarray(names, dtype=object))


@dataclass
class BlockGeometry:
    """Per-block coordinates and attributes of one device, as numpy arrays aligned by position."""

    device: str
    rows: np.ndarray          # positions in trace.blocks
    block_id: np.ndarray
    size: np.ndarray          # bytes, float64
    t0: np.ndarray            # ns, float64
    t1: np.ndarray
    e0: np.ndarray            # event index, float64
    e1: np.ndarray
    y0: np.ndarray            # compacted address (bytes), NaN when the block has no address
    addr: np.ndarray          # real address, -1 when unknown
    category: Factor
    module: Factor
    op: Factor
    event_t: np.ndarray       # times (ns) of the device's alloc/free events, sorted, for axis conversion
    address_span: float       # bytes on the compacted address axis
    clock: str = ""           # the clock the times are on ("host clock", "modeled H100 SXM clock", ...)
    _events: dict = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        """Number of blocks on this device."""
        return len(self.rows)

    def x0(self, axis: str) -> np.ndarray:
        """Start coordinate on `axis` ("time" in ns or "event" index)."""
        return self.t0 if axis == "time" else self.e0

    def x1(self, axis: str) -> np.ndarray:
        """End coordinate on `axis`."""
        return self.t1 if axis == "time" else self.e1

    def time_to_event(self, t_ns) -> np.ndarray:
        """Fractional event index of times `t_ns` (ns), interpolated between the device's events."""
        if len(self.event_t) == 0:
            return np.zeros(np.shape(t_ns))
        return np.interp(np.asarray(t_ns, dtype=np.float64), self.event_t, np.arange(len(self.event_t),
                                                                                       dtype=np.float64))

    def event_to_time(self, e) -> np.ndarray:
        """Time (ns) of fractional event indices `e`."""
        if len(self.event_t) == 0:
            return np.zeros(np.shape(e))
        return np.interp(np.asarray(e, dtype=np.float64), np.arange(len(self.event_t), dtype=np.float64),
                         self.event_t)

    def to_time(self, x, axis: str) -> np.ndarray:
        """Convert axis coordinates to ns."""
        return np.asarray(x, dtype=np.float64) if axis == "time" else self.event_to_time(x)

    def from_time(self, t_ns, axis: str) -> np.ndarray:
        """Convert ns to axis coordinates."""
        return np.asarray(t_ns, dtype=np.float64) if axis == "time" else self.time_to_event(t_ns)

    def sorted_events(self, axis: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every alloc/free on `axis`, sorted once and cached: (x, delta bytes, block position).

        Frees sort before allocs at equal x (half-open lifetimes); blocks alive at the end of the trace
        have no free event. Filter by a block mask with ``mask[pos]``: the order stays sorted.
        """
        if axis not in self._events:
            n = self.n
            x = np.concatenate([self.x0(axis), self.x1(axis)])
            delta = np.concatenate([self.size, -self.size])
            pos = np.concatenate([np.arange(n), np.arange(n)])
            end = self.full_x_range(axis)[1]
            has_event = np.concatenate([np.ones(n, bool), self.x1(axis) < end])
            order = np.lexsort((delta, x))
            order = order[has_event[order]]
            self._events[axis] = (x[order], delta[order], pos[order])
        return self._events[axis]

    def full_x_range(self, axis: str) -> tuple[float, float]:
        """(min, max) of block extents on `axis`; (0, 1) when empty."""
        if self.n == 0:
            return (0.0, 1.0)
        lo, hi = float(self.x0(axis).min()), float(self.x1(axis).max())
        return (lo, hi if hi > lo else lo + 1.0)


def compact_addresses(addr: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, float]:
    """Start of each [addr, addr + size) on the compacted address axis (`memlens.viz.lod.compress_gaps`).

    `addr` holds -1 where unknown (result NaN). Returns (y0, span) where span is the axis length in bytes.
    """
    from memlens.viz.lod import compress_gaps
    y0 = np.full(len(addr), np.nan)
    known = np.flatnonzero(addr >= 0)
    if len(known) == 0:
        return y0, 0.0
    a, s = addr[known].astype(np.float64), np.maximum(size[known], 1.0)
    # gaps between regions share 10% of the occupied span: compress_gaps' default (2% per gap) would make
    # the axis hundreds of times the occupied bytes when a trace has thousands of separate regions
    _, tight = compress_gaps(a, s, gap=0.0)
    gap = 0.1 * tight["span"] / max(tight["regions"] - 1, 1)
    y_known, info = compress_gaps(a, s, gap=gap)
    y0[known] = y_known
    return y0, float(info["span"])


def _dense_event_index(alloc_seq: np.ndarray, free_seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Alloc/free positions ranked densely (0..n_events-1); unknown alloc -> -0.5, unknown free -> n - 0.5."""
    valid = np.sort(np.concatenate([alloc_seq[alloc_seq >= 0], free_seq[free_seq >= 0]]))
    # distinct values by sort + neighbour test: np.unique is several times slower on large int arrays
    ordered = valid[np.concatenate([[True], valid[1:] != valid[:-1]])] if len(valid) else valid
    n = len(ordered)
    e0 = np.where(alloc_seq >= 0, np.searchsorted(ordered, alloc_seq), -0.5).astype(np.float64)
    e1 = np.where(free_seq >= 0, np.searchsorted(ordered, free_seq), n - 0.5).astype(np.float64)
    return e0, e1


def block_geometry(trace, device: str) -> BlockGeometry:
    """The `BlockGeometry` of `device`'s blocks in `trace`."""
    blocks = trace.blocks
    rows = np.flatnonzero((blocks["device"] == device).to_numpy())
    b = blocks.iloc[rows]
    lo, hi = trace.time_span_ns()
    t0 = b["alloc_ns"].to_numpy(dtype=np.float64, na_value=lo)
    t1 = b["free_ns"].to_numpy(dtype=np.float64, na_value=hi)
    alloc_seq = b["alloc_seq"].to_numpy(dtype=np.float64, na_value=-1).astype(np.int64)
    free_seq = b["free_seq"].to_numpy(dtype=np.float64, na_value=-1).astype(np.int64)
    e0, e1 = _dense_event_index(alloc_seq, free_seq)
    size = b["size"].to_numpy(dtype=np.float64)
    addr = b["addr"].to_numpy(dtype=np.float64, na_value=-1).astype(np.int64)
    y0, span = compact_addresses(addr, size)
    # event times in event-index order, for converting between the two x axes
    seq_t = np.concatenate([t0[alloc_seq >= 0], t1[free_seq >= 0]])
    seq_k = np.concatenate([alloc_seq[alloc_seq >= 0], free_seq[free_seq >= 0]])
    event_t = np.maximum.accumulate(seq_t[np.argsort(seq_k, kind="stable")]) if len(seq_k) else seq_t
    return BlockGeometry(
        device=device, rows=rows, block_id=b["block_id"].to_numpy(dtype=np.int64), size=size,
        t0=t0, t1=np.maximum(t1, t0), e0=e0, e1=np.maximum(e1, e0 + 0.5), y0=y0, addr=addr,
        category=Factor.of(b["category"]), module=Factor.of(b["module"]), op=Factor.of(b["op"]),
        event_t=event_t, address_span=span, clock=clock_label(trace))
