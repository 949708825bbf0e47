"""Metadata of an imported CUDA memory snapshot: format era, clock, settings, and plain-sentence notes
saying what the file could not tell. Also the `ops` table from ``external_annotations``."""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.io.bounded_text import bounded_value, safe_str
from memlens.io.snapshot.events import EventColumns
from memlens.io.snapshot.pairing import ALLOC
from memlens.io.snapshot.segments import FinalState

_KNOWN_ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                  "segment_map", "segment_unmap", "oom", "snapshot"}
_MAX_LISTED = 50  # distinct user_metadata / compile_context values kept in metadata


def format_era(ev: EventColumns, final: FinalState, extras: dict) -> str:
    """Which generation of the snapshot format the file is, read from what it carries: per-block history,
    device-trace entries with or without `time_us`, allocator settings and annotations, or segments only."""
    if final.has_history:
        return "2023: blocks carry history, entries have no time_us"
    if len(ev) == 0:
        return "segments only: no device trace"
    if ev.clock == "event_index":
        return "late 2023 - mid 2024: entries without time_us"
    if "allocator_settings" in extras or "external_annotations" in extras or ev.extras:
        return "2025+: time_us, allocator_settings / annotations / per-entry context"
    return "2024+: entries with time_us"


def _distinct(values: list) -> list[str]:
    return sorted({v for v in values if v})[:_MAX_LISTED]


def describe(ev: EventColumns, kind: np.ndarray, blocks: pd.DataFrame, final: FinalState, facts: dict,
             extras: dict, source: str) -> dict:
    """The metadata dict, including ``notes``: plain sentences about what the file could not tell."""
    action_counts = pd.Series(ev.action, dtype=object).value_counts().to_dict() if len(ev) else {}
    ooms = int(action_counts.get("oom", 0))
    meta = {
        "source_kind": "cuda_snapshot", "source_path": source, "format_era": format_era(ev, final, extras),
        "clock": ev.clock, "ooms": ooms,
        "entries": {dev: int((ev.device_code == i).sum()) for i, dev in enumerate(ev.devices)},
        "action_counts": {safe_str(k): int(v) for k, v in action_counts.items()},
        "devices": sorted(set(ev.devices) | set(final.segments["device"]) | set(blocks["device"])),
    }
    if ev.t0_unix_ns is not None:
        meta["t0_unix_ns"] = ev.t0_unix_ns
    if "allocator_settings" in extras:
        meta["allocator_settings"] = bounded_value(extras["allocator_settings"])
    annotations = extras.get("external_annotations")
    if annotations:
        meta["external_annotations"] = bounded_value(annotations)
    for key in ("user_metadata", "compile_context"):
        if key in ev.extras:
            meta[key] = _distinct(ev.extras[key])
    other = sorted(safe_str(k) for k in extras if k not in ("allocator_settings", "external_annotations"))
    if other:
        meta["other_keys"] = other

    notes = ["A CUDA memory snapshot records allocator events only: no op reads or writes are in it, so "
             "the trace has no accesses and access-based analyses (idle intervals, swapping) cannot run."]
    if other:  # a newer torch (or a tool) added keys: say so rather than drop them silently
        shown = ", ".join(other[:8]) + (f" and {len(other) - 8} more" if len(other) > 8 else "")
        notes.append(f"Top-level keys memlens does not interpret: {shown} (their names are kept in "
                     "metadata['other_keys']).")
    if len(ev) == 0:
        notes.append("The snapshot holds no device trace (memory history was not recorded or was empty): "
                     "blocks are the live blocks of the final allocator state, with no alloc or free times.")
    elif ev.clock == "event_index":
        notes.append("Entries carry no time_us: the order of entries is the only clock (t_ns is the entry's "
                     "index within its device's trace, not nanoseconds).")
    if ev.clock_repairs:
        notes.append(f"{ev.clock_repairs} entries had a time_us earlier than the entry before them; their "
                     "time was raised to keep each device's clock non-decreasing.")
    without_alloc = int(blocks["free_without_alloc"].sum())
    if without_alloc:
        notes.append(f"{without_alloc} blocks were freed without their alloc in the trace (the ring buffer, "
                     "max_entries, overflowed or recording began after they were allocated): their alloc "
                     "time, alloc stack and op are unknown.")
    live_before = facts.get("allocated_before_live", 0)
    if live_before:
        notes.append(f"{live_before} blocks live in the final state were never allocated in the trace "
                     "(allocated before recording began): their alloc time is unknown.")
    pending = int((blocks["free_requested_seq"].notna() & blocks["free_ns"].isna()).sum())
    if pending:
        notes.append(f"{pending} blocks had their free requested but not completed by the end (stream-ordered "
                     "free pending): they count as live, as the allocator still holds their bytes.")
    if facts.get("open_not_live"):
        notes.append(f"{facts['open_not_live']} blocks left live by the trace are not live in the final "
                     "segments; the trace and the final state disagree about them.")
    if facts.get("size_mismatch"):
        notes.append(f"{facts['size_mismatch']} live blocks have a different size in the trace than in the "
                     "final segments.")
    if not facts.get("has_final_state"):
        notes.append("The snapshot has no segments: the final allocator state is unknown, so blocks left "
                     "live by the trace cannot be checked against it.")
    if final.has_history:
        notes.append(f"This 2023-format snapshot lists {final.history_entries} allocations in its block "
                     "histories without times or frees; only the histories of live blocks are used (for "
                     "their stacks and requested sizes), past ones are not blocks.")
    repairs = {**(ev.repairs or {}), **(final.repairs or {}), **facts.get("frame_repairs", {})}
    repairs = {what: n for what, n in repairs.items() if n}
    if repairs:
        notes.append("Read past what the file left out or could not say: " +
                     "; ".join(f"{n:,} {what}" for what, n in repairs.items()) + ".")
    unknown = sorted(set(action_counts) - _KNOWN_ACTIONS - {"(no action)"})
    if unknown:
        notes.append(f"Unrecognised actions kept verbatim in events: {', '.join(map(str, unknown))}.")
    if ooms:
        notes.append(f"The trace contains {ooms} out-of-memory event(s) (action 'oom', device_free in events).")
    if int((kind == ALLOC).sum()) == 0 and len(ev):
        notes.append("The device trace contains no alloc entries.")
    meta["notes"] = notes
    return meta


def annotation_ops(annotations, t0_unix_ns: int | None, t_end_ns: int | None = None) -> pd.DataFrame | None:
    """`ops` rows from ``external_annotations`` START/END pairs (record_function ranges), in ns relative
    to the trace start and clipped to [0, t_end_ns]; None when there are none or the trace has no clock."""
    if not annotations or t0_unix_ns is None or not isinstance(annotations, list):
        return None
    open_ranges: dict[tuple, list[int]] = {}
    rows = []
    for a in annotations:
        if not isinstance(a, dict) or "time_us" not in a:
            continue
        key = (safe_str(a.get("name", "")), a.get("device"))
        t = int(a["time_us"]) * 1000 - t0_unix_ns
        if a.get("stage") == "START":
            open_ranges.setdefault(key, []).append(t)
        elif a.get("stage") == "END" and open_ranges.get(key):
            rows.append((key[0], open_ranges[key].pop(), t, key[1]))
    if not rows:
        return None
    df = pd.DataFrame(rows, columns=["name", "start_ns", "end_ns", "annotation_device"])
    df = df.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    hi = t_end_ns if t_end_ns is not None else int(df["end_ns"].max())
    df = df[(df["end_ns"] >= 0) & (df["start_ns"] <= hi)].copy()
    df["start_ns"] = df["start_ns"].clip(0, hi)
    df["end_ns"] = df["end_ns"].clip(0, hi)
    df.insert(0, "op_id", np.arange(len(df), dtype=np.int64))
    df["kind"] = "annotation"
    df["annotation_device"] = df["annotation_device"].astype(str)
    return df
