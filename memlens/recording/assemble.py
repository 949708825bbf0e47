"""The assemble stage of a recording's build: the Trace of its final tables (notes, metadata, kernel times,
the optional tables, the DataFrames), moved onto the CUDA kernel clock when kernel times were recorded."""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.recording.columns import FRAME_DTYPES, Columns, Nullable
from memlens.recording.instruments import AllocatorData
from memlens.recording.session import Session
from memlens.trace import SCHEMA_VERSION, Trace, conform, event_order


def torch_settings() -> dict:
    """The switches that decide how fp32 products run on a GPU, as the recorded process had them:
    ``matmul_allow_tf32`` (``torch.backends.cuda.matmul.allow_tf32``), ``cudnn_allow_tf32``
    (``torch.backends.cudnn.allow_tf32``), ``float32_matmul_precision``; read by the modeled clock."""
    import warnings

    import torch
    out = {}
    with warnings.catch_warnings():     # newer torch steers towards its fp32_precision API with a warning
        warnings.simplefilter("ignore")
        for key, read in (("matmul_allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
                          ("cudnn_allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
                          ("float32_matmul_precision", torch.get_float32_matmul_precision)):
            try:
                out[key] = read()
            except (AttributeError, RuntimeError):
                continue
    return out


def assemble_trace(session: Session, allocator: AllocatorData, blocks: Columns, accesses: Columns | None,
                   ops: Columns, iteration_source: str, notes: list, join_stats: dict, *, settings: dict,
                   clock: tuple[int, int], exception: str | None = None) -> Trace:
    """The Trace of a stopped session from its final tables (`notes` and `join_stats`: the join's).

    `accesses` None: they were written already, a window at a time (the windowed save), and the trace's
    accesses table is empty. `clock` is (time.time_ns(), time.perf_counter_ns()) read together at the start:
    it places the allocator's and the kernels' wall-clock times on the recorder's clock.
    """
    ops, metadata, extra = finish_tables(session, allocator, blocks, ops, iteration_source, notes, join_stats,
                                         settings=settings, clock=clock, exception=exception)
    trace = trace_of_columns(blocks, accesses, ops, metadata, extra)
    if "kernel_start_ns" in trace.ops.columns and trace.ops["kernel_start_ns"].notna().any():
        trace = _onto_kernel_clock(trace)
    return trace


def trace_of_columns(blocks: Columns, accesses: Columns | None, ops: Columns, metadata: dict,
                     extra: dict) -> Trace:
    """The Trace of a recording's tables, each made a DataFrame once with the schema's columns, order and
    dtypes (the tables `Trace.from_tables` would make of them, without its per-column casts: the columns
    here already have the schema's dtypes; `tests/integration/test_record_close.py` checks the two agree)."""
    blocks = blocks.copy()
    if "stack_id" not in blocks:
        blocks["stack_id"] = Nullable.absent(len(blocks))
    alloc_ns, free_ns = blocks["alloc_ns"], blocks["free_ns"]
    alloc_seq, free_seq = event_order(blocks["block_id"], alloc_ns.values, alloc_ns.missing, free_ns.values,
                                      free_ns.missing)
    blocks["alloc_seq"] = Nullable.of(alloc_seq)
    blocks["free_seq"] = Nullable.of(free_seq, free_ns.missing)
    if accesses is None:
        accesses = Columns(0, {"block_id": np.empty(0, np.int64), "t_ns": np.empty(0, np.int64),
                               "op_id": np.empty(0, np.int64), "is_write": np.empty(0, bool)})
    meta = {"schema_version": SCHEMA_VERSION, "source_kind": "unknown", "notes": []}
    meta.update(metadata)
    tables = {k: (conform(k, v) if v is not None else None) for k, v in extra.items()}
    return Trace(blocks=blocks.to_frame(FRAME_DTYPES["blocks"]), accesses=accesses.to_frame(FRAME_DTYPES["accesses"]),
                 ops=ops.to_frame(FRAME_DTYPES["ops"]), metadata=meta, **tables)


def finish_tables(session: Session, allocator: AllocatorData, blocks: Columns, ops: Columns,
                  iteration_source: str, notes: list, join_stats: dict, *, settings: dict, clock: tuple[int, int],
                  exception: str | None = None) -> tuple[Columns, dict, dict]:
    """(ops, metadata, optional tables) of a recording from its final blocks and ops: the session's notes
    after the join's, the metadata, kernel times added to the ops, the stacks and the CUDA snapshot's
    segments."""
    import torch

    sources = ["dispatch"] + list(allocator.sources)
    wall0, perf0 = clock
    if session.tensors_without_storage:
        notes.append(f"{session.tensors_without_storage} tensor arguments had no storage (sparse, nested or "
                     "wrapper subclasses) and are not in blocks/accesses")
    if session.stop_reason:
        notes.append(f"recording stopped early: {session.stop_reason}")
    if exception:
        notes.append(f"the recorded block raised {exception}; the trace covers everything up to it")
    devices = sorted(set(np.asarray(blocks["device"], dtype=object).tolist()) | set(session.devices))
    peak_tracked = _peak_tracked(session)
    buffer_bytes = event_buffer_bytes(session)
    metadata = {
        "source_kind": "memlens_record",
        "torch_version": torch.__version__,
        "torch_settings": torch_settings(),
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
            "event_buffer_bytes": int(buffer_bytes),
            "peak_event_buffer_bytes": int(max(session.peak_buffer_bytes, buffer_bytes)),
            "max_buffer_bytes": int(session.buf.max_bytes),
            "bytes_per_op": round(buffer_bytes / max(session.n_ops, 1), 1),
            # per watched storage: two dict entries, a weakref with its bound callback and a tuple
            # (~300 bytes in CPython); an upper bound, as storages first seen as inputs count from t=0
            "peak_tracked_storages": peak_tracked,
            "tracking_bytes_estimate": peak_tracked * TRACKING_BYTES_PER_STORAGE,
        },
        "join": join_stats,
        "recorder": getattr(session, "backend", "python"),
        # ns of the recorder's own time (its callbacks and hooks, in the recording thread) taken out of
        # the trace's clock: recording_ns + recorder_own_ns is the wall time the block took
        "recorder_own_ns": int(getattr(session, "own_ns", 0)),
        # the recorder's own memory at its peak (bytes): compiled = its record buffers and tables;
        # python = its event buffer + the estimated cost of the storages it watched
        "recorder_bytes": int(getattr(session, "recorder_bytes", 0)
                              or max(session.peak_buffer_bytes, buffer_bytes)
                              + peak_tracked * TRACKING_BYTES_PER_STORAGE),
    }
    if getattr(session, "recorder_parts", None):   # compiled: bytes held per record stream, and counts
        metadata["recorder_buffers"] = {k: int(v) for k, v in session.recorder_parts.items()}
    if getattr(session, "spilled_bytes", 0):
        metadata["recorder_spilled_bytes"] = int(session.spilled_bytes)
    if allocator.kernels is not None and len(allocator.kernels) > 0:
        ops = _with_kernel_times(ops, allocator.kernels, session.unix_to_trace_ns(clock))
    extra = {}
    if session.stack_table is not None:
        extra["stacks"] = session.stack_table.to_frame()
    if allocator.snapshot is not None:
        from memlens.recording.cuda import snapshot_segments
        extra.update(snapshot_segments(allocator.snapshot))
    # without markers or optimizer steps the ops keep no iteration number: the analyses detect iterations
    # from the repeating allocation pattern when asked (memlens.analysis.iterations), so that recording
    # never depends on an analysis
    return ops, metadata, extra


def event_buffer_bytes(session: Session) -> int:
    """Bytes of the session's int64 event streams, counting the accesses a windowed drain left in the
    compiled recorder (8 bytes each, as the buffer would hold them), so both saves write the same number."""
    return int(session.buf.nbytes + 8 * getattr(session, "accesses_not_in_buffer", 0))


def _onto_kernel_clock(trace: Trace) -> Trace:
    """Recorded on CUDA with kernel activity: op times become the GPU's (each op spans its kernels), so
    every interval is on the device clock; the host interval of each op stays in recorded_start_ns /
    recorded_end_ns. A failure keeps the host clock and says so in the notes."""
    import torch

    from memlens.clock import onto_kernel_clock
    try:
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        return onto_kernel_clock(trace, gpu=name)
    except Exception as exc:  # the host-clock trace is still a complete recording
        trace.metadata["notes"].append(f"could not move the trace onto the CUDA kernel clock "
                                       f"({type(exc).__name__}: {exc}); times are host times")
        return trace


TRACKING_BYTES_PER_STORAGE = 300


def _peak_tracked(session: Session) -> int:
    """Most storages the recorder watched at once (each costs it a weakref and two dict entries)."""
    import numpy as np

    blocks = session.buf.blocks.to_numpy()
    if len(blocks) == 0:
        return 0
    frees = session.buf.frees.to_numpy()
    seen = np.where(blocks[:, 4] >= 0, blocks[:, 4], session.t_start)
    t = np.concatenate([seen, frees[:, 1]])
    delta = np.concatenate([np.ones(len(seen), np.int64), -np.ones(len(frees), np.int64)])
    order = np.lexsort((delta, t))            # a free before a watch at the same instant
    return int(np.cumsum(delta[order]).max())


def _with_kernel_times(ops: Columns, kernels: pd.DataFrame, to_trace_ns: int) -> Columns:
    """Add kernel_start_ns / kernel_end_ns / kernels / kernel_busy_ns (the GPU activity each op launched,
    trace ns) to the ops table."""
    from memlens.recording.cuda import kernel_times_per_op
    ops = ops.to_frame(FRAME_DTYPES["ops"])
    k = pd.DataFrame({"launch_ns": kernels["launch_unix_ns"] + to_trace_ns,
                      "start_ns": kernels["start_unix_ns"] + to_trace_ns,
                      "end_ns": kernels["end_unix_ns"] + to_trace_ns})
    for col in ("name", "category"):
        if col in kernels.columns:
            k[col] = kernels[col].to_numpy()
    per_op = kernel_times_per_op(k, ops)
    out = ops.merge(per_op, on="op_id", how="left")
    for col in ("kernel_start_ns", "kernel_end_ns", "kernels", "kernel_busy_ns"):
        out[col] = out[col].astype("Int64")
    return Columns.from_frame(out)
