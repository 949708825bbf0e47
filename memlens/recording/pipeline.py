"""From a stopped recording to its trace, in one function read top-down: drain -> join -> assemble -> write.

`build_trace` is the one way from the end of a `memlens.record()` block to its trace, kept in memory or
saved; each stage is a function of its own module, and no stage module imports another:

1. drain (`build.drain_tables`): the session's records as the ops, blocks and accesses tables, with the
   compiled recorder's memory-hook events added to the allocator's (`build.with_session_events`);
2. join (`joining.join_tables`): autograd's seeds found, then the allocator's events joined into the blocks;
3. assemble (`assemble.assemble_trace`): notes, metadata, kernel times, the optional tables and the
   DataFrames of the Trace, on the CUDA kernel clock when kernel times were recorded;
4. write (`streamsave.write_windowed`, `streamsave.write_in_memory`): the ``NAME.memlens/`` directory.

Saved windowed (the usual save: no kernel clock), the accesses are drained a window of ops at a time as
they are written, so join and assemble run when the last window has passed (they read each block's first
accesses, kept as the windows pass); the stages keep their order.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memlens.recording.assemble import assemble_trace
from memlens.recording.build import drain_tables, drain_windowed, with_session_events
from memlens.recording.instruments import AllocatorData
from memlens.recording.joining import join_tables
from memlens.recording.session import Session
from memlens.recording.streamsave import write_in_memory, write_windowed
from memlens.trace import REQUIRED_TABLES, OPTIONAL_TABLES, Trace


@dataclass
class Built:
    """What `build_trace` made: the trace in memory (None when saved windowed), or where it was saved and the
    summary `Trace.summary` gives of it."""

    trace: Trace | None = None
    path: Path | None = None
    summary: dict | None = None


def build_trace(session: Session, allocator: AllocatorData | None, *, settings: dict, clock: tuple[int, int],
                exception: str | None = None, save_to=None, overwrite: bool = False,
                extra_metadata: dict | None = None, ops_per_window: int | None = None,
                records_per_window: int | None = None) -> Built:
    """The trace of a stopped session (its times already on the recorder's own clock), kept in memory, or
    saved to `save_to` (atomically, as `Trace.save`; `overwrite` an existing trace there) with
    `extra_metadata` set in its metadata (its "notes" appended).

    `settings`: the recorder's, for the metadata. `clock`: (time.time_ns(), time.perf_counter_ns()) read
    together at the start; it places the allocator's wall-clock events on the recorder's clock. `exception`:
    what the recorded block raised, if anything. A windowed save decodes at most `ops_per_window` ops and
    `records_per_window` access records at a time (`build.OPS_PER_WINDOW`, `build.RECORDS_PER_WINDOW`). May
    be called again on the same session (e.g. to save elsewhere after a failed save: the windows start over).
    """
    allocator = with_session_events(session, allocator, clock)
    if save_to is not None and not _needs_kernel_clock(allocator):
        return _build_windowed(session, allocator, save_to, settings=settings, clock=clock, exception=exception,
                               overwrite=overwrite, extra_metadata=extra_metadata, ops_per_window=ops_per_window,
                               records_per_window=records_per_window)
    drained = drain_tables(session)                                                                  # 1. drain
    ops, accesses = drained.take("ops"), drained.take("accesses")
    blocks, notes, join_stats = join_tables(session, allocator, drained.take("blocks"), accesses, ops, clock)  # 2.
    trace = assemble_trace(session, allocator, blocks, accesses, ops, drained.iteration_source, notes,  # 3.
                           join_stats, settings=settings, clock=clock, exception=exception)
    del blocks, ops, accesses
    if save_to is None:
        return Built(trace=trace)
    path = write_in_memory(trace, save_to, overwrite=overwrite, extra_metadata=extra_metadata)         # 4. write
    return Built(path=path, summary=trace.summary())


def _build_windowed(session: Session, allocator: AllocatorData, save_to, *, settings: dict, clock: tuple[int, int],
                    exception: str | None, overwrite: bool, extra_metadata: dict | None,
                    ops_per_window: int | None, records_per_window: int | None) -> Built:
    """`build_trace` saving as it drains: the same stages, the accesses written a window at a time first."""
    drained = drain_windowed(session, ops_per_window, records_per_window)                           # 1. drain
    windows = drained.accesses
    assembled = {}

    def tables():
        yield "accesses", windows.frames()            # drained as they are written, their first accesses kept
        ops = drained.take("ops")
        blocks, notes, join_stats = join_tables(session, allocator, drained.take("blocks"),         # 2. join
                                                windows.first.frame(), ops, clock)
        assembled["trace"] = assemble_trace(session, allocator, blocks, None, ops, drained.iteration_source,  # 3.
                                            notes, join_stats, settings=settings, clock=clock, exception=exception)
        del blocks, ops
        for name in REQUIRED_TABLES + OPTIONAL_TABLES:
            if name != "accesses":
                yield name, assembled["trace"].table(name)

    path = write_windowed(save_to, tables(), lambda: assembled["trace"], overwrite=overwrite,          # 4. write
                          extra_metadata=extra_metadata)
    summary = assembled["trace"].summary()
    summary["accesses"] = windows.rows
    summary["has_accesses"] = windows.rows > 0
    return Built(path=path, summary=summary)


def _needs_kernel_clock(allocator: AllocatorData) -> bool:
    """Kernel times were recorded: the trace moves onto the kernel clock, which re-stamps every access with
    whole-table code, so it is built in memory even when saved."""
    return allocator.kernels is not None and len(allocator.kernels) > 0
