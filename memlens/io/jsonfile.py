"""Read a JSON document (plain or gzip) with one-line `InputError`s for every way a file can be bad."""
from __future__ import annotations

import json
from pathlib import Path

from memlens import limits
from memlens.errors import InputError, reading_file
from memlens.io.gzipfile import gunzip_limited


def load_json(path, what: str = "JSON"):
    """Parse the JSON file at `path` (gzip-compressed or not). `what` names the expected format in errors."""
    path = Path(path)
    with reading_file(path), open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            f.seek(0)
            raw = gunzip_limited(f, path)
        else:
            f.seek(0)
            raw = f.read()
    if not raw.strip():
        raise InputError("file is empty", path)
    try:
        doc = json.loads(raw)
        del raw
        limits.check_nesting(doc, path)
        return doc
    except MemoryError:
        raise InputError(f"{what} file is too large to parse in the memory available", path) from None
    except UnicodeDecodeError:
        raise InputError(f"not a {what} file: the content is not UTF-8 text", path) from None
    except RecursionError:
        raise InputError(f"not a {what} file: JSON nested too deeply", path) from None
    except json.JSONDecodeError as exc:
        hint = " (truncated?)" if exc.pos >= len(raw.rstrip()) - 1 else ""
        raise InputError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{hint}", path) from None
