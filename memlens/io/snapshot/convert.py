"""Convert a CUDA memory snapshot pickle to a saved ``NAME.memlens`` trace without building the `Trace`.

`import_snapshot` followed by `save_trace` holds the events as a DataFrame (an object column per string
field, a nullable array per optional integer) alongside everything else, and the whole Arrow table of each
table while it is written: its peak grows ~470 bytes per device-trace entry on synthetic snapshots (552 MB
for 706k entries). `convert_snapshot` keeps the entries only as the numpy columns of
`memlens.io.snapshot.importer.SnapshotParts` (~80 bytes per entry) and writes the ``events`` table from them a row
group at a time (`memlens.trace.partitioned.PartitionedTraceWriter`), so no per-row Python object and no
whole-table DataFrame or Arrow copy of the events is ever made.

What still needs every entry at once, and why (so memory still grows with the file, by the columns'
bytes per entry, not the DataFrames'):

- the clock: ``t_ns`` is relative to the earliest entry of any device, and an entry without ``time_us``
  anywhere turns every device's clock into the entry index;
- pairing entries into blocks (an address's entries line up by (device, address, seq); a block's row needs
  its free, which may come at the very end) and matching the blocks left live with the final state;
- the story (`memlens.io.snapshot.story`): the phase of every event is smoothed over its neighbours and
  filled forward from earlier ones, and the categories count sizes over all blocks.

Those run on the compact columns (the same code as the in-memory import, `snapshot_parts`, so the tables
are identical); the story keeps four per-entry columns (t_ns and action as views, block id and stack id,
~34 bytes per entry) after the others are freed. The blocks, stacks and allocator-state tables are held
whole, as in memory (about a block per three entries). The peak grows ~290 bytes per entry (373 MB for 706k
entries).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.errors import InputError
from memlens.trace.partitioned import PartitionedTraceWriter
from memlens.io.snapshot.events import EventColumns, events_table
from memlens.io.snapshot.frames import NO_STACK

STREAM_ROWS_PER_GROUP = 1 << 17  # rows per row group; a group of events in memory as a DataFrame and in
# Arrow while it is written: ~25 MB


class _TraceView:
    """What `memlens.io.snapshot.story.tell_story` and `memlens.trace.checks.validate_trace` read of a trace
    (blocks, some columns of the events, stacks, ops, allocator state, metadata, the time span), without a
    whole events DataFrame."""

    def __init__(self, blocks, events, stacks, ops, metadata, segments=None, segment_blocks=None):
        from memlens.trace import conform
        self.blocks, self.events, self.stacks, self.ops, self.metadata = blocks, events, stacks, ops, metadata
        self.segments, self.segment_blocks = segments, segment_blocks
        self.accesses = conform("accesses", None)

    def table(self, name: str):
        return getattr(self, name, None)

    def time_span_ns(self) -> tuple[int, int]:
        from memlens.trace import Trace
        return Trace.time_span_ns(self)


def _story_events(ev: EventColumns, block_of_row: np.ndarray) -> pd.DataFrame:
    """The events columns the story reads, typed as the conformed events table types them."""
    is_block = block_of_row >= 0
    return pd.DataFrame({
        # object, as the conformed table has it: left to infer, pandas would copy the strings into Arrow
        # and the story's ``to_numpy(object)`` make a Python string per row again
        "t_ns": ev.t_ns.astype(np.int64, copy=False), "action": pd.Series(ev.action, dtype=object, copy=False),
        "block_id": pd.arrays.IntegerArray(np.where(is_block, block_of_row, 0), ~is_block),
        "stack_id": pd.arrays.IntegerArray(np.where(ev.stack_id == NO_STACK, 0, ev.stack_id),
                                           ev.stack_id == NO_STACK),
    }, copy=False)


def _event_slice(ev: EventColumns, lo: int, hi: int) -> EventColumns:
    """Rows lo..hi-1 of `ev` (views of its arrays; the extras lists sliced)."""
    cut = {f.name: getattr(ev, f.name)[lo:hi] for f in dataclasses.fields(ev)
           if isinstance(getattr(ev, f.name), np.ndarray)}
    return dataclasses.replace(ev, **cut, extras={k: v[lo:hi] for k, v in ev.extras.items()})


def _release_arrow_pool() -> None:
    """Give the memory Arrow's allocator keeps for reuse back to the system (tens of MB after writing)."""
    import pyarrow as pa
    pa.default_memory_pool().release_unused()


def _add_in_groups(writer: PartitionedTraceWriter, name: str, df: pd.DataFrame | None, rows: int) -> None:
    if df is None:
        return
    for lo in range(0, max(len(df), 1), rows):
        writer.add(name, df.iloc[lo:lo + rows])


def convert_snapshot(path, dst, *, rows_per_group: int = STREAM_ROWS_PER_GROUP, overwrite: bool = False) -> Path:
    """Convert the snapshot pickle `path` to the saved trace `dst` (see the module docstring): the same
    tables, metadata and seq values as ``import_snapshot(path).save(dst)``, every table written in row
    groups of `rows_per_group` rows. Returns the path written; bad input raises `InputError` naming the
    file and leaves nothing behind."""
    from memlens.io.safe_pickle import pickle_buffer
    from memlens.io.snapshot.importer import _normalize, _read, snapshot_errors, snapshot_parts
    from memlens.io.snapshot.story import tell_story
    from memlens.trace import SCHEMA_VERSION, conform
    from memlens.trace.model import _fill_seq
    from memlens.trace.checks import validate_trace

    path = Path(path)
    if Path(dst).exists() and not overwrite:  # before the read, which is the slow part
        raise InputError("already exists (pass overwrite=True to replace it)", dst)
    try:
        with pickle_buffer(path) as buf:
            snapshot, interner = _read(buf, path)
    except InputError as exc:
        raise InputError(exc.message, path) from None
    segments, device_traces, extras = _normalize(snapshot, path)
    del snapshot
    with snapshot_errors(path):
        parts = snapshot_parts(segments, device_traces, extras, str(path), interner, release=True)
        del segments, device_traces
        # what `Trace.from_tables` does to the tables and metadata, without the events DataFrame
        blocks = _fill_seq(conform("blocks", parts.blocks))
        meta = {"schema_version": SCHEMA_VERSION, "source_kind": "unknown", "notes": []}
        meta.update(parts.metadata)
        meta.setdefault("devices", sorted(blocks["device"].unique().tolist()))
        stacks = conform("stacks", parts.stacks)
        ops = conform("ops", parts.ops)
        parts.blocks = parts.stacks = parts.ops = None
    # the checks `memlens.io.load` makes of every import, on the same columns (the events' as numpy views)
    checked_events = pd.DataFrame({"t_ns": parts.events.t_ns, "size": parts.events.size}, copy=False)
    try:
        validate_trace(_TraceView(blocks, checked_events, stacks, ops, meta, parts.final.segments,
                                  parts.final.segment_blocks))
    except InputError as exc:
        raise InputError(f"bad values in the file: {exc.message}", path) from None
    del checked_events
    with PartitionedTraceWriter(dst, meta, rows_per_group=rows_per_group, overwrite=overwrite) as w:
        # the events first: the story needs four of their columns, the rest is freed before it runs
        ev, block_of_row = parts.events, parts.block_of_row
        # a frame per row group: the writer then writes it as it is, without concatenating pieces
        for lo in range(0, max(len(ev), 1), rows_per_group):
            hi = min(lo + rows_per_group, len(ev))
            w.add("events", events_table(_event_slice(ev, lo, hi), block_of_row[lo:hi]))
        w.flush("events")
        story_events = _story_events(ev, block_of_row)
        parts.events = parts.block_of_row = ev = block_of_row = None
        _release_arrow_pool()  # the groups' Arrow buffers, kept for reuse by the pool: the story comes next
        with snapshot_errors(path):
            tell_story(_TraceView(blocks, story_events, stacks, ops, meta, parts.final.segments,
                                  parts.final.segment_blocks), parts.stack_codes)
        del story_events
        w.metadata = dict(meta)  # with the phases and model calls the story added
        _add_in_groups(w, "blocks", blocks, rows_per_group)
        del blocks
        _add_in_groups(w, "ops", ops, rows_per_group)
        _add_in_groups(w, "segments", parts.final.segments, rows_per_group)
        _add_in_groups(w, "segment_blocks", parts.final.segment_blocks, rows_per_group)
        _add_in_groups(w, "stacks", stacks, rows_per_group)
    return Path(dst)
