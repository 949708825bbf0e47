"""Read a JSON document (plain or gzip) with one-line `InputError`s for every way a file can be bad."""
from __future__ import annotations

import json
from pathlib import Path

from memlens import limits
from memlens.errors import InputError, check_user_file, reading_file
from memlens.io.gzipfile import gunzip_limited


def load_json(path, what: str = "JSON"):
    """Parse the JSON file at `path` (gzip-compressed or not). `what` names the expected format in errors."""
    path = Path(path)
    size = check_user_file(path, what=f"{what} file")  # a FIFO or device is refused before it is opened
    with reading_file(path), open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            f.seek(0)
            raw = gunzip_limited(f, path)
        else:
            f.seek(0)
            limit = limits.max_decompressed()  # plain text is held whole: as bounded as a gzip's expansion
            if size > limit:
                raise InputError(f"{size:,} bytes of {what}: at most {limit:,} are read (raise "
                                 "MEMLENS_MAX_DECOMPRESSED to read it)", path)
            raw = f.read(limit + 1)  # a file that grew since: still bounded
            if len(raw) > limit:
                raise InputError(f"over {limit:,} bytes of {what} (raise MEMLENS_MAX_DECOMPRESSED)", path)
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
