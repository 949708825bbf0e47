"""Reading and writing traces: memlens's own format and every format users already have.

`load(path)` detects the format from the file's content (not only its name) and returns a `Trace`.
"""
from __future__ import annotations

from memlens.io.detect import detect_format, load

__all__ = ["detect_format", "load"]


def __getattr__(name):
    """Submodules load on first attribute access, so that the names the README writes
    (`memlens.io.<module>.<object>`) work after a plain ``import memlens``."""
    import importlib
    import importlib.util
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
