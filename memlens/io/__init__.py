"""Loading traces: memlens's own format (read and written by `memlens.trace`) and every format users already
have (the importers here).

`load(path)` detects the format from the file's content (not only its name) and returns a `Trace`.
"""
from __future__ import annotations

from memlens.io.detect import detect_format, load

__all__ = ["detect_format", "load"]

