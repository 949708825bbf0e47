"""Import ``torch.profiler`` memory-timeline exports (``prof.export_memory_timeline``; deprecated in 2.13).

Two shapes exist:

- raw (``.raw.json.gz``): rows ``[t, action, bytes, category]``. ``action``: 1 PREEXISTING (t = -1, live
  before profiling), 2 CREATE, 3 INCREMENT_VERSION (written as two rows: -bytes in the old version's
  category, +bytes in the new one's), 4 DESTROY (-bytes). ``category`` indexes PARAMETER, OPTIMIZER_STATE,
  INPUT, TEMPORARY, ACTIVATION, GRADIENT, AUTOGRAD_DETAIL, then 7 = unknown. ``t`` is ns in older torch
  and us in newer; values above 1e17 can only be ns since the epoch, so that decides.
- coalesced (``.json``): ``[times_us, sizes]`` with ``sizes[i]`` the bytes per category at ``times_us[i]``.

Rows carry no tensor id, so blocks are paired by (category, size), LIFO: a decrease ends the most recent
live block of that category and size. The per-category live curve is exact; block identities are guesses
(the ``pairing`` column and a note say so). A version increment ends one block and starts another in the
new category. The coalesced form has only curves: each rise becomes a block and each fall ends the most
recent blocks of that category (splitting one when the fall is smaller), again exact as curves.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.errors import InputError
from memlens.io.jsonfile import load_json
from memlens.io.size_pairing import pair_by_size_lifo

SOURCE = "memory_timeline"
CATEGORY_ORDER = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient",
                  "autograd_detail", "unknown")
PREEXISTING, CREATE, INCREMENT_VERSION, DESTROY = 1, 2, 3, 4
# the export does not say which device it describes (export_memory_timeline(device="cpu") and "cuda:0" write
# the same rows): naming it cuda:0 made a CPU profile look like a GPU one; pass `device` when you know it
DEVICE = "unknown"


def import_memory_timeline(path, device: str | None = None):
    """Read a memory-timeline export (raw rows or coalesced curves, plain or gzip) as a `memlens.Trace`.
    `device` names the device it was exported for ("cpu", "cuda:0"); the file does not say, so it is
    "unknown" by default."""
    return memory_timeline_to_trace(load_json(path, "memory-timeline export"), source=str(path), path=path,
                                    device=device)


def memory_timeline_to_trace(obj, source: str = "<in-memory timeline>", path=None, device: str | None = None):
    """Convert parsed export content into a `memlens.Trace` (see `import_memory_timeline` for `device`)."""
    where = path if path is not None else source
    trace = _to_trace(obj, source, where)
    if device:
        trace.blocks["device"] = str(device)
        if trace.events is not None:
            trace.events["device"] = str(device)
        trace.metadata["devices"] = [str(device)]
    return trace


def _to_trace(obj, source: str, where):
    if not isinstance(obj, list) or not obj:
        raise InputError("not a memory-timeline export (expected a non-empty JSON list)", where)
    # coalesced: [times, sizes] where each sizes[i] is itself a list (bytes per category); a raw export
    # of exactly two rows is also a 2-element list of lists, but its second row holds scalars
    if len(obj) == 2 and all(isinstance(x, list) for x in obj) and obj[0] and not isinstance(obj[0][0], list) \
            and obj[1] and isinstance(obj[1][0], list):
        return _coalesced(obj[0], obj[1], source, where)
    try:
        rows = np.array(obj, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise InputError("memory-timeline rows must be [t, action, bytes, category] integers", where) from None
    if rows.ndim != 2 or rows.shape[1] != 4:
        raise InputError(f"memory-timeline rows must have 4 fields, found shape {rows.shape}", where)
    return _raw(rows, source, where)


def _category_names(codes: np.ndarray, where) -> np.ndarray:
    if ((codes < 0) | (codes >= len(CATEGORY_ORDER))).any():
        raise InputError(f"unknown category index {int(codes[(codes < 0) | (codes >= 8)][0])}", where)
    return np.asarray(CATEGORY_ORDER, dtype=object)[codes]


def _raw(rows: np.ndarray, source: str, where):
    from memlens.trace import Trace

    t, action, nbytes, category = rows.T
    if not np.isin(action, (PREEXISTING, CREATE, INCREMENT_VERSION, DESTROY)).all():
        raise InputError(f"unknown action code {int(action[~np.isin(action, (1, 2, 3, 4))][0])}", where)
    # the sign of the bytes is the action's: a CREATE that frees or a DESTROY that allocates would pair
    # into blocks with wrong sizes and lifetimes
    wrong = ((action == CREATE) | (action == PREEXISTING)) & (nbytes < 0) | (action == DESTROY) & (nbytes > 0)
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        raise InputError(f"memory-timeline row {i} has action {int(action[i])} with {int(nbytes[i])} bytes "
                         "(CREATE and PREEXISTING add bytes, DESTROY removes them)", where)
    if ((t != -1) & (t < 0)).any():
        raise InputError("memory-timeline row has a negative time (only PREEXISTING rows use -1)", where)
    timed = t != -1
    t0 = int(t[timed].min()) if timed.any() else 0
    t_ns = np.where(timed, t - t0, 0)
    keep = np.flatnonzero(nbytes != 0)
    pairing = pair_by_size_lifo(category[keep], np.abs(nbytes[keep]), nbytes[keep] > 0)
    def to_file_rows(rows: np.ndarray) -> np.ndarray:  # rows of `keep` -> rows of the file
        return np.where(rows >= 0, keep[rows.clip(0)], -1)
    first, alloc_row, done = (to_file_rows(r) for r in (pairing.first_row, pairing.alloc_row,
                                                        pairing.completed_row))
    before = (alloc_row < 0) | (action[alloc_row.clip(0)] == PREEXISTING)
    seq = np.arange(len(rows), dtype=np.int64)

    def nullable(values, r):
        return pd.arrays.IntegerArray(values[r.clip(0)].astype(np.int64), r < 0)

    alloc_known = np.where(before, -1, alloc_row)
    blocks = pd.DataFrame({
        "block_id": np.arange(len(first), dtype=np.int64), "device": DEVICE, "size": np.abs(nbytes[first]),
        "alloc_ns": nullable(t_ns, alloc_known),
        "alloc_seq": pd.array(np.where(before, -1, seq[alloc_row.clip(0)]), dtype="Int64"),
        "free_ns": nullable(t_ns, done), "free_seq": nullable(seq, done),
        "category": _category_names(category[first], where),
        "allocated_before": before, "free_without_alloc": alloc_row < 0,
        "source": SOURCE, "pairing": "size_lifo",
        "alloc_action": np.where(alloc_row >= 0, action[alloc_row.clip(0)], 0),
    })
    block_of_row = np.full(len(rows), -1, dtype=np.int64)
    block_of_row[keep] = pairing.block_of_row
    names = {PREEXISTING: "preexisting", CREATE: "create", INCREMENT_VERSION: "increment_version",
             DESTROY: "destroy"}
    events = pd.DataFrame({
        "seq": seq, "t_ns": t_ns, "device": DEVICE, "action": pd.Series(action).map(names).to_numpy(),
        "addr": pd.array([pd.NA] * len(rows), dtype="Int64"), "size": np.abs(nbytes), "stream": 0,
        "bytes_delta": nbytes, "category": _category_names(category, where),
        "block_id": pd.arrays.IntegerArray(block_of_row.clip(0), block_of_row < 0),
    })
    notes = _common_notes() + [
        "Rows carry no tensor id: blocks were paired by (category, size), a decrease ending the most recent "
        "live block of its category and size. Per-category live bytes are exact; which block ended, and so "
        "per-block lifetimes, are guesses. A version increment ends one block and starts one in the new "
        "category."]
    n_before = int(blocks["allocated_before"].sum())
    if n_before:
        notes.append(f"{n_before} blocks existed before profiling began (PREEXISTING or freed without a "
                     "create): their alloc time is unknown.")
    meta = {"source_kind": SOURCE, "source_path": source, "format_era": "raw rows [t, action, bytes, category]",
            "clock": "ns", "notes": notes, "rows": int(len(rows))}
    if timed.any():
        meta["t0_unix_ns"] = t0
    return Trace.from_tables(blocks, metadata=meta, events=events)


def _common_notes() -> list[str]:
    return ["A memory-timeline export holds category totals over time: no accesses, addresses, ops or "
            "stacks. It does not name its device either (the same rows are written for cpu and cuda): memlens calls it "
            "'unknown' unless told (memlens.io.memory_timeline.import_memory_timeline(path, device=...))."]


def _coalesced(times, sizes, source: str, where):
    """[times_us, sizes per category] curves -> blocks whose per-category live bytes equal the curves."""
    from memlens.trace import Trace

    try:
        t = np.asarray(times, dtype=np.int64)
        s = np.asarray(sizes, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise InputError("coalesced memory timeline must be [times, sizes] of integers", where) from None
    if s.ndim != 2 or len(s) != len(t) or s.shape[1] not in (len(CATEGORY_ORDER), len(CATEGORY_ORDER) + 1):
        raise InputError("coalesced memory timeline: sizes must be one row of per-category bytes per time", where)
    if s.shape[1] == len(CATEGORY_ORDER) + 1:  # torch's leading zero column
        s = s[:, 1:]
    if (s < 0).any():  # a curve of live bytes never goes below zero; its falls would end blocks never made
        i, cat = (int(v[0]) for v in np.nonzero(s < 0))
        raise InputError(f"coalesced memory timeline: row {i} holds {int(s[i, cat])} bytes of "
                         f"{CATEGORY_ORDER[cat]} (live bytes cannot be negative)", where)
    t_ns = (t - t.min()) * 1000
    rows = []  # (category, size, alloc_ns, free_ns) with None = open
    for cat in range(len(CATEGORY_ORDER)):
        stack: list[list] = []  # [size, alloc_ns]; the curve is sequential, LIFO by nature
        level = np.diff(np.concatenate([[0], s[:, cat]]))
        for i in np.flatnonzero(level):
            delta = int(level[i])
            if delta > 0:
                stack.append([delta, int(t_ns[i]) if i else None])
                continue
            need = -delta
            while need and stack:
                size, start = stack[-1]
                if size <= need:
                    stack.pop()
                    rows.append((cat, size, start, int(t_ns[i])))
                    need -= size
                else:  # the fall ends part of the newest piece; the rest stays live
                    stack[-1][0] = size - need
                    rows.append((cat, need, start, int(t_ns[i])))
                    need = 0
        rows.extend((cat, size, start, None) for size, start in stack)
    df = pd.DataFrame(rows, columns=["cat", "size", "alloc_ns", "free_ns"])
    blocks = pd.DataFrame({
        "block_id": np.arange(len(df), dtype=np.int64), "device": DEVICE, "size": df["size"].astype(np.int64),
        "alloc_ns": df["alloc_ns"].astype("Int64"), "free_ns": df["free_ns"].astype("Int64"),
        "category": np.asarray(CATEGORY_ORDER, dtype=object)[df["cat"].to_numpy(dtype=np.int64)],
        "allocated_before": df["alloc_ns"].isna(), "source": SOURCE, "pairing": "curve",
    })
    notes = _common_notes() + [
        "This coalesced export holds only per-category curves: blocks are pieces of those curves (a fall "
        "ends the most recent pieces of its category), exact as curves but not real allocations."]
    meta = {"source_kind": SOURCE, "source_path": source, "format_era": "coalesced [times, sizes]",
            "clock": "us", "notes": notes, "t0_unix_ns": int(t.min()) * 1000}
    return Trace.from_tables(blocks, metadata=meta)
