"""One build at a time per build folder for the compiled extensions, and no lock that outlives its owner.

`torch.utils.cpp_extension.load` guards a build folder with a ``lock`` file that it deletes when the build
ends; a build killed on the way (Ctrl-C, the OOM killer) leaves the file, and every later build waits for it
forever, silently. memlens therefore takes its own lock first: ``flock`` on
``memlens-build.lock`` in the folder, which the kernel lets go when its holder dies, however it dies. Whoever
holds it knows that no live memlens build is running, so a ``lock`` file found then is stale and is removed.
A process that has to wait says so on stderr (what it waits for, which process holds it) and gives up after
``MEMLENS_BUILD_WAIT_S`` seconds (default 900) with `BuildBusy`. An interrupted build removes what it had
started (torch's lock, object files, ninja's state, a library written during the build).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import sys
import time

LOCK_NAME = "memlens-build.lock"
DEFAULT_WAIT_S = 900.0
_PARTIAL = ("lock", "*.o", "build.ninja", ".ninja_deps", ".ninja_log", "*.so.tmp")


class BuildBusy(RuntimeError):
    """Another process held the build folder for longer than the wait bound."""


def wait_bound_s() -> float:
    raw = os.environ.get("MEMLENS_BUILD_WAIT_S", "").strip()
    try:
        value = float(raw) if raw else DEFAULT_WAIT_S
    except ValueError:
        value = DEFAULT_WAIT_S
    return value if value >= 0 else DEFAULT_WAIT_S


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return "another process"
    return f"process {text}" if text.isdigit() else "another process"


@contextlib.contextmanager
def build_lock(folder: str | os.PathLike, what: str, library: str | os.PathLike | None = None,
               wait_s: float | None = None, poll_s: float = 0.2):
    """Hold the build lock of `folder` (created if needed) while `what` (e.g. "the compiled recorder") is
    built; see the module docstring. `library`: the build's product; when it is there already, an
    interrupted call removes only torch's stale lock (the build it holds is complete)."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    bound = wait_bound_s() if wait_s is None else wait_s
    fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        start = time.monotonic()
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise
            waited = time.monotonic() - start
            if waited >= bound:
                raise BuildBusy(f"gave up after {bound:.0f} s waiting for {_holder(fd)} to finish building {what} "
                                f"in {folder} (set MEMLENS_BUILD_WAIT_S to wait longer)")
            if not told and waited >= min(2.0, bound / 2):
                print(f"memlens: waiting for {_holder(fd)} to finish building {what} in {folder} "
                      f"(giving up after {bound:.0f} s)", file=sys.stderr, flush=True)
                told = True
            time.sleep(poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        stale = os.path.join(folder, "lock")
        if os.path.exists(stale):  # no live memlens build holds it: its owner was killed mid-build
            os.unlink(stale)
        began = time.time()
        complete = library is not None and os.path.exists(library)
        try:
            yield
        except BaseException:  # Ctrl-C or a failure: leave nothing half-built behind
            if complete:
                with contextlib.suppress(OSError):
                    os.unlink(stale)
            else:
                _remove_partial(folder, began)
            raise
    finally:
        os.close(fd)  # lets the flock go


def _remove_partial(folder: str, began: float) -> None:
    paths = {p for pattern in _PARTIAL for p in glob.glob(os.path.join(folder, pattern))}
    paths |= {p for p in glob.glob(os.path.join(folder, "*.so")) if _mtime(p) >= began}
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
