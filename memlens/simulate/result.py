"""What a simulation reports, per device: reserved and allocated bytes over time, their peaks, the
segment reservations (sizes and times), fragmentation, and OOMs under a capacity."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd


@dataclass
class DeviceResult:
    """One device's simulated allocator behaviour. Bytes and nanoseconds (trace-relative times).

    ``timeline`` has one row for the start state (``seq`` -1) and one per replayed request: ``t_ns``,
    ``seq``, ``reserved``, ``allocated``, ``inactive_split_bytes`` (cached bytes in split segments, the
    fragmentation torch reports), ``addr`` (the simulated address an allocation got; -1 for other
    requests and OOMs) and ``fragmentation`` (reserved - allocated).
    """

    device: str
    allocator: str
    conf: str
    timeline: pd.DataFrame
    segment_events: pd.DataFrame  # seq, t_ns, action, addr, size
    ooms: list[dict]
    initial_state: str  # "warm" (rebuilt from the recording) or "empty"
    recorded: dict | None = None  # what the recording says (initial/peak/final reserved, segment sizes)
    notes: list[str] = field(default_factory=list)
    final_blocks: pd.DataFrame | None = None  # caching allocator: every block at the end (blocks_table)
    capacity: int | None = None  # bytes the allocator could reserve (given, or inferred from a recorded OOM)

    @property
    def peak_reserved(self) -> int:
        return int(self.timeline["reserved"].max()) if len(self.timeline) else 0

    @property
    def peak_allocated(self) -> int:
        return int(self.timeline["allocated"].max()) if len(self.timeline) else 0

    @property
    def final_reserved(self) -> int:
        return int(self.timeline["reserved"].iloc[-1]) if len(self.timeline) else 0

    @property
    def initial_reserved(self) -> int:
        return int(self.timeline["reserved"].iloc[0]) if len(self.timeline) else 0

    def _reservations(self) -> pd.DataFrame:
        ev = self.segment_events
        return ev[ev["action"].isin(["segment_alloc", "segment_map"])]

    @property
    def segment_allocs(self) -> list[int]:
        """Sizes of the new reservations (segment_alloc, or segment_map with expandable segments), in order."""
        return self._reservations()["size"].astype(int).tolist()

    @property
    def segment_alloc_times(self) -> list[int]:
        """Trace time (ns) of the request that caused each reservation in `segment_allocs`."""
        return self._reservations()["t_ns"].astype(int).tolist()

    @property
    def segment_alloc_seqs(self) -> list[int]:
        return self._reservations()["seq"].astype(int).tolist()

    @property
    def segment_frees(self) -> list[int]:
        ev = self.segment_events
        return ev.loc[ev["action"].isin(["segment_free", "segment_unmap"]), "size"].astype(int).tolist()

    @property
    def peak_fragmentation(self) -> int:
        """Largest reserved - allocated over the replay (bytes)."""
        tl = self.timeline
        return int((tl["reserved"] - tl["allocated"]).max()) if len(tl) else 0

    def summary(self) -> dict[str, Any]:
        """Plain-JSON numbers for this device."""
        out = {
            "allocator": self.allocator, "conf": self.conf, "initial_state": self.initial_state,
            "capacity": self.capacity,
            "peak_reserved": self.peak_reserved, "peak_allocated": self.peak_allocated,
            "initial_reserved": self.initial_reserved, "final_reserved": self.final_reserved,
            "peak_fragmentation": self.peak_fragmentation,
            "peak_inactive_split_bytes": int(self.timeline["inactive_split_bytes"].max())
            if len(self.timeline) else 0,
            "segment_allocs": self.segment_allocs, "segment_alloc_times_ns": self.segment_alloc_times,
            "segment_frees": self.segment_frees, "num_requests": max(len(self.timeline) - 1, 0),
            "ooms": [{k: int(v) if isinstance(v, (int, np.integer)) else v for k, v in o.items()}
                     for o in self.ooms],
            "notes": list(self.notes),
        }
        if self.recorded is not None:
            out["recorded"] = dict(self.recorded)
        return out


@dataclass
class SimulationResult:
    """Per-device results of one simulated allocator configuration on one trace."""

    allocator: str
    conf: str
    capacity: int | None
    devices: dict[str, DeviceResult]

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """device -> {peak_reserved, peak_allocated, segment_allocs, ...} (JSON-serialisable)."""
        return {dev: r.summary() for dev, r in self.devices.items()}

    def summary(self) -> pd.DataFrame:
        """One row per device with the headline numbers (bytes)."""
        rows = []
        for dev, r in self.devices.items():
            rows.append({"device": dev, "allocator": self.allocator, "conf": self.conf,
                         "peak_reserved": r.peak_reserved, "peak_allocated": r.peak_allocated,
                         "final_reserved": r.final_reserved, "peak_fragmentation": r.peak_fragmentation,
                         "segment_allocs": len(r.segment_allocs), "ooms": len(r.ooms)})
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        parts = [f"{d}: peak reserved {r.peak_reserved:,} B, peak allocated {r.peak_allocated:,} B, "
                 f"{len(r.segment_allocs)} segment allocs, {len(r.ooms)} OOMs" for d, r in self.devices.items()]
        return f"<SimulationResult {self.allocator} '{self.conf}': " + "; ".join(parts) + ">"
