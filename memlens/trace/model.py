"""The Trace: memlens's one data model.

Recorders and importers produce a `Trace`; analyses, simulators, figures, reports and the CLI consume it.
A Trace is a handful of pandas DataFrames plus a metadata dict. Units: bytes and nanoseconds everywhere.
Times are relative to the start of the trace (``t = 0`` is the first event); ``metadata["t0_unix_ns"]``
holds the absolute start when the source knows it.

Tables (required columns and dtypes in `SCHEMA`; extra columns are allowed and kept):

``blocks``: one row per allocation (an address reused is a new block)
    block_id (int64), device (str, "cpu", "cuda:0"), addr (Int64, missing when the source has none),
    size (int64, bytes requested), alloc_ns / free_ns (Int64; alloc_ns missing when allocated before
    recording, free_ns missing when still alive at the end), alloc_seq / free_seq (Int64: position in the
    trace's global event order, the tie-break for equal timestamps), category (str), op (str, the op that
    allocated it), alloc_op_id (Int64), module (str), stack_id (Int64), stream (int64),
    allocated_before (bool: alive before recording began), free_without_alloc (bool: the source saw the
    free but not the alloc, e.g. a snapshot's ring buffer overflowed), source (str: which instrument saw it).
``accesses``: block_id (int64), t_ns (int64), op_id (int64), is_write (bool)
``ops``: op_id (int64), name (str), start_ns / end_ns (int64), module (str), iteration (Int64); cost facts
    (optional: filled with 0 / "" when a source lacks them, e.g. imported traces): flops (int64),
    bytes_read / bytes_written (int64, bytes), dtype (str, dominant compute dtype), shapes (str, e.g.
    ``"bf16[141,512],bf16[512,512]->bf16[141,512]"``); see `memlens.opfacts.costs`.
``segments`` (optional): allocator segments at the end of the recording (snapshot imports)
``segment_blocks`` (optional): the blocks inside those segments, with their state
``events`` (optional): raw allocator events (segment_alloc, segment_free, oom, ...), in order
``stacks`` (optional): deduplicated frames, one row per (stack_id, depth); depth 0 is the innermost frame
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

# the schema lives below this module (the saved-trace writer needs it, and Trace.save needs the writer);
# `memlens.trace` re-exports its names, where producers and analyses have always taken them
from memlens.trace.checks import validate_trace
from memlens.trace.schema import OPTIONAL_TABLES, SCHEMA, SCHEMA_VERSION, conform, conform_clock
from memlens.trace.tracedir import save_trace


def event_order(block_id: np.ndarray, alloc_ns: np.ndarray, alloc_missing: np.ndarray, free_ns: np.ndarray,
                free_missing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(alloc_seq, free_seq) of blocks, int64 (a free_seq where free_missing is meaningless): every block's
    alloc and free placed in one order of events, by time (ns); at equal times frees come before allocs
    (half-open lifetimes), then block_id; a block allocated and freed at the same instant is freed after
    that instant's allocs (never before its own). An alloc time missing counts as before everything, a
    free time missing as after everything."""
    n = len(block_id)
    alloc = np.asarray(alloc_ns, dtype=np.int64)
    free = np.asarray(free_ns, dtype=np.int64)
    t = np.concatenate([np.where(alloc_missing, -np.inf, alloc.astype(np.float64)),
                        np.where(free_missing, np.inf, free.astype(np.float64))])
    # free (0) before alloc (1) at the same time; a block's own free never before its own alloc (2: a block
    # that lives zero ns is freed after the allocs of that instant)
    zero_length = ~alloc_missing & ~free_missing & (alloc == free)
    kind = np.concatenate([np.ones(n), np.where(zero_length, 2.0, 0.0)])
    bid = np.concatenate([block_id, block_id])
    order = np.lexsort((bid, kind, t))
    rank = np.empty(2 * n, dtype=np.int64)
    rank[order] = np.arange(2 * n)
    return rank[:n], rank[n:]


def _fill_seq(blocks: pd.DataFrame) -> pd.DataFrame:
    """Give every block an alloc_seq/free_seq when the producer left them out (`event_order`)."""
    if len(blocks) == 0 or (blocks["alloc_seq"].notna().all() and
                            (blocks["free_seq"].notna() | blocks["free_ns"].isna()).all()):
        return blocks
    free_missing = blocks["free_ns"].isna().to_numpy()
    alloc_seq, free_seq = event_order(blocks["block_id"].to_numpy(),
                                      blocks["alloc_ns"].to_numpy(dtype=np.int64, na_value=0),
                                      blocks["alloc_ns"].isna().to_numpy(),
                                      blocks["free_ns"].to_numpy(dtype=np.int64, na_value=0), free_missing)
    blocks = blocks.copy()
    blocks["alloc_seq"] = pd.arrays.IntegerArray(alloc_seq, np.zeros(len(alloc_seq), dtype=bool))
    blocks["free_seq"] = pd.arrays.IntegerArray(free_seq, free_missing.copy())
    return blocks


def clock_of(trace) -> dict:
    """The clock a trace's times are on, as a plain dict (a copy) with every key of the contract
    (`memlens.trace.schema.CLOCK_KEYS`: kind "host"|"cuda"|"modeled", gpu, model, ...); the host clock when the
    metadata names none, or only a unit string as importers did before the contract. Takes anything with a
    ``metadata`` dict; its one home (`memlens.clock` holds the re-stamping that moves a trace between
    clocks)."""
    clock = (getattr(trace, "metadata", None) or {}).get("clock") if trace is not None else None
    return conform_clock(clock)


def live_events(blocks: pd.DataFrame, start_ns: int, by: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """The one event order of the live-bytes curve: each block's alloc (at `start_ns` for blocks alive before
    recording) and each freed block's free, sorted by time then event order (`alloc_seq` / `free_seq`;
    an unknown free order after every known one). Returns (t_ns, seq, delta bytes (+ alloc / - free), row
    of `blocks` each event belongs to, True for an alloc event), all in that order; ``np.cumsum(delta)``
    is the live bytes after each event. With `by` (an integer code per row of `blocks`, e.g. the device),
    the events are grouped by it first, each group in that order. `Trace.live_bytes`,
    `memlens.analysis.live.live_curve` and the peak breakdown's per-device peaks are all this curve."""
    size = blocks["size"].to_numpy(dtype=np.int64)
    freed = blocks["free_ns"].notna().to_numpy()
    t = np.concatenate([blocks["alloc_ns"].fillna(start_ns).to_numpy(dtype=np.int64),
                        blocks["free_ns"].to_numpy(dtype="float64", na_value=0)[freed].astype(np.int64)])
    seq = np.concatenate([blocks["alloc_seq"].fillna(-1).to_numpy(dtype=np.int64),
                          blocks["free_seq"].fillna(np.iinfo(np.int64).max).to_numpy(dtype=np.int64)[freed]])
    delta = np.concatenate([size, -size[freed]])
    row = np.concatenate([np.arange(len(size)), np.flatnonzero(freed)])
    is_alloc = np.arange(len(row)) < len(size)
    order = np.lexsort((seq, t)) if by is None else np.lexsort((seq, t, np.asarray(by)[row]))
    return t[order], seq[order], delta[order], row[order], is_alloc[order]


@dataclass
class Trace:
    """A memory trace: blocks, their accesses, the ops that made them, and metadata.

    Build one with `Trace.from_tables` (which fills and casts columns) rather than the constructor.
    """

    blocks: pd.DataFrame
    accesses: pd.DataFrame
    ops: pd.DataFrame
    metadata: dict[str, Any] = field(default_factory=dict)
    segments: pd.DataFrame | None = None
    segment_blocks: pd.DataFrame | None = None
    events: pd.DataFrame | None = None
    stacks: pd.DataFrame | None = None

    def __post_init__(self):
        # one clock contract on every trace, however it was built or loaded (a saved trace of an older
        # memlens may hold the clock as a unit string, or none): `memlens.trace.schema.conform_clock`
        if isinstance(self.metadata, dict):
            self.metadata["clock"] = conform_clock(self.metadata.get("clock"))

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_tables(cls, blocks: pd.DataFrame, accesses: pd.DataFrame | None = None,
                    ops: pd.DataFrame | None = None, metadata: dict | None = None, **optional) -> "Trace":
        """Build a Trace, filling defaults and casting every column to the schema's dtype."""
        unknown = set(optional) - set(OPTIONAL_TABLES)
        if unknown:
            raise TypeError(f"unknown tables: {sorted(unknown)}")
        blocks = _fill_seq(conform("blocks", blocks))
        meta = {"schema_version": SCHEMA_VERSION, "source_kind": "unknown", "notes": []}
        meta.update(metadata or {})
        meta.setdefault("devices", sorted(blocks["device"].unique().tolist()))
        tables = {k: (conform(k, v) if v is not None else None) for k, v in optional.items()}
        return cls(blocks=blocks, accesses=conform("accesses", accesses), ops=conform("ops", ops),
                   metadata=meta, **tables)

    # ---- basic facts --------------------------------------------------------------------------
    @property
    def has_accesses(self) -> bool:
        """True when the trace records which op read or wrote each block."""
        return len(self.accesses) > 0

    @property
    def no_blocks(self) -> str:
        """Why the trace has no blocks, as the subject of a message ("the trace has no blocks", or that the
        profile it came from has no memory events); "" when it has blocks."""
        if len(self.blocks):
            return ""
        if self.metadata.get("memory_events") == 0:
            return ("the profile has no [memory] events (recorded without torch.profiler.profile("
                    "profile_memory=True)), so it has no blocks")
        return "the trace has no blocks"

    @property
    def devices(self) -> list[str]:
        """Devices that have blocks, sorted."""
        return sorted(self.blocks["device"].unique().tolist())

    def table(self, name: str) -> pd.DataFrame | None:
        """The table called `name` (None for an absent optional table)."""
        if name not in SCHEMA:
            raise KeyError(name)
        return getattr(self, name)

    def time_span_ns(self) -> tuple[int, int]:
        """(first, last) timestamp in the trace over all tables, in ns; (0, 0) when empty."""
        values = []
        for name, cols in (("blocks", ("alloc_ns", "free_ns")), ("accesses", ("t_ns",)),
                           ("ops", ("start_ns", "end_ns")), ("events", ("t_ns",))):
            df = self.table(name)
            if df is None or len(df) == 0:
                continue
            for c in cols:
                s = df[c].dropna()
                if len(s):
                    values += [int(s.min()), int(s.max())]
        return (min(values), max(values)) if values else (0, 0)

    @property
    def duration_ns(self) -> int:
        """Last minus first timestamp, in ns."""
        lo, hi = self.time_span_ns()
        return hi - lo

    def lifetimes(self, device: str | None = None) -> pd.DataFrame:
        """Blocks with concrete `start_ns`/`end_ns` (trace start/end filled in for unknown ends).

        Also `start_seq`/`end_seq` on the global event order. Rows of other devices are dropped when
        `device` is given.
        """
        b = self.blocks if device is None else self.blocks[self.blocks["device"] == device]
        lo, hi = self.time_span_ns()
        out = b.copy()
        out["start_ns"] = b["alloc_ns"].fillna(lo).astype("int64")
        out["end_ns"] = b["free_ns"].fillna(hi).astype("int64")
        big = np.iinfo(np.int64).max
        out["start_seq"] = b["alloc_seq"].fillna(-1).astype("int64")
        out["end_seq"] = b["free_seq"].fillna(big).astype("int64")
        return out

    def live_bytes(self, device: str) -> pd.DataFrame:
        """Live bytes on `device` after every alloc/free, in event order (`live_events`).

        Returns a DataFrame with `t_ns`, `seq`, `delta` (bytes, + alloc / - free), `live` (bytes live
        after the event) and `block_id`. Blocks allocated before recording count from the start.
        """
        b = self.blocks[self.blocks["device"] == device]
        t, seq, delta, row, _ = live_events(b, self.time_span_ns()[0])
        return pd.DataFrame({"t_ns": t, "seq": seq, "delta": delta, "live": np.cumsum(delta),
                             "block_id": b["block_id"].to_numpy()[row]})

    def peak_live_bytes(self) -> dict[str, int]:
        """Max over time of the sum of live block sizes, per device, in bytes."""
        out = {}
        for dev in self.devices:
            live = self.live_bytes(dev)["live"]
            out[dev] = int(max(live.max(), 0)) if len(live) else 0
        return out

    # ---- persistence --------------------------------------------------------------------------
    def save(self, path, *, overwrite: bool = False):
        """Write the trace as a ``NAME.memlens/`` directory of Parquet tables and a manifest.

        The write is atomic: a sibling temporary directory is filled and then renamed into place.
        Returns the path written.
        """
        return save_trace(self, path, overwrite=overwrite)

    def validate(self) -> "Trace":
        """Check internal consistency; raise `InputError` naming the first problem found."""
        validate_trace(self)
        return self

    def summary(self) -> dict[str, Any]:
        """The numbers `memlens info` prints: counts, devices, duration and peak live bytes."""
        return {
            "blocks": int(len(self.blocks)),
            "accesses": int(len(self.accesses)),
            "ops": int(len(self.ops)),
            "devices": self.devices,
            "duration_ns": int(self.duration_ns),
            "peak_live_bytes": self.peak_live_bytes(),
            "source_kind": self.metadata.get("source_kind", "unknown"),
            "clock": clock_of(self),
            "has_accesses": self.has_accesses,
            "allocated_before": int(self.blocks["allocated_before"].sum()),
            "free_without_alloc": int(self.blocks["free_without_alloc"].sum()),
            "alive_at_end": int(self.blocks["free_ns"].isna().sum()),
            "notes": list(self.metadata.get("notes", [])),
        }

    def __repr__(self) -> str:
        from memlens.units import format_ns
        s = self.summary()
        return (f"<memlens.Trace {s['source_kind']}: {s['blocks']} blocks, {s['accesses']} accesses, "
                f"{s['ops']} ops on {', '.join(s['devices']) or 'no device'}, "
                f"{format_ns(s['duration_ns'])}>")
