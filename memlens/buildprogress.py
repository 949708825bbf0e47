"""What a user sees while a compiled extension builds: never a silent wait of minutes.

`build_progress` says on stderr what is built, from how many files, about how long it takes and where,
then every few seconds how long it has run (wall clock) and which step it is at (compiling: how many of
the object files exist; linking), and at the end how long it took or that it failed. torch's own build
output (every compiler command and warning) stays hidden unless the build fails.
"""
from __future__ import annotations

import contextlib
import glob
import os
import sys
import threading
import time

TICK_S = 15.0   # seconds between two progress lines


def needs_build(library: str | os.PathLike, sources: list) -> bool:
    """True when `library` is missing or older than one of `sources` (what ninja would rebuild)."""
    try:
        built = os.stat(library).st_mtime
    except OSError:
        return True
    return any(os.stat(src).st_mtime > built for src in sources)


def _clock(seconds: float) -> str:
    """`seconds` as m:ss."""
    whole = int(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def _step(folder: str, n_objects: int) -> str:
    done = len(glob.glob(os.path.join(folder, "*.o")))
    if done < n_objects:
        return f"compiling ({done} of {n_objects} object files done)"
    return "linking"


@contextlib.contextmanager
def build_progress(what: str, folder: str | os.PathLike, n_files: int, estimate: str, n_objects: int = 1,
                   tick_s: float | None = None):
    """Report the build of `what` (e.g. "the compiled recorder") in `folder` on stderr while the body runs.

    `n_files`: source files compiled (headers included); `estimate`: the usual build time in words (e.g.
    "about 3 min on 2 cores"); `n_objects`: the object files the build makes (the compile steps);
    `tick_s`: seconds between progress lines (default `TICK_S`)."""
    folder = os.fspath(folder)
    interval = TICK_S if tick_s is None else tick_s

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    say(f"memlens: building {what} (C++, {n_files} files, {estimate}) in {folder} ...")
    began = time.monotonic()
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(interval):
            say(f"memlens:   ... {_clock(time.monotonic() - began)} elapsed, {_step(folder, n_objects)}")

    ticker = threading.Thread(target=tick, name="memlens-build-progress", daemon=True)
    ticker.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        ticker.join()
        took = _clock(time.monotonic() - began)
        say(f"memlens: built {what} in {took}" if ok else f"memlens: building {what} failed after {took}")
