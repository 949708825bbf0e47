"""Where the compiled parts (the recorder, memlens.recording.native; the snapshot walker, memlens.io.native) are
cached: one folder for all of them, in which each build has its own subfolder named by what it was built from.
"""
from __future__ import annotations

import os


def cache_root() -> str:
    """``$MEMLENS_BUILD_DIR`` when set, else ``memlens`` under ``$XDG_CACHE_HOME`` (default ``~/.cache``)."""
    return os.environ.get("MEMLENS_BUILD_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "memlens")
