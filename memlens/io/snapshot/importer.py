"""Import CUDA memory snapshots (``torch.cuda.memory._dump_snapshot`` pickles or ``_snapshot()`` dicts).

Tables produced (see `memlens.trace` for the schema):

- ``events``: every device-trace entry in order, verbatim action, with ``seq`` (global, increasing within a
  device), ``t_ns`` (from ``time_us``, or the entry index when entries carry no ``time_us``), and extra
  columns ``block_id`` (alloc/free rows), ``device_free`` (oom rows) and ``stack_id``.
- ``blocks``: one per ``alloc`` entry, timed by the alloc and by ``free_completed`` (the moment the allocator
  can reuse the bytes). ``size`` is the entry's size; torch records the caller's requested (unrounded) bytes
  there, so ``size`` = ``requested_size``. The allocator's rounded block size is in ``block_size`` when the
  final state tells it (blocks live at the end); elsewhere an allocator replay derives it by rounding. ``free_requested_seq`` / ``free_requested_ns`` keep the request when one
  was seen. A block whose ``free_requested`` was seen but never its ``free_completed`` is still live at the end
  (``free_ns`` missing): the allocator still holds its bytes, and the final state lists it as pending free.
  Blocks freed without an alloc in the trace (ring buffer overflow, or allocated before recording) get
  ``free_without_alloc`` and ``allocated_before``. Blocks live in the final ``segments`` that the trace never
  allocated are added with ``allocated_before``, no times, ``size`` = their requested size. Blocks allocated
  before recording have ``alloc_seq`` -1 (before every event) and ``alloc_ns`` missing.
- ``segments`` / ``segment_blocks``: the allocator's final state (what an allocator replay starts from or
  ends at); ``segment_blocks.block_id`` links live blocks to ``blocks``.
- ``stacks``: deduplicated frames; ``blocks.op`` is the outermost ATen operator on the alloc stack and the
  extra column ``location`` the innermost user (non-torch) Python frame.
- ``ops``: the ``external_annotations`` START/END ranges (record_function names) when the file has them.

Snapshots record no accesses; ``metadata["notes"]`` says so and lists everything else the file could not tell.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from memlens.errors import InputError
from memlens.io.safe_pickle import loads_buffer, pickle_buffer
from memlens.io.snapshot.events import EventColumns, events_table, read_device_traces
from memlens.io.snapshot.frames import new_stack_interner, stack_hints
from memlens.io.snapshot.meta import annotation_ops, describe
from memlens.io.snapshot.pairing import ALLOC, FREE_COMPLETED, FREE_REQUESTED, Pairing, pair_blocks
from memlens.io.snapshot.segments import LIVE_STATES, FinalState, read_segments
from memlens.io.snapshot.story import tell_story
from memlens.io.bounded_text import PlaceholderSeen
from memlens.io.snapshot.limits import check_shared, check_streamed
from memlens.io.snapshot.stream import EntryColumns, stream_snapshot

SOURCE = "cuda_snapshot"
_KIND = {"alloc": ALLOC, "free_requested": FREE_REQUESTED, "free_completed": FREE_COMPLETED}
_DEVICE_BITS = 52  # (device, addr) -> one int64 key; CUDA virtual addresses stay below 2**49


def import_snapshot(path):
    """Read a CUDA memory snapshot pickle (plain or gzip) safely and return a `memlens.Trace`.

    The streaming reader (`memlens.io.snapshot.stream`) keeps memory near the file size; files it does
    not handle go through the restricted C unpickler."""
    try:
        with pickle_buffer(path) as buf:
            snapshot, interner = _read(buf, path)
    except InputError as exc:
        raise InputError(exc.message, path) from None
    return snapshot_to_trace(snapshot, source=str(path), path=path, interner=interner)


def _read(buf, path):
    """(snapshot object, its stack interner) from pickle bytes: streamed, or by the restricted unpickler."""
    interner = new_stack_interner()
    snapshot = stream_snapshot(buf, interner, drop_read_pages=True)  # pickle_buffer maps files read-only
    if snapshot is not None:
        try:
            check_streamed(snapshot, path, columns_type=EntryColumns)
        except PlaceholderSeen:  # a stand-in of the walker where content is needed: read it in full
            snapshot = None
    if snapshot is None:
        interner = new_stack_interner()
        snapshot = loads_buffer(buf, path)
    check_shared(snapshot, path)
    return snapshot, interner


def snapshot_to_trace(snapshot, source: str = "<in-memory snapshot>", path=None, interner=None):
    """Convert a snapshot object (the dict ``torch.cuda.memory._snapshot()`` returns, or an old-style list
    of segments) into a `memlens.Trace`. `source` names it in metadata and error messages."""
    where = path if path is not None else source
    segments, device_traces, extras = _normalize(snapshot, where)
    with snapshot_errors(where):
        return _convert(segments, device_traces, extras, source, interner or new_stack_interner())


@contextlib.contextmanager
def snapshot_errors(where):
    """Errors while converting a snapshot's content as one-line `InputError`s naming `where`."""
    try:
        yield
    except InputError as exc:
        raise InputError(f"malformed CUDA memory snapshot: {exc.message}", where) from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, IndexError) as exc:
        # chained, so that `memlens --debug` shows where the file stopped making sense
        raise InputError(f"malformed CUDA memory snapshot ({type(exc).__name__}: {str(exc)[:160]})",
                         where) from exc


def _normalize(snapshot, where) -> tuple[list, list, dict]:
    """(segments, device_traces, other top-level keys) of any era, or `InputError`."""
    if isinstance(snapshot, list):  # torch < 2.0 memory_snapshot(): just the segments
        if all(isinstance(s, dict) and "blocks" in s for s in snapshot):
            return snapshot, [], {}
        raise InputError("pickle holds a list that is not a list of allocator segments", where)
    if not isinstance(snapshot, dict):
        raise InputError(f"pickle holds a {type(snapshot).__name__}, not a CUDA memory snapshot dict", where)
    if "segments" not in snapshot and "device_traces" not in snapshot:
        keys = ", ".join(sorted(map(str, snapshot))[:6])
        raise InputError(f"dict has no 'segments' or 'device_traces' (keys: {keys}); not a CUDA memory "
                         "snapshot", where)
    segments = snapshot.get("segments") or []
    traces = snapshot.get("device_traces") or []
    if not isinstance(segments, list) or not isinstance(traces, list):
        raise InputError("'segments' and 'device_traces' must be lists", where)
    extras = {k: v for k, v in snapshot.items() if k not in ("segments", "device_traces")}
    return segments, traces, extras


def _nullable(values: np.ndarray, rows: np.ndarray) -> pd.arrays.IntegerArray:
    """values[rows] as Int64, NA where rows < 0."""
    missing = rows < 0
    return pd.arrays.IntegerArray(values[np.where(missing, 0, rows)].astype(np.int64), missing)


def _key(device_code: np.ndarray, addr: np.ndarray) -> np.ndarray:
    return (device_code.astype(np.int64) << _DEVICE_BITS) + addr.astype(np.int64)


def _lookup(table: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Position in `table` of each query (the first one when `table` repeats a key), or -1."""
    uniq, first = np.unique(table, return_index=True)
    pos = np.searchsorted(uniq, queries).clip(0, max(len(uniq) - 1, 0))
    found = (uniq[pos] == queries) if len(uniq) else np.zeros(len(queries), dtype=bool)
    return np.where(found, first[pos] if len(uniq) else -1, -1)


def _trace_blocks(ev: EventColumns, pairing: Pairing) -> pd.DataFrame:
    """Blocks seen in the device traces (see module docstring for the rules)."""
    has_alloc = pairing.alloc_row >= 0
    alloc_stack = np.where(has_alloc, ev.stack_id[pairing.alloc_row.clip(0)], -1) if len(pairing) \
        else np.empty(0, dtype=np.int64)
    # size/stream from the alloc when seen, else from the free entry
    from_row = np.where(has_alloc, pairing.alloc_row, pairing.first_row)
    return pd.DataFrame({
        "block_id": np.arange(len(pairing), dtype=np.int64),
        "device_code": ev.device_code[pairing.first_row],
        "addr": ev.addr[pairing.first_row],
        "size": ev.size[from_row], "stream": ev.stream[from_row],
        "alloc_ns": _nullable(ev.t_ns, pairing.alloc_row),
        "alloc_seq": pd.array(np.where(has_alloc, ev.seq[pairing.alloc_row.clip(0)], -1)
                              if len(pairing) else [], dtype="Int64"),
        "free_ns": _nullable(ev.t_ns, pairing.completed_row),
        "free_seq": _nullable(ev.seq, pairing.completed_row),
        "free_requested_ns": _nullable(ev.t_ns, pairing.requested_row),
        "free_requested_seq": _nullable(ev.seq, pairing.requested_row),
        "stack_id": pd.arrays.IntegerArray(alloc_stack.clip(0), alloc_stack < 0),
        "allocated_before": ~has_alloc, "free_without_alloc": ~has_alloc,
    })


def _match_final_state(blocks: pd.DataFrame, final: FinalState, dev_index: dict[str, int]):
    """Link blocks live at the end of the trace with the final state's live blocks; add the live blocks
    the trace never allocated (allocated before recording). Returns (blocks, facts for notes)."""
    sb = final.segment_blocks
    live = sb["state"].isin(LIVE_STATES).to_numpy()
    for dev in sb["device"].unique():
        dev_index.setdefault(dev, len(dev_index))
    sb_codes = sb["device"].map(dev_index).to_numpy(dtype=np.int64)
    sb_key = _key(sb_codes, sb["addr"].to_numpy())
    open_mask = blocks["free_ns"].isna().to_numpy()
    blk_key = _key(blocks["device_code"].to_numpy(), blocks["addr"].to_numpy())
    live_keys = sb_key[live]
    open_keys = blk_key[open_mask]

    # blocks the trace leaves live must be live in the final state (when the file has one)
    facts = {"has_final_state": len(sb) > 0,
             "open_not_live": int((~np.isin(open_keys, live_keys)).sum()) if len(sb) else 0}
    # torch records the requested (unrounded) size in trace entries; the final state adds the
    # allocator's rounded block size for the blocks live at the end
    live_idx = np.flatnonzero(live)
    pos = _lookup(live_keys, blk_key)  # -1 when not live at the end
    is_open_live = open_mask & (pos >= 0)
    matched_sb = live_idx[pos[is_open_live]]
    block_size = np.zeros(len(blocks), dtype=np.int64)
    block_size[is_open_live] = sb["size"].to_numpy()[matched_sb]
    blocks["block_size"] = pd.arrays.IntegerArray(block_size, ~is_open_live)
    blocks["requested_size"] = blocks["size"].astype("Int64")
    facts["size_mismatch"] = int((sb["requested_size"].to_numpy()[matched_sb]
                                  != blocks["size"].to_numpy()[is_open_live]).sum())

    block_id_of_sb = np.full(len(sb), -1, dtype=np.int64)
    block_id_of_sb[matched_sb] = blocks["block_id"].to_numpy()[is_open_live]
    before = live & ~np.isin(sb_key, open_keys)
    new_ids = np.arange(len(blocks), len(blocks) + int(before.sum()), dtype=np.int64)
    block_id_of_sb[before] = new_ids
    added = pd.DataFrame({
        "block_id": new_ids, "device_code": sb_codes[before], "addr": sb["addr"].to_numpy()[before],
        "size": sb["requested_size"].to_numpy()[before], "block_size": sb["size"].to_numpy()[before],
        "stream": _segment_stream(final, sb, dev_index)[before],
        "stack_id": sb["stack_id"].to_numpy()[before] if before.any() else pd.array([], dtype="Int64"),
        "requested_size": sb["requested_size"].to_numpy()[before],
        "allocated_before": True, "free_without_alloc": False,
    })
    facts["allocated_before_live"] = len(added)
    final.segment_blocks = sb.assign(block_id=pd.arrays.IntegerArray(block_id_of_sb.clip(0),
                                                                     block_id_of_sb < 0))
    if len(added):
        added["stack_id"] = added["stack_id"].astype("Int64")
        added["requested_size"] = added["requested_size"].astype("Int64")
        added["block_size"] = added["block_size"].astype("Int64")
        added["alloc_seq"] = pd.array(np.full(len(added), -1), dtype="Int64")
        blocks = pd.concat([blocks, added], ignore_index=True)
    return blocks, facts


def _segment_stream(final: FinalState, sb: pd.DataFrame, dev_index: dict[str, int]) -> np.ndarray:
    """Stream of each segment block's segment (blocks carry no stream of their own)."""
    seg = final.segments
    seg_key = _key(seg["device"].map(dev_index).to_numpy(dtype=np.int64), seg["addr"].to_numpy())
    idx = _lookup(seg_key, _key(sb["device"].map(dev_index).to_numpy(dtype=np.int64),
                                sb["segment_addr"].to_numpy()))
    streams = seg["stream"].to_numpy()
    return np.where(idx >= 0, streams[idx.clip(0)] if len(streams) else 0, 0).astype(np.int64)


@dataclass
class SnapshotParts:
    """A snapshot read into compact columns, before its `Trace` is built: what the in-memory import
    (`_convert`) and the row-group conversion (`memlens.io.snapshot.convert`) share, so that both give the
    same tables. `events` holds one row per device-trace entry as numpy columns (~80 bytes per entry, no
    Python object per row but the shared action strings); the other tables are DataFrames as
    `Trace.from_tables` takes them."""

    events: EventColumns
    block_of_row: np.ndarray  # int64 per event row: its block id, -1 for entries that are not block events
    blocks: pd.DataFrame
    final: FinalState
    stacks: pd.DataFrame
    stack_codes: object       # `memlens.io.snapshot.frames.StackCodes` of `stacks`
    ops: pd.DataFrame | None
    metadata: dict


def snapshot_parts(segments: list, device_traces: list, extras: dict, source: str, interner,
                   release: bool = False) -> SnapshotParts:
    """Everything but the `Trace`: events, blocks (with op / location hints, category not yet told), the
    final allocator state, stacks, annotation ops and metadata. Raises what `_convert` raises.
    `release`: the streaming reader's entry columns in `device_traces` are dropped once read (see
    `read_device_traces`)."""
    ev = read_device_traces(device_traces, interner, release=release)
    # ALLOC / FREE_REQUESTED / FREE_COMPLETED codes (0, 1, 2) by a vectorised hash lookup; -1 otherwise
    kind = pd.Index(list(_KIND)).get_indexer(ev.action).astype(np.int64)
    pairing = pair_blocks(ev.device_code, kind, ev.addr, ev.seq)
    blocks = _trace_blocks(ev, pairing)
    final = read_segments(segments, interner)
    interner.done_interning()  # every stack is in: free the lookups before the tables are built

    dev_index = {d: i for i, d in enumerate(ev.devices)}
    blocks, facts = _match_final_state(blocks, final, dev_index)
    facts["frame_repairs"] = {
        "stack frames with a negative, out-of-range or unreadable line (read as line 0, unknown)":
            interner.unknown_lines,
        "stack frames or frame lists that were not dicts / lists": interner.odd_frames}
    devices = [None] * len(dev_index)
    for name, i in dev_index.items():
        devices[i] = name
    blocks["device"] = np.asarray(devices, dtype=object)[blocks.pop("device_code").to_numpy(dtype=np.int64)] \
        if len(blocks) else np.empty(0, dtype=object)

    stacks, stack_codes = interner.table_and_codes()
    hints = stack_hints(stacks, stack_codes, len(interner))
    sid = blocks["stack_id"].to_numpy(dtype=np.int64, na_value=-1)
    has = sid >= 0
    for col in ("op", "location"):
        values = np.full(len(blocks), "", dtype=object)
        values[has] = hints[col].to_numpy()[sid[has]]
        blocks[col] = values
    del hints
    blocks["category"] = "unknown"
    blocks["source"] = SOURCE

    metadata = describe(ev, kind, blocks, final, facts, extras, source)
    ops = annotation_ops(extras.get("external_annotations"), ev.t0_unix_ns,
                         int(ev.t_ns.max()) if len(ev) else None)
    return SnapshotParts(ev, pairing.block_of_row, blocks, final, stacks, stack_codes, ops, metadata)


def _convert(segments: list, device_traces: list, extras: dict, source: str, interner):
    from memlens.trace import Trace

    parts = snapshot_parts(segments, device_traces, extras, source, interner)
    events = events_table(parts.events, parts.block_of_row)
    trace = Trace.from_tables(parts.blocks, ops=parts.ops, metadata=parts.metadata, events=events,
                              segments=parts.final.segments, segment_blocks=parts.final.segment_blocks,
                              stacks=parts.stacks)
    stack_codes = parts.stack_codes
    del parts, events  # the trace holds its own (conformed) copies: keep the peak down for the story
    tell_story(trace, stack_codes)  # phases, model calls and categories from the stacks and annotations
    return trace
