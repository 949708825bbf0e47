"""Shared by the snapshot-walker tests (tests/integration/test_import_snapshot_walkers.py and
tests/unit/test_import_snapshot_frames.py): a user frame, a trace entry with given frames, and the comparable form of
a streamed snapshot."""
from __future__ import annotations

from memlens.io.snapshot.stream import EntryColumns

FRAME = {"name": "forward", "filename": "/home/u/model.py", "line": 12}


def _entry(addr: int, frames: list, action: str = "alloc") -> dict:
    return {"action": action, "addr": addr, "size": 512, "stream": 0, "time_us": addr, "frames": frames}


def _canonical(value):
    """Comparable form of a streamed snapshot (EntryColumns as plain lists)."""
    if isinstance(value, EntryColumns):
        return ("columns", {k: list(v) for k, v in value.ints.items()}, list(value.stack_id),
                {k: list(v) for k, v in value.codes.items()}, value.names)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_canonical(v) for v in value)
    if isinstance(value, float) and value != value:
        return "nan"
    return value
