"""Save a finished recording straight to a ``NAME.memlens/`` directory, the accesses a window of ops at a time.

`memlens.record(save_to=PATH)` and ``memlens record -o OUT`` save this way. The accesses table is the one
that grows with the length of a recording (one row per (op, block) touched: 10^8-10^9 rows in a long run),
so it is never held whole: the compiled recorder's windowed drain (native/drain.h ``drain_windowed`` /
``next_accesses``) decodes the accesses of a window of ops at a time (at most `OPS_PER_WINDOW` ops and
`RECORDS_PER_WINDOW` records) from its coded streams (memory and spill files), each window becomes its
rows (`build.accesses_of_ops`, the same code as the in-memory path) and is written as one Parquet row
group. What the blocks table needs from the accesses (each block's first access, and its first access by
another op than the one that made it) is kept per block as the windows pass (`FirstAccesses`, 32 bytes per
block), then the blocks are finished exactly as `assemble.assemble_trace` finishes them.

Memory at save (measured as a child's VmHWM growth, tests/test_record_streamsave.py and the notes):
- accesses: one window (at most `RECORDS_PER_WINDOW` records past its first op: ~25 bytes per row in the
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

import numpy as np

from memlens.recording.assemble import FRAME_DTYPES, assemble_trace, finish_tables, trace_of_columns
from memlens.recording.build import accesses_of_ops, build_blocks, build_ops
from memlens.recording.columns import Columns
from memlens.recording.instruments import AllocatorData
from memlens.recording.session import Session
from memlens.trace.tracedir import save_tables

OPS_PER_WINDOW = 1 << 17        # most ops in one window (each window's accesses are one Parquet row group)
RECORDS_PER_WINDOW = 1 << 18    # most access records in one window past its first op (~25 MB at its peak)
TABLE_ROWS_PER_GROUP = 1 << 16  # blocks/ops rows converted to Arrow at once (their object columns are costly)
_NONE = np.iinfo(np.int64).max


class FirstAccesses:
    """Per block, as windows of accesses pass: the first access (lowest (t_ns, op_id)) and the first
    access by another op than `alloc_op` (the op that made the block, -1: none). 32 bytes per block.

    `frame()` gives those rows as an accesses table: `build.refine_autograd_seeds` and `join._first_seen`,
    given it instead of every access, answer the same (they read exactly these two facts)."""

    def __init__(self, alloc_op: np.ndarray):
        n = len(alloc_op)
        self.alloc_op = np.asarray(alloc_op, dtype=np.int64)
        self.any_t, self.any_op = np.full(n, _NONE), np.full(n, _NONE)
        self.other_t, self.other_op = np.full(n, _NONE), np.full(n, _NONE)

    def add(self, accesses: Columns) -> None:
        """Take in one window's accesses (any order)."""
        block = np.asarray(accesses["block_id"], dtype=np.int64)
        t = np.asarray(accesses["t_ns"], dtype=np.int64)
        op = np.asarray(accesses["op_id"], dtype=np.int64)
        self._lower(self.any_t, self.any_op, block, t, op)
        other = op != self.alloc_op[block]
        self._lower(self.other_t, self.other_op, block[other], t[other], op[other])

    @staticmethod
    def _lower(best_t, best_op, block, t, op) -> None:
        if len(block) == 0:
            return
        order = np.lexsort((op, t, block))
        block, t, op = block[order], t[order], op[order]
        first = np.ones(len(block), dtype=bool)
        first[1:] = block[1:] != block[:-1]
        block, t, op = block[first], t[first], op[first]
        lower = (t < best_t[block]) | ((t == best_t[block]) & (op < best_op[block]))
        best_t[block[lower]] = t[lower]
        best_op[block[lower]] = op[lower]

    def frame(self) -> Columns:
        """The rows kept, as an accesses table (is_write is not kept: False)."""
        parts = []
        for best_t, best_op in ((self.any_t, self.any_op), (self.other_t, self.other_op)):
            rows = np.flatnonzero(best_t != _NONE)
            parts.append(Columns(len(rows), {"block_id": rows.astype(np.int64), "t_ns": best_t[rows],
                                             "op_id": best_op[rows], "is_write": np.zeros(len(rows), dtype=bool)}))
        return Columns.concat(parts)


def save_recording(session: Session, allocator: AllocatorData, path, *, settings: dict, clock: tuple[int, int],
                   exception: str | None = None, overwrite: bool = False, extra_metadata: dict | None = None,
                   ops_per_window: int | None = None, records_per_window: int | None = None) -> tuple[Path, dict]:
    """Save a stopped session's trace to `path` (atomically, as `Trace.save`), its accesses written a window
    of at most `ops_per_window` ops and `records_per_window` access records (defaults `OPS_PER_WINDOW`,
    `RECORDS_PER_WINDOW`) at a time; returns (path, the summary `Trace.summary` would give).

    The saved tables are those of `assemble_trace(...)` saved with `Trace.save`. `extra_metadata`: keys set
    in the metadata (its "notes" are appended). May be called again on the same session (the windows start
    over), e.g. to save elsewhere after a failed save."""
    if allocator.kernels is not None and len(allocator.kernels) > 0:
        return _save_in_memory(session, allocator, path, settings=settings, clock=clock, exception=exception,
                               overwrite=overwrite, extra_metadata=extra_metadata)
    ops_per_window = int(ops_per_window or OPS_PER_WINDOW)
    records_per_window = int(records_per_window or RECORDS_PER_WINDOW)
    ops, op_module_idx, iteration_source = build_ops(session)
    blocks = build_blocks(session, ops, op_module_idx)
    del op_module_idx
    first = FirstAccesses(blocks["alloc_op_id"].filled(-1))
    start, end = ops["start_ns"].copy(), ops["end_ns"].copy()
    # the tables are handed on, not kept here: each copy a step makes can replace the one before it
    state = {"blocks": blocks, "ops": ops}
    del blocks, ops
    counts = {"accesses": 0}

    def access_windows():
        acc_end = session.access_ends()
        for lo, hi, packed in session.access_windows(ops_per_window, records_per_window):
            window = accesses_of_ops(packed, np.diff(acc_end[lo:hi + 1]), lo, start, end)
            first.add(window)
            counts["accesses"] += len(window)
            yield window.to_frame(FRAME_DTYPES["accesses"])

    def tables():
        yield "accesses", access_windows()
        final_blocks, final_ops, metadata, extra = finish_tables(
            session, allocator, state.pop("blocks"), state.pop("ops"), first.frame(), iteration_source,
            settings=settings, clock=clock, exception=exception)
        _add_metadata(metadata, extra_metadata)
        state["trace"] = trace_of_columns(final_blocks, None, final_ops, metadata, extra)
        del final_blocks, final_ops
        for name in ("blocks", "ops") + tuple(extra):
            yield name, state["trace"].table(name)

    saved = save_tables(path, lambda: state["trace"].metadata, tables(), overwrite=overwrite,
                        rows_per_group=TABLE_ROWS_PER_GROUP)
    summary = state["trace"].summary()
    summary["accesses"] = counts["accesses"]
    summary["has_accesses"] = counts["accesses"] > 0
    return Path(saved), summary


def _save_in_memory(session, allocator, path, *, settings, clock, exception, overwrite, extra_metadata):
    session.load_all_accesses()
    trace = assemble_trace(session, allocator, settings=settings, clock=clock, exception=exception)
    trace.metadata.setdefault("notes", []).append(
        "saved from memory, not in windows: the kernel clock re-stamps every access with whole-table code")
    _add_metadata(trace.metadata, extra_metadata)
    return Path(trace.save(path, overwrite=overwrite)), trace.summary()


def _add_metadata(metadata: dict, extra: dict | None) -> None:
    for key, value in (extra or {}).items():
        if key == "notes":
            metadata.setdefault("notes", []).extend(value)
        else:
            metadata[key] = value
