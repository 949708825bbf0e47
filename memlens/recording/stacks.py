"""Python call stacks for ops (optional, off by default: it costs several microseconds per op).

Only the user's frames are kept (frames inside torch and memlens are skipped), innermost first, and
identical stacks share one id so the `stacks` table stays small. The compiled recorder captures the
same stacks in C++ (native/op_stacks.h, given SKIP_PREFIXES and the depth) and hands them to
`StackTable.from_frames` at the end.
"""
from __future__ import annotations

import os
import sys

import pandas as pd

_TORCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__import__("torch").__file__)))
_SKIP_PREFIXES = (
    os.path.join(_TORCH_DIR, "torch") + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,   # memlens/
)
# every filename prefix whose frames are not kept (the compiled recorder is given the same list)
SKIP_PREFIXES = _SKIP_PREFIXES + ("<frozen",)
DEFAULT_MAX_DEPTH = 32


class StackTable:
    """Deduplicated stacks: `capture()` returns the id of the current user stack."""

    def __init__(self, max_depth: int = DEFAULT_MAX_DEPTH):
        self.max_depth = max_depth
        self._ids: dict[tuple, int] = {}
        self._frames: list[tuple] = []
        self._skip: dict[str, bool] = {}

    def capture(self) -> int:
        """Id of the calling Python stack (user frames only, innermost first)."""
        frame = sys._getframe(1)
        key = []
        skip = self._skip
        while frame is not None and len(key) < self.max_depth:
            code = frame.f_code
            filename = code.co_filename
            hidden = skip.get(filename)
            if hidden is None:
                hidden = skip[filename] = filename.startswith(SKIP_PREFIXES)
            if not hidden:
                key.append((code, frame.f_lineno))
            frame = frame.f_back
        key = tuple(key)
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = len(self._frames)
            self._frames.append(tuple((c.co_name, c.co_filename, line) for c, line in key))
        return sid

    @classmethod
    def from_frames(cls, stacks: list, max_depth: int = DEFAULT_MAX_DEPTH) -> "StackTable":
        """A finished table from stacks already deduplicated elsewhere (the compiled recorder's): stack
        id i = `stacks[i]`, a list of (name, filename, line) frames, innermost first."""
        table = cls(max_depth)
        table._frames = [tuple((str(name), str(filename), int(line)) for name, filename, line in frames)
                         for frames in stacks]
        return table

    def __len__(self) -> int:
        return len(self._frames)

    def to_frame(self) -> pd.DataFrame:
        """The `stacks` table: one row per (stack_id, depth), depth 0 innermost."""
        rows = [(sid, depth, name, filename, line)
                for sid, frames in enumerate(self._frames)
                for depth, (name, filename, line) in enumerate(frames)]
        return pd.DataFrame(rows, columns=["stack_id", "depth", "name", "filename", "line"])
