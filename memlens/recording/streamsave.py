"""The write stage of a recording's build: a finished recording saved to a ``NAME.memlens/`` directory, the
accesses a window of ops at a time (`write_windowed`), or from memory (`write_in_memory`).

`memlens.record(save_to=PATH)` and ``memlens record -o OUT`` save this way. The accesses table is the one
that grows with the length of a recording (one row per (op, block) touched: 10^8-10^9 rows in a long run),
so it is never held whole: the compiled recorder's windowed drain (native/drain.h ``drain_windowed`` /
``next_accesses``) decodes the accesses of a window of ops at a time (at most `build.OPS_PER_WINDOW` ops and
`build.RECORDS_PER_WINDOW` records) from its coded streams (memory and spill files), each window becomes its
rows (`build.AccessWindows`, the same code as the in-memory path) and is written as one Parquet row
group. What the blocks table needs from the accesses (each block's first access, and its first access by
another op than the one that made it) is kept per block as the windows pass (`build.FirstAccesses`, 32 bytes per
block), then the blocks are finished exactly as in memory (`memlens.recording.pipeline.build_trace`).

Memory at save (measured as a child's VmHWM growth, tests/integration/test_record_streamsave.py and the notes):
- accesses: one window (at most `build.RECORDS_PER_WINDOW` records past its first op: ~25 bytes per row in the
  DataFrame, 25-60 MB at the window's peak with the sort and the Arrow conversion), a 64 KiB read buffer per
  recording thread, 8 bytes per op in the C++ window index and 32 bytes per block (`FirstAccesses`). The
  in-memory path holds every access as an int64 record, then the table and its sort (~80 bytes per access
  at its peak). A loop of 200 accesses per op: +22 MB at save from 300k to 2.4M accesses (in memory +185 MB).
- ops and blocks: whole. Backward ops take the module of any earlier forward op, blocks take their op's
  name, phase, module and stack, and the allocator join matches blocks against op intervals and all
  allocator events (merge_asof per device and address), all on whole DataFrames; the drain decodes the op
  and block records with numpy, and `Trace.from_tables` conforms copies. On a training loop (~0.8 blocks
  and ~1.4 accesses per op) that is ~1.3 KB per op at the peak, and it dominates: 250 -> 2000 MLP steps
  (32k -> 260k ops) grow the save's peak by 289 MB streamed, 320 MB in memory.

The Python recorder keeps its accesses in memory while it records; saving it this way writes the same
trace in row groups but bounds nothing. CUDA recordings with kernel times are moved onto the kernel clock
(`assemble._onto_kernel_clock`), which re-stamps every access with whole-table code: those are built in
memory and then saved (the trace's notes say so).
"""
from __future__ import annotations

from pathlib import Path

from memlens.trace import Trace
from memlens.trace.tracedir import save_tables

TABLE_ROWS_PER_GROUP = 1 << 16  # blocks/ops rows converted to Arrow at once (their object columns are costly)


def write_windowed(path, tables, assembled, *, overwrite: bool = False, extra_metadata: dict | None = None) -> Path:
    """Save a recording to `path` atomically (as `Trace.save`) as its tables come: `tables` gives (name, table)
    pairs, the accesses first as an iterator of DataFrames (each written as one row group as it is drained),
    then the others (blocks and ops `TABLE_ROWS_PER_GROUP` rows at a time); `assembled()`, called once every
    table is written, is the trace they came from, whose metadata is written last with `extra_metadata` set
    in it (its "notes" are appended). Returns the final path."""
    def metadata() -> dict:
        meta = assembled().metadata
        add_metadata(meta, extra_metadata)
        return meta
    return Path(save_tables(path, metadata, tables, overwrite=overwrite, rows_per_group=TABLE_ROWS_PER_GROUP))


def write_in_memory(trace: Trace, path, *, overwrite: bool = False, extra_metadata: dict | None = None) -> Path:
    """Save a recording held whole in memory (on the kernel clock, whose whole-table re-stamp of the accesses
    rules out windows) with `Trace.save`; its notes say so. Returns the final path."""
    trace.metadata.setdefault("notes", []).append(
        "saved from memory, not in windows: the kernel clock re-stamps every access with whole-table code")
    add_metadata(trace.metadata, extra_metadata)
    return Path(trace.save(path, overwrite=overwrite))


def add_metadata(metadata: dict, extra: dict | None) -> None:
    """Set `extra`'s keys in `metadata`, its "notes" appended to the notes there."""
    for key, value in (extra or {}).items():
        if key == "notes":
            metadata.setdefault("notes", []).extend(value)
        else:
            metadata[key] = value
