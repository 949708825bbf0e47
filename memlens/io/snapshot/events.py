"""A snapshot's ``device_traces`` as columns: one row per entry, devices concatenated in order.

`seq` is global and increasing within a device (device offset + entry index). The clock is ``time_us``
(converted to ns relative to the earliest entry) when every entry has one; otherwise the entry's index
within its device's trace is the clock, and `clock` says ``"event_index"``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.errors import InputError
from memlens.io.bounded_text import safe_str, short_str
from memlens.io.snapshot.frames import NO_STACK, StackInterner
from memlens.io.snapshot.stream import MISSING, EntryColumns

# strings torch writes when a field carries nothing
_EMPTY_CONTEXT = ("", "N/A", None)


@dataclass
class EventColumns:
    """Columns of every device-trace entry, in order (numpy arrays unless noted)."""

    seq: np.ndarray
    t_ns: np.ndarray
    device_code: np.ndarray          # index into `devices`
    devices: list[str]
    action: np.ndarray               # object array of the verbatim action strings
    addr: np.ndarray
    addr_missing: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    stack_id: np.ndarray             # NO_STACK when the entry has no frames
    device_free: np.ndarray
    device_free_missing: np.ndarray
    clock: str                       # "time_us", "event_index" or "none" (no entries)
    t0_unix_ns: int | None
    clock_repairs: int               # entries whose time_us went backwards (clamped)
    extras: dict[str, list] = field(default_factory=dict)  # user_metadata / compile_context when used
    repairs: dict[str, int] = field(default_factory=dict)  # {what was missing: count}, for the notes

    def __len__(self) -> int:
        return len(self.seq)


_INT_TYPES = (int, np.integer, type(None))


def _int_column(values: list) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values with 0 for missing, missing mask) of a list of ints / None; any other value (a float,
    a string such as "512", a boolean), or an int beyond int64 (with or without None beside it), is an
    `InputError` naming it: numpy would convert those silently."""
    odd = [v for v in values if not isinstance(v, _INT_TYPES) or isinstance(v, (bool, np.bool_))][:1]
    if odd:
        raise _not_int64(odd)
    try:
        return np.array(values, dtype=np.int64).reshape(len(values)), np.zeros(len(values), dtype=bool)
    except (TypeError, ValueError, OverflowError):
        missing = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
        filled = [0 if v is None else v for v in values]
        try:
            return np.array(filled, dtype=np.int64).reshape(len(values)), missing
        except (TypeError, ValueError, OverflowError):
            raise _not_int64(filled) from None


def _not_int64(values: list) -> InputError:
    """The error for the first value of `values` that is not an int64."""
    for v in values:
        if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):
            return InputError(f"a device-trace entry holds {type(v).__name__} {short_str(v, 40)!r} "
                              "where an integer is expected")
        if not -(2**63) <= v < 2**63:
            return InputError(f"a device-trace entry holds the integer {short_str(v, 40)} beyond int64")
    return InputError("a device-trace entry holds a value that is not an int64")


def _part_from_dicts(entries: list, index: int, interner: StackInterner) -> dict:
    if any(type(e) is not dict for e in entries):
        raise InputError(f"device_traces[{index}] holds entries that are not dicts")
    part = {
        "action": np.array([e.get("action") for e in entries] or [], dtype=object),
        "addr": _int_column([e.get("addr") for e in entries]),
        "size": _int_column([e.get("size") for e in entries]),
        "stream": _int_column([e.get("stream") for e in entries])[0],
        "time": _int_column([e.get("time_us") for e in entries]),
        "device_free": _int_column([e.get("device_free") for e in entries]),
        "stack_id": interner.intern_many(e.get("frames") for e in entries),
    }
    for key in ("user_metadata", "compile_context"):
        values = [e.get(key) for e in entries]
        if any(v not in _EMPTY_CONTEXT for v in values):
            part[key] = ["" if v in _EMPTY_CONTEXT else safe_str(v, 1000) for v in values]
    return part


def _part_from_columns(cols: EntryColumns) -> dict:
    """The same columns from the streaming reader's typed arrays (no per-entry Python work)."""
    def ints(name):
        values = np.frombuffer(cols.ints[name], dtype=np.int64)
        missing = values == MISSING
        return np.where(missing, 0, values), missing

    part = {
        "action": np.asarray(cols.names["action"] + [None], dtype=object)[np.frombuffer(cols.codes["action"], np.int32)],
        "addr": ints("addr"), "size": ints("size"), "stream": ints("stream")[0], "time": ints("time_us"),
        "device_free": ints("device_free"), "stack_id": np.frombuffer(cols.stack_id, dtype=np.int64),
    }
    for key in ("user_metadata", "compile_context"):
        names = cols.names[key]
        if any(v not in _EMPTY_CONTEXT for v in names):
            text = np.asarray(["" if v in _EMPTY_CONTEXT else safe_str(v, 1000) for v in names], dtype=object)
            part[key] = text[np.frombuffer(cols.codes[key], np.int32)].tolist()
    return part


def read_device_traces(device_traces: list, interner: StackInterner, release: bool = False) -> EventColumns:
    """Columns of all entries of ``snapshot["device_traces"]`` (a list per device, device i = cuda:i).

    A device's entries may be a list of dicts or the streaming reader's `EntryColumns`. `release`: replace
    each `EntryColumns` in `device_traces` by None once read, so that its ~60 bytes per entry are freed
    before the next device's are converted (the caller gives up the list)."""
    devices, parts = [], []
    offset = 0
    for index, entries in enumerate(device_traces):
        if isinstance(entries, EntryColumns):
            part = _part_from_columns(entries)
            if release:
                device_traces[index] = entries = None
        elif isinstance(entries, list):
            part = _part_from_dicts(entries, index, interner)
        else:
            raise InputError(f"device_traces[{index}] is a {type(entries).__name__}, not a list of entries")
        n = len(part["action"])
        devices.append(f"cuda:{index}")
        part.update(device_code=np.full(n, index, dtype=np.int64), seq=np.arange(offset, offset + n, dtype=np.int64),
                    index=np.arange(n, dtype=np.int64))
        parts.append(part)
        offset += n
    if not parts:
        parts.append({"device_code": np.empty(0, np.int64), "seq": np.empty(0, np.int64),
                      "index": np.empty(0, np.int64), "action": np.empty(0, dtype=object),
                      "addr": (np.empty(0, np.int64), np.empty(0, bool)), "size": (np.empty(0, np.int64), np.empty(0, bool)),
                      "stream": np.empty(0, np.int64), "time": (np.empty(0, np.int64), np.empty(0, bool)),
                      "device_free": (np.empty(0, np.int64), np.empty(0, bool)),
                      "stack_id": np.empty(0, np.int64)})

    # one device (the usual case): its arrays as they are, not a copy of each
    def cat(key):
        return parts[0][key] if len(parts) == 1 else np.concatenate([p[key] for p in parts])

    def cat_pair(key, i):
        return parts[0][key][i] if len(parts) == 1 else np.concatenate([p[key][i] for p in parts])

    action = cat("action")
    repairs = {}
    if offset and pd.api.types.infer_dtype(action, skipna=False) != "string":
        # an entry without an action string says nothing about what happened: kept verbatim in events
        # under a name no allocator action has, and counted in the notes
        odd = np.fromiter((type(a) is not str for a in action), dtype=bool, count=len(action))
        if odd.all():  # nothing in the file says what happened: this is not a snapshot memlens can read
            raise InputError(f"none of the {len(action):,} device-trace entries has an 'action' string "
                             "(not a CUDA memory snapshot, or a corrupt one)")
        action = action.copy()
        action[odd] = "(no action)"
        repairs["trace entries without an action (kept as '(no action)')"] = int(odd.sum())
    size, size_missing = cat_pair("size", 0), cat_pair("size", 1)
    if size_missing.any():
        repairs["trace entries without a size (read as 0 bytes)"] = int(size_missing.sum())
    device_code = cat("device_code")
    time_us, time_missing = cat_pair("time", 0), cat_pair("time", 1)
    clock, t0, clock_repairs = "none", None, 0
    if offset == 0:
        t_ns = np.empty(0, dtype=np.int64)
    elif time_missing.any():
        clock, t_ns = "event_index", cat("index")
    else:
        clock = "time_us"
        t_ns, clock_repairs = _monotonic_per_device(time_us, device_code)
        t0_us = int(t_ns.min())
        # a span or start past 2**62 ns cannot be a recording: it would overflow int64 nanoseconds
        if int(t_ns.max()) - t0_us >= (1 << 62) // 1000 or abs(t0_us) >= (1 << 62) // 1000:
            raise InputError("a device-trace entry's time_us is beyond 2**62 ns from the others "
                             "(a corrupt time stamp)")
        t0 = t0_us * 1000
        t_ns = (t_ns - t0_us) * 1000
    extras = {}
    for key in ("user_metadata", "compile_context"):
        if any(key in p for p in parts):
            extras[key] = [v for p in parts for v in (p.get(key) or [""] * len(p["seq"]))]
    return EventColumns(
        seq=cat("seq"), t_ns=t_ns, device_code=device_code, devices=devices, action=action,
        addr=cat_pair("addr", 0), addr_missing=cat_pair("addr", 1), size=size, stream=cat("stream"),
        stack_id=cat("stack_id"), device_free=cat_pair("device_free", 0),
        device_free_missing=cat_pair("device_free", 1), clock=clock, t0_unix_ns=t0, clock_repairs=clock_repairs,
        extras=extras, repairs=repairs)


def _monotonic_per_device(time_us: np.ndarray, device_code: np.ndarray) -> tuple[np.ndarray, int]:
    """Clamp each device's times to be non-decreasing (time_us comes from an approximate clock and can
    step back a little); returns (times, number of entries changed)."""
    out = time_us.copy()
    for code in np.unique(device_code):
        sel = device_code == code
        out[sel] = np.maximum.accumulate(time_us[sel])
    return out, int((out != time_us).sum())


def events_table(ev: EventColumns, block_of_row: np.ndarray) -> pd.DataFrame:
    """The `events` table: every entry verbatim plus block_id / device_free / stack_id."""
    is_block = block_of_row >= 0
    df = pd.DataFrame({
        "seq": ev.seq, "t_ns": ev.t_ns.astype(np.int64),
        "device": pd.Categorical.from_codes(ev.device_code, ev.devices).astype(object)
        if len(ev.devices) else np.empty(0, dtype=object),
        "action": ev.action,
        "addr": pd.arrays.IntegerArray(ev.addr, ev.addr_missing.copy()),
        "size": ev.size, "stream": ev.stream,
        "block_id": pd.arrays.IntegerArray(np.where(is_block, block_of_row, 0), ~is_block),
        "device_free": pd.arrays.IntegerArray(ev.device_free, ev.device_free_missing.copy()),
        "stack_id": pd.arrays.IntegerArray(np.where(ev.stack_id == NO_STACK, 0, ev.stack_id),
                                           ev.stack_id == NO_STACK),
    })
    for key, values in ev.extras.items():
        df[key] = values
    return df
