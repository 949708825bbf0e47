"""What a user sees while a compiled extension builds: never a silent wait of minutes.

`build_progress` says on stderr what is built (its translation units and the headers they include), about
how long it takes and where, then every few seconds how long it has run (wall clock) and which of the
build's real steps it is at (one compile step per translation unit, done when its object file exists;
then the link), and at the end how long it took or that it failed. torch's own build output (every
compiler command and warning) stays hidden unless the build fails.
"""
from __future__ import annotations

import contextlib
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


def _object_name(unit: str) -> str:
    """The object file torch's cpp_extension (ninja) writes for the translation unit `unit`: `name.o`."""
    return os.path.splitext(os.path.basename(unit))[0] + ".o"


def _step(folder: str, units: list) -> str:
    """The real step a build in `folder` is at: "step k of n: compiling X.cpp" per unit, then linking."""
    n_steps = len(units) + 1
    for k, unit in enumerate(units, start=1):
        if not os.path.exists(os.path.join(folder, _object_name(unit))):
            return f"step {k} of {n_steps}: compiling {os.path.basename(unit)}"
    return f"step {n_steps} of {n_steps}: linking"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@contextlib.contextmanager
def build_progress(what: str, folder: str | os.PathLike, units: list, n_headers: int, estimate: str,
                   tick_s: float | None = None):
    """Report the build of `what` (e.g. "the compiled recorder") in `folder` on stderr while the body runs.

    `units`: the translation units (.cpp paths), one compile step each; `n_headers`: the headers they
    include (compiled inside them, no step of their own); `estimate`: the usual build time in words (e.g.
    "about 3 min on 2 cores"); `tick_s`: seconds between progress lines (default `TICK_S`)."""
    folder = os.fspath(folder)
    units = list(units)
    interval = TICK_S if tick_s is None else tick_s
    names = ", ".join(os.path.basename(u) for u in units)
    headers = f" with {_count(n_headers, 'header')}" if n_headers else ""

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    say(f"memlens: building {what} (C++: {_count(len(units), 'translation unit')}, {names}{headers}; "
        f"{estimate}) in {folder} ...")
    began = time.monotonic()
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(interval):
            say(f"memlens:   ... {_clock(time.monotonic() - began)} elapsed, {_step(folder, units)}")

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
