"""Assemble the final Trace of a recording: dispatch-mode tables, joined allocator events, metadata."""
from __future__ import annotations

import pandas as pd

from memlens.record.build import build_accesses, build_blocks, build_ops
from memlens.record.instruments import AllocatorData
from memlens.record.session import Session
from memlens.trace import Trace


def assemble_trace(session: Session, allocator: AllocatorData, *, settings: dict, clock: tuple[int, int],
                   exception: str | None = None) -> Trace:
    """Build the Trace of a finished session.

    `clock` is (time.time_ns(), time.perf_counter_ns()) read together at the start: it places the
    allocator's wall-clock events on the recorder's clock.
    """
    import torch

    from memlens.record.join import join_allocator

    ops, op_module_idx, iteration_source = build_ops(session)
    accesses = build_accesses(session, ops)
    blocks = build_blocks(session, ops, op_module_idx)
    notes = list(allocator.notes)
    sources = ["dispatch"] + list(allocator.sources)
    stats = {}
    wall0, perf0 = clock
    to_trace_ns = perf0 - wall0 - session.t_start     # add to a unix ns time to get trace ns
    blocks, stats = join_allocator(blocks, accesses, ops, allocator, to_trace_ns, notes)
    if session.stop_reason:
        notes.append(f"recording stopped early: {session.stop_reason}")
    if exception:
        notes.append(f"the recorded block raised {exception}; the trace covers everything up to it")
    devices = sorted(set(blocks["device"].unique().tolist()) | set(session.devices))
    metadata = {
        "source_kind": "memlens_record",
        "torch_version": torch.__version__,
        "devices": devices,
        "settings": settings,
        "sources": sources,
        "t0_unix_ns": int(wall0 + (session.t_start - perf0)),
        "recording_ns": int(session.t_stop - session.t_start),
        "iteration_source": iteration_source,
        "stop_reason": session.stop_reason,
        "exception": exception,
        "notes": notes,
        "recorder_overhead": {
            "event_buffer_bytes": int(session.buf.nbytes),
            "peak_event_buffer_bytes": int(max(session.peak_buffer_bytes, session.buf.nbytes)),
            "max_buffer_bytes": int(session.buf.max_bytes),
            "bytes_per_op": round(session.buf.nbytes / max(session.n_ops, 1), 1),
        },
        "join": stats,
    }
    extra = {}
    if session.stack_table is not None:
        extra["stacks"] = session.stack_table.to_frame()
    if allocator.snapshot is not None:
        from memlens.record.cuda import snapshot_segments
        extra.update(snapshot_segments(allocator.snapshot))
    trace = Trace.from_tables(blocks, accesses, ops, metadata=metadata, **extra)
    return trace
