"""Reading and writing traces: memlens's own format and every format users already have.

`load(path)` detects the format from the file's content (not only its name) and returns a `Trace`.
"""
from __future__ import annotations

from memlens.io.detect import detect_format, load

__all__ = ["detect_format", "load"]

