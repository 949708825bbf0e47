"""One validation layer for every command's options.

Use these as argparse ``type=`` callables (they raise `argparse.ArgumentTypeError`, which the parser turns
into exit code 2 and one line naming the option), or call the ``check_*`` helpers in ``run`` for what can
only be checked later (a device against the loaded trace, an output path before long work starts)::

    from memlens.commands import options
    p.add_argument("--limit", type=options.size, help=...)            # bytes, int
    p.add_argument("--bandwidth", type=options.bandwidth)              # a BandwidthModel
    p.add_argument("--time-limit", type=options.duration_s)            # seconds, finite, > 0
    p.add_argument("--top", type=options.count(minimum=1))             # int in range
    p.add_argument("--alignment", type=options.alignment)              # bytes, 1..2**30
    p.add_argument("--sections", type=options.name_list(SECTIONS))     # ["live", "peak"]
    p.add_argument("-o", "--output", type=options.output_path)         # Path, writable (checked now)
    ...
    options.check_device(trace, args.device)                           # in run(), after loading

Every function names the bad value and what is expected; none accepts NaN, inf, negative sizes, sizes
past 64 PiB or counts past 10**9.
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from memlens.errors import InputError, printable

MAX_COUNT = 10**9
MAX_SECONDS = 7 * 24 * 3600.0  # a week: longer is a typo, and would overflow nanosecond arithmetic
MAX_ALIGNMENT = 1 << 30


def _fail(message: str):
    raise argparse.ArgumentTypeError(printable(message))


def size(text: str) -> int:
    """A size in bytes ('512MB', '1.5GiB', '1024'): 0 <= size < 2**56."""
    from memlens.units import parse_bytes
    try:
        return parse_bytes(text)
    except InputError as exc:
        _fail(exc.message)


def positive_size(text: str) -> int:
    """A size in bytes > 0."""
    value = size(text)
    if value <= 0:
        _fail(f"size '{text}' must be more than 0 bytes")
    return value


def bandwidth(text: str):
    """A host<->device link: a preset ('pcie4', 'inf'), '25GB/s' or 'OUT,IN'; returns a BandwidthModel."""
    from memlens.analysis.bandwidth import BandwidthModel
    try:
        return BandwidthModel.parse(text)
    except InputError as exc:
        _fail(exc.message)
    except (ValueError, OverflowError, TypeError):
        _fail(f"cannot read '{text}' as a bandwidth (examples: 25GB/s, 13.2GB/s,12.2GB/s, pcie4)")


def duration_s(text: str) -> float:
    """A duration in seconds: finite, > 0 and at most a week."""
    return _seconds(text, allow_zero=False)


def duration_s_or_zero(text: str) -> float:
    """A duration in seconds that may be 0 (meaning: no time at all, e.g. heuristics only)."""
    return _seconds(text, allow_zero=True)


def _seconds(text: str, allow_zero: bool) -> float:
    try:
        value = float(str(text).strip().rstrip("s"))
    except ValueError:
        _fail(f"cannot read '{text}' as seconds (examples: 30, 2.5)")
    if not math.isfinite(value):
        _fail(f"'{text}' is not a finite number of seconds")
    if value < 0 or (value == 0 and not allow_zero):
        _fail(f"'{text}' seconds: must be {'>= 0' if allow_zero else 'more than 0'}")
    if value > MAX_SECONDS:
        _fail(f"'{text}' seconds is more than a week")
    return value


def microseconds(text: str) -> float:
    """A latency in microseconds: finite, >= 0, at most a week."""
    try:
        value = float(text)
    except ValueError:
        _fail(f"cannot read '{text}' as microseconds")
    if not math.isfinite(value) or value < 0 or value > MAX_SECONDS * 1e6:
        _fail(f"'{text}' microseconds: must be a finite number >= 0")
    return value


def count(minimum: int = 0, maximum: int = MAX_COUNT):
    """A type for a whole number in [minimum, maximum]."""
    def parse(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            _fail(f"cannot read '{text}' as a whole number")
        if value < minimum or value > maximum:
            _fail(f"{value} is out of range ({minimum} to {maximum})")
        return value
    parse.__name__ = "count"
    return parse


def alignment(text: str) -> int:
    """An alignment in bytes: 1 <= alignment <= 1 GiB."""
    value = count(1, MAX_ALIGNMENT)(text)
    return value


def name_list(choices=None) -> callable:
    """A type for a comma-separated, non-empty list of names out of `choices` (any names when None; the
    command then checks them against a list it imports lazily)."""
    allowed = list(choices) if choices is not None else None

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in str(text).split(",") if n.strip()]
        if not names:
            _fail(f"'{text}' names nothing" + (f" (choose from {', '.join(allowed)})" if allowed else ""))
        unknown = [n for n in names if allowed is not None and n not in allowed]
        if unknown:
            _fail(f"unknown name{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                  f"(choose from {', '.join(allowed)})")
        return names
    parse.__name__ = "name_list"
    return parse


def output_path(text: str) -> Path:
    """An output path whose directory exists (or can be created) and is writable; checked at parse time,
    before any long work, so that nothing computed or recorded is lost to an unwritable path."""
    path = Path(text)
    problem = output_problem(path)
    if problem:
        _fail(f"'{text}': {problem}")
    return path


def output_problem(path: Path) -> str | None:
    """Why `path` cannot be written, or None. Does not create anything."""
    if str(path) == "":
        return "empty path"
    if path.is_dir() and not (path / "manifest.json").is_file() and path.suffix != ".memlens":
        return "is a directory"
    parent = path.parent if str(path.parent) else Path(".")
    probe = parent
    while not probe.exists():  # the nearest existing ancestor must be a writable directory
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"directory {probe} is not writable"
    if path.exists() and not path.is_dir() and not os.access(path, os.W_OK):
        return "exists and is not writable"
    return None


def check_output(path, option: str = "--output") -> None:
    """Raise `InputError` naming `option` when `path` cannot be written (for paths checked in ``run``)."""
    if path is None:
        return
    problem = output_problem(Path(path))
    if problem:
        raise InputError(f"{option} {path}: {problem}")


def check_device(trace, device: str | None, option: str = "--device") -> None:
    """Raise `InputError` when `device` is given but the trace has no blocks on it."""
    if device is None:
        return
    devices = list(trace.devices) if hasattr(trace, "devices") else []
    if device not in devices:
        raise InputError(f"{option} {device}: the trace has no such device (it has: "
                         f"{', '.join(devices) or 'none'})")


def categories_file(text: str):
    """A rules file for ``--categories`` (TOML ``[[rule]]`` tables, `memlens.categories.rules`), read and
    checked now, before any trace is loaded; returns its `RuleSet`."""
    from memlens.categories.rules import read_rules_file
    try:
        return read_rules_file(text)
    except InputError as exc:
        _fail(f"{exc.path}: {exc.message}" if exc.path else exc.message)


def add_categories_option(p) -> None:
    """``--categories RULES.toml``: the command sees the categories the user's rules give (`memlens.categorize`)."""
    p.add_argument("--categories", metavar="RULES.toml", type=categories_file, default=None,
                   help="categorise blocks by your own ordered regex rules (a TOML file of [[rule]] tables over "
                        "frame, function, file, stack, module, op, annotation, phase, builtin; first match wins; "
                        "category \"@builtin\" keeps memlens's own)")


def with_categories(trace, rules):
    """`trace` categorised by `rules` (the ``--categories`` value), or `trace` itself when None."""
    if rules is None:
        return trace
    from memlens.categories import categorize
    return categorize(trace, rules)


def refuse_categories_out_of_core(args, what: str) -> None:
    """`InputError` when ``--categories`` is combined with the out-of-core engine, which reads aggregates of
    the saved categories and cannot re-categorise blocks."""
    if getattr(args, "categories", None) is not None:
        raise InputError(f"--categories needs the trace in memory; {what} would run out of core (add --engine "
                         "memory)")
