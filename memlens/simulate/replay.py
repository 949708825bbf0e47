"""Turn a `memlens.Trace` into what an allocator replay needs, per device: the request stream, the state
the allocator was in when recording began, and what the recording says the real allocator did.

Request stream. A snapshot import has ``events``: its ``alloc`` rows are requests (size = the caller's
bytes; the replay rounds them), ``free_requested`` / ``free_completed`` rows drop and return blocks
(different rows when ``record_stream`` deferred the return, otherwise merged into one immediate free).
Releases: a run of ``segment_free`` / ``segment_unmap`` rows that no ``segment_alloc`` / ``segment_map``
follows is an ``empty_cache()`` call (`EMPTY_CACHE`), replayed at the same point. A run followed by a new
reservation (`RELEASE_BEFORE_RESERVE`) is either ``empty_cache()`` then a request, or the allocator's OOM
retry (a full device: cudaMalloc failed, every cached segment released, retried) — the entries are the same.
Both release every unsplit cached segment, so without a capacity the replay applies it at that point; with a
capacity the simulated OOM path decides. A run followed by an ``oom`` entry is the failed OOM path itself.
An ``oom`` entry is a request the real allocator could not serve (`FAILED_REQUEST`, size = its rounded
bytes): the replay tries it again and, when it fits, frees it at once (the program never got the memory),
so a what-if tells whether the OOM would have happened. The device capacity at the OOM is inferable from
the recording: reserved bytes at that point plus the entry's ``device_free``.
Other traces give requests from ``blocks``: ``alloc_seq`` / ``free_seq``, size = requested bytes, ``stream``.

Initial state: see `memlens.simulate.warmstart`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.reserved import RELEASE_ACTIONS, RESERVE_ACTIONS, reserved_curve
from memlens.simulate.config import AllocatorConfig
from memlens.simulate.warmstart import (
    InitialSegment, initial_expandable_runs, initial_segments, int_column, live_at_start, place_live_blocks,
)

ALLOC, FREE, FREE_REQUESTED, FREE_COMPLETED, EMPTY_CACHE, RELEASE_BEFORE_RESERVE, FAILED_REQUEST = \
    0, 1, 2, 3, 4, 5, 6
_RESERVE = ("segment_alloc", "segment_map")
_RELEASE = ("segment_free", "segment_unmap")


@dataclass
class Recorded:
    """What the recording says the real allocator reserved on one device (bytes)."""

    initial_reserved: int
    final_reserved: int
    peak_reserved: int
    segment_allocs: list[int]  # sizes of segment_alloc / segment_map events, in order
    segment_alloc_seqs: list[int]
    segment_frees: list[int]
    oom_capacity: int | None = None  # smallest reserved + device_free over the recorded OOMs (bytes)


@dataclass
class DeviceRequests:
    """Everything a replay of one device needs; arrays are aligned, one row per request."""

    device: str
    kind: np.ndarray
    block_id: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    t_ns: np.ndarray
    seq: np.ndarray
    live_at_start: pd.DataFrame  # block_id, addr, size (requested), block_size, stream, pending
    warm_segments: list[InitialSegment]
    address_hints: dict[int, list[int]]
    recorded: Recorded | None
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.kind)


def _requests_from_events(ev: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """(kind, block_id, size, stream, t_ns, seq) from one device's event rows, in order."""
    action = ev["action"].to_numpy(dtype=object)
    block = int_column(ev, "block_id", -1)
    n = len(ev)
    kind = np.full(n, -1, dtype=np.int8)
    kind[action == "alloc"] = ALLOC
    kind[action == "free_requested"] = FREE_REQUESTED
    kind[action == "free_completed"] = FREE_COMPLETED
    kind[action == "oom"] = FAILED_REQUEST
    # a completion right after its own request is an ordinary free: one step instead of two
    if n > 1:
        pair = (kind[:-1] == FREE_REQUESTED) & (kind[1:] == FREE_COMPLETED) & (block[:-1] == block[1:])
        kind[:-1][pair] = FREE
        kind[1:][pair] = -1
    # empty_cache: a run of releases not followed by a new reservation
    release = np.isin(action, _RELEASE)
    if release.any():
        starts = np.flatnonzero(release & ~np.concatenate([[False], release[:-1]]))
        ends = np.flatnonzero(release & ~np.concatenate([release[1:], [False]])) + 1  # one past each run
        for s, e in zip(starts, ends):
            following = action[e] if e < n else None
            if following in _RESERVE:
                kind[s] = RELEASE_BEFORE_RESERVE
            elif following != "oom":
                kind[s] = EMPTY_CACHE
    keep = kind >= 0
    seq = ev["seq"].to_numpy(dtype=np.int64)
    block = np.where(kind == FAILED_REQUEST, -1 - seq, block)  # an id no recorded block uses
    return (kind[keep], block[keep], ev["size"].to_numpy(dtype=np.int64)[keep],
            ev["stream"].to_numpy(dtype=np.int64)[keep], ev["t_ns"].to_numpy(dtype=np.int64)[keep],
            ev["seq"].to_numpy(dtype=np.int64)[keep])


def _requests_from_blocks(b: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """Requests from block lifetimes (alloc at alloc_seq, immediate free at free_seq). Blocks alive before
    recording are not requested here: they belong to the start state."""
    a_seq = int_column(b, "alloc_seq", -1)
    f_seq = int_column(b, "free_seq", -1)
    a_t = int_column(b, "alloc_ns", 0)
    f_t = int_column(b, "free_ns", 0)
    has_alloc = (a_seq >= 0) & ~b["allocated_before"].to_numpy(dtype=bool)
    has_free = f_seq >= 0
    bid = b["block_id"].to_numpy(dtype=np.int64)
    size = b["size"].to_numpy(dtype=np.int64)
    stream = b["stream"].to_numpy(dtype=np.int64)
    kind = np.concatenate([np.full(has_alloc.sum(), ALLOC, np.int8), np.full(has_free.sum(), FREE, np.int8)])
    seq = np.concatenate([a_seq[has_alloc], f_seq[has_free]])
    order = np.lexsort((-kind, seq))  # at an equal seq, the free goes first (half-open lifetimes)
    cat = lambda x: np.concatenate([x[has_alloc], x[has_free]])[order]  # noqa: E731
    return (kind[order], cat(bid), cat(size), cat(stream),
            np.concatenate([a_t[has_alloc], f_t[has_free]])[order], seq[order])


def _recorded(trace, device: str, ev: pd.DataFrame) -> Recorded | None:
    """What the recording says was reserved: `memlens.reserved.reserved_curve`, the one curve the report,
    info, fragmentation and diff also use; None when the trace records no segments for `device`."""
    curve = reserved_curve(trace, device)
    if curve is None:
        return None
    action = ev["action"].to_numpy(dtype=object)
    size = ev["size"].to_numpy(dtype=np.int64)
    allocs = np.isin(action, RESERVE_ACTIONS)
    oom_capacity = None
    oom = action == "oom"
    if oom.any() and "device_free" in ev.columns:
        free = pd.array(ev["device_free"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)[oom]
        reserved_then = curve.at(ev["seq"].to_numpy(dtype=np.int64)[oom])
        known = free >= 0
        if known.any():
            oom_capacity = int((reserved_then[known] + free[known]).min())
    return Recorded(curve.initial, curve.final, curve.peak, size[allocs].tolist(),
                    ev["seq"].to_numpy()[allocs].tolist(), size[np.isin(action, RELEASE_ACTIONS)].tolist(),
                    oom_capacity)


def device_requests(trace, device: str, config: AllocatorConfig) -> DeviceRequests:
    """Build the replay input of `device` (see the module docstring); `config` rounds estimated sizes."""
    ev_all = trace.events
    blocks = trace.blocks[trace.blocks["device"] == device]
    segs = None
    if trace.segments is not None and len(trace.segments):
        segs = trace.segments[trace.segments["device"] == device]
    notes: list[str] = []
    if ev_all is not None and len(ev_all):
        ev = ev_all[ev_all["device"] == device].sort_values("seq", kind="stable")
    else:
        ev = pd.DataFrame({"seq": [], "t_ns": [], "action": [], "addr": [], "size": [], "stream": []})
    # events drive the replay only when every alloc/free row names its block (else: block lifetimes)
    block_rows = ev["action"].isin(["alloc", "free_requested", "free_completed"])
    if len(ev) and "block_id" in ev.columns and not ev.loc[block_rows, "block_id"].isna().any():
        kind, bid, size, stream, t_ns, seq = _requests_from_events(ev)
    else:
        kind, bid, size, stream, t_ns, seq = _requests_from_blocks(blocks)
    live = live_at_start(blocks)
    recorded = _recorded(trace, device, ev)
    warm: list[InitialSegment] = []
    if segs is not None:
        if "segment_pool_id" in segs.columns and (~segs["segment_pool_id"].isin(["", "0,0"])).any():
            notes.append("segments in private pools (CUDA graphs / torch.cuda.MemPool) are replayed as if "
                         "they belonged to the default pools")
        segments = initial_segments(ev, segs)
        segments.update(initial_expandable_runs(ev, segs))
        alloc_addrs = ev.loc[ev["action"] == "alloc", "addr"].dropna().to_numpy(dtype=np.int64) \
            if len(ev) else np.empty(0, np.int64)
        place_live_blocks(segments, live, alloc_addrs, config, notes)
        warm = [segments[a] for a in sorted(segments)]
    hints: dict[int, list[int]] = {}
    if len(ev):
        sa = ev[ev["action"] == "segment_alloc"]
        for s, a in zip(sa["size"].to_numpy(dtype=np.int64), sa["addr"].to_numpy(dtype=np.int64)):
            hints.setdefault(int(s), []).append(int(a))
    return DeviceRequests(device, kind, bid, size, stream, t_ns, seq, live, warm, hints, recorded, notes)
