"""Detect a file's format from its content and dispatch to the matching importer."""
from __future__ import annotations

import gzip
import importlib
import os
import zlib
from pathlib import Path

from memlens.errors import InputError, check_user_file

# format name -> (module, function) of its importer; each takes (path) and returns a Trace
IMPORTERS = {
    "memlens": ("memlens.trace.read", "load_trace"),
    "cuda_snapshot": ("memlens.io.snapshot.importer", "import_snapshot"),
    "kineto": ("memlens.io.kineto.importer", "import_kineto"),
    "memory_timeline": ("memlens.io.memory_timeline", "import_memory_timeline"),
    "lifetimes_csv": ("memlens.io.lifetimes_csv", "import_lifetimes_csv"),
}

_SNIFF_BYTES = 4096
# Kineto traces may open with a long "metadata" object before "traceEvents"; look this far for it
_DEEP_SNIFF_BYTES = 16 << 20
_KINETO_KEYS = (b'"traceEvents"', b'"ph"', b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"',
                b'"baseTimeNanoseconds"')


def _head(path: Path, nbytes: int = _SNIFF_BYTES) -> bytes:
    """The first `nbytes` of the file, decompressed when it is gzip."""
    with open(path, "rb") as f:
        raw = f.read(nbytes)
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as g:
                return g.read(nbytes)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"gzip file is corrupt or truncated ({exc})", path) from None
    return raw


def looks_like_kineto(path, head: bytes | None = None) -> bool:
    """Whether the file at `path` opens as a Kineto/Chrome trace: a JSON object naming one of its keys
    (``traceEvents`` up to 16 MiB in, when a long metadata object comes first), or a JSON array of events
    (``"ph"`` and ``"name"`` in its first events). Reads at most 16 MiB (decompressed), never the whole file."""
    head = _head(Path(path)) if head is None else head
    text = head.lstrip(b"\xef\xbb\xbf").lstrip()
    if text[:1] == b"{":
        if any(key in head for key in _KINETO_KEYS):
            return True
        deeper = _head(Path(path), _DEEP_SNIFF_BYTES) if len(head) == _SNIFF_BYTES else head
        return any(key in deeper for key in _KINETO_KEYS[:2])
    return text[:1] == b"[" and b'"ph"' in head and b'"name"' in head


def require_kineto(path) -> None:
    """`InputError` naming `path` unless it opens as a Kineto/Chrome trace (`looks_like_kineto`): a file
    that is not one is refused from its first bytes, before anything parses it whole."""
    try:
        head = _head(Path(path))
        ok = looks_like_kineto(path, head)
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror or exc})", path) from None
    if not head.strip():
        raise InputError("file is empty", path)
    if not ok:
        raise InputError("not a Kineto/Chrome trace: its first bytes are neither a JSON object with "
                         "'traceEvents' nor a JSON array of trace events", path)


def check_regular(path) -> None:
    """`InputError` unless `path` is a regular file (after symlinks): opening a FIFO blocks until a writer
    comes, and a device or socket never ends."""
    check_user_file(path)


def detect_format(path) -> str:
    """Name of the format of `path` (a key of `IMPORTERS`), judged by content.

    Raises `InputError` when the path is missing, empty or of no known format.
    """
    path = Path(path)
    from memlens.trace.tracedir import dir_lock, settle
    settle(path)  # a trace being re-saved, or whose save was killed: wait for it / recover it
    # the readers' shared lock: no save swaps a trace at this path between the checks below
    with dir_lock(path.parent, exclusive=False):
        if not path.exists():
            raise InputError("no such file or directory", path)
        if path.is_dir():
            if (path / "manifest.json").is_file():
                return "memlens"
            raise InputError("is a directory but not a memlens trace (no manifest.json)", path)
        check_regular(path)
    try:
        head = _head(path)
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror or exc})", path) from None
    if not head:
        raise InputError("file is empty", path)
    if head[:1] == b"\x80" or head[:1] in (b"}", b"(") and path.suffix in (".pickle", ".pkl"):
        return "cuda_snapshot"
    text = head.lstrip(b"\xef\xbb\xbf").lstrip()
    if text[:1] in (b"{", b"[") and looks_like_kineto(path, head):
        # a Chrome trace may also be a bare JSON array of events ("JSON Array Format")
        return "kineto"
    if text[:1] == b"{":
        raise InputError("JSON object is neither a Kineto/Chrome trace nor a memlens manifest", path)
    if text[:1] == b"[":
        # export_memory_timeline: raw rows [t, action, bytes, category] or [[times], [sizes]]
        return "memory_timeline"
    first_line = text.split(b"\n", 1)[0].decode("utf-8", "replace").strip().lower()
    cols = [c.strip() for c in first_line.split(",")]
    if {"id", "lower", "upper", "size"} <= set(cols):
        return "lifetimes_csv"
    raise InputError("unrecognised format (expected a memlens trace directory, a CUDA memory snapshot "
                     "pickle, a Kineto/Chrome trace JSON, a memory-timeline export or a buffer-lifetime CSV)",
                     path)


def load(path, format: str | None = None):
    """Load any supported file as a `memlens.Trace`.

    `format` forces a format (a key of `IMPORTERS`); otherwise it is detected from the content.
    """
    if format and not Path(path).is_dir():
        check_regular(path)
    fmt = format or detect_format(path)
    if fmt not in IMPORTERS:
        raise InputError(f"unknown format '{fmt}' (known: {', '.join(IMPORTERS)})", path)
    module, func = IMPORTERS[fmt]
    try:
        importer = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError):
        raise InputError(f"format '{fmt}' is recognised but its importer is not available in this "
                         "version of memlens", path) from None
    try:
        trace = importer(path)
    except UnicodeEncodeError as exc:  # JSON "\ud800" or a pickled str: text no file or table can hold
        bad = exc.object[exc.start:exc.end] if isinstance(exc.object, str) else ""
        raise InputError(f"holds text that is not valid Unicode ({bad.encode('unicode_escape').decode()!s} "
                         "in a name: a lone surrogate)", path) from None
    if fmt != "memlens":  # load_trace validates its own; an import must pass the same checks, or a
        # trace would be accepted now and its saved copy refused on reload
        validated(trace, path)
    return trace


def validated(trace, path):
    """`trace` (imported from `path`) after the checks every import passes (`memlens.trace.checks.validate_trace`);
    `InputError` naming `path` otherwise."""
    from memlens.trace.checks import validate_trace
    try:
        validate_trace(trace)
    except InputError as exc:
        raise InputError(f"bad values in the file: {exc.message}", path) from None
    return trace
