"""Limits that keep a hostile or broken input file from exhausting memory or time.

Each limit has a default generous enough for real PyTorch files and an environment variable that raises
it (or lowers it) for one run:

=============================  ==========  =================================================================
variable                       default     what it bounds
=============================  ==========  =================================================================
``MEMLENS_MAX_DECOMPRESSED``   ``1GiB``    bytes a gzip file may decompress to, and the uncompressed size of a
                                           saved trace's Parquet tables (a size, e.g. ``4GiB``)
``MEMLENS_MAX_FRAMES``         ``4096``    frames in one stack of a CUDA memory snapshot
``MEMLENS_MAX_NESTING``        ``100``     nesting depth of containers in a pickle or JSON document
``MEMLENS_MAX_DEVICES``        ``64``      devices in one trace file (each costs its own analyses)
=============================  ==========  =================================================================

Going over a limit is bad input (`InputError`, exit code 2) with a message that names the variable.
"""
from __future__ import annotations

import os

from memlens.errors import InputError

DEFAULT_MAX_DECOMPRESSED = 1 << 30
DEFAULT_MAX_FRAMES = 4096
DEFAULT_MAX_NESTING = 100
DEFAULT_MAX_DEVICES = 64  # one process sees at most 8-16 GPUs; 64 leaves room for host and mixed devices


def _env_int(name: str, default: int, *, size: bool = False) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        if size:
            from memlens.units import parse_bytes
            value = parse_bytes(raw)
        else:
            value = int(raw.strip())
    except (InputError, ValueError, OverflowError):
        raise InputError(f"environment variable {name}={raw!r} is not a "
                         f"{'size (e.g. 4GiB)' if size else 'whole number'}") from None
    if value <= 0:
        raise InputError(f"environment variable {name}={raw!r} must be positive")
    return value


def max_decompressed() -> int:
    """Most bytes a compressed input may expand to (``MEMLENS_MAX_DECOMPRESSED``, default 1 GiB)."""
    return _env_int("MEMLENS_MAX_DECOMPRESSED", DEFAULT_MAX_DECOMPRESSED, size=True)


def max_frames() -> int:
    """Most frames one snapshot stack may hold (``MEMLENS_MAX_FRAMES``, default 4096)."""
    return _env_int("MEMLENS_MAX_FRAMES", DEFAULT_MAX_FRAMES)


def max_nesting() -> int:
    """Deepest container nesting accepted in pickles and JSON (``MEMLENS_MAX_NESTING``, default 100)."""
    return _env_int("MEMLENS_MAX_NESTING", DEFAULT_MAX_NESTING)


def check_environment() -> None:
    """Raise `InputError` now when a limit variable is set to nonsense (the CLI calls this first, so a
    typo is reported even for inputs that would never reach the limit)."""
    max_decompressed()
    max_frames()
    max_nesting()


def too_big(what: str) -> str:
    """Message for an input that would decompress past `max_decompressed`: "`what` the limit of ..."."""
    from memlens.units import format_bytes
    return (f"{what} the limit of {format_bytes(max_decompressed())} "
            "(a decompression bomb? set MEMLENS_MAX_DECOMPRESSED, e.g. MEMLENS_MAX_DECOMPRESSED=8GiB, "
            "to read it anyway)")


CONTAINERS = (dict, list, tuple, set, frozenset)


def check_nesting(obj, where=None, limit: int | None = None, *, also_walk: tuple = (), visit=None,
                  watch: tuple = (), on_watched=None) -> None:
    """Raise `InputError` when dicts/lists/tuples in `obj` nest deeper than `limit` (iterative walk,
    so the check itself cannot overflow the stack; each container is visited once).

    Hooks for walkers that check more on the same pass (`memlens.io.snapshot.limits.check_streamed`):
    objects of the types in `also_walk` are walked into too (passed to `visit`, never descended); `visit(item)`
    is called on every container and `also_walk` object before its children; `on_watched(parent, child)` on
    every child whose type is in `watch`. Hooks raise to refuse."""
    limit = max_nesting() if limit is None else limit
    walked = CONTAINERS + tuple(also_walk)
    stack = [(obj, 1)]
    seen: dict[int, int] = {}  # id -> deepest depth visited at (a shared container is revisited only deeper)
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is dict:
            children = item.values()
        elif kind in CONTAINERS:
            children = item
        else:
            if visit is not None and kind in also_walk:
                visit(item)
            continue
        if visit is not None:
            visit(item)
        if seen.get(id(item), 0) >= depth:
            continue
        seen[id(item)] = depth
        if depth > limit:
            raise InputError(f"containers nested more than {limit} deep (set MEMLENS_MAX_NESTING to raise "
                             "the limit)", where)
        for child in children:
            kind = type(child)
            if kind in walked:
                stack.append((child, depth + 1))
            elif watch and kind in watch:
                on_watched(item, child)


def max_devices() -> int:
    """Most devices one trace file may hold (``MEMLENS_MAX_DEVICES``, default 64)."""
    return _env_int("MEMLENS_MAX_DEVICES", DEFAULT_MAX_DEVICES)


def check_devices(count: int, where=None) -> None:
    """`InputError` when a file holds more than `max_devices` devices (each device's analyses cost their own
    work, so a small file naming thousands of devices would take minutes)."""
    limit = max_devices()
    if count > limit:
        raise InputError(f"{count:,} devices: a trace holds at most {limit} (raise MEMLENS_MAX_DEVICES to "
                         "read it)", where)


def check_input_file(path, what: str = "file") -> int:
    """Size in bytes of the regular file at `path`, or `InputError`: not a regular file (a FIFO, a device), or
    more than `max_decompressed` bytes (a file read whole or streamed into memory is bounded like a gzip's
    expansion)."""
    from memlens.errors import check_user_file
    size, limit = check_user_file(path, None, what), max_decompressed()
    if size > limit:
        raise InputError(f"{size:,} bytes: a {what} is read up to {limit:,} (raise MEMLENS_MAX_DECOMPRESSED "
                         "to read it)", path)
    return size
