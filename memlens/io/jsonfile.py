"""Read a JSON document (plain or gzip) with one-line `InputError`s for every way a file can be bad."""
from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

from memlens.errors import InputError


def load_json(path, what: str = "JSON"):
    """Parse the JSON file at `path` (gzip-compressed or not). `what` names the expected format in errors."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror or exc})", path) from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"gzip data is corrupt or truncated ({exc})", path) from None
    if not raw.strip():
        raise InputError("file is empty", path)
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise InputError(f"not a {what} file: the content is not UTF-8 text", path) from None
    except RecursionError:
        raise InputError(f"not a {what} file: JSON nested too deeply", path) from None
    except json.JSONDecodeError as exc:
        hint = " (truncated?)" if exc.pos >= len(raw.rstrip()) - 1 else ""
        raise InputError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{hint}", path) from None
