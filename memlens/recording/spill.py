"""Where the compiled recorder writes records over its memory budget (its spill files).

One private directory per process (``tempfile.mkdtemp``: mode 0700, a name no one else can predict),
made at the first recording and removed when the process exits; each recording writes its files under
its own prefix there and removes them when it is done. A directory per recording cost a mkdir and an
rmdir each time, ~1-3 ms of a one-step recording's close on this machine's file system,
for files that exist only when a recording outgrows its budget.
"""
from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile

_directory: tuple[int, str] | None = None     # (pid that made it, path): a forked child makes its own
_numbers = itertools.count()


def spill_prefix() -> str:
    """A new recording's spill-file prefix (the C++ side appends ``.t0``, ``.mem``, ... to it)."""
    global _directory
    pid = os.getpid()
    if _directory is None or _directory[0] != pid or not os.path.isdir(_directory[1]):
        path = tempfile.mkdtemp(prefix="memlens-spill-")
        _directory = (pid, path)
        atexit.register(_remove_directory, pid, path)
    return os.path.join(_directory[1], f"rec{next(_numbers)}")


def remove_spill_files(prefix: str) -> None:
    """Remove the spill files of the recording with this prefix (those there are; errors ignored)."""
    directory, base = os.path.split(prefix)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.startswith(base + "."):
            try:
                os.remove(os.path.join(directory, name))
            except OSError:      # removed already, or not removable: the process's exit removes the directory
                pass


def _remove_directory(pid: int, path: str) -> None:
    if os.getpid() == pid:      # never a parent's directory from a forked child's exit
        shutil.rmtree(path, ignore_errors=True)
