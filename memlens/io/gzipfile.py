"""Decompress gzip input with a bound on the decompressed size (see `memlens.limits`)."""
from __future__ import annotations

import gzip
import zlib

from memlens import limits
from memlens.errors import InputError


MAX_RATIO = 500  # decompressed / compressed bytes beyond which a gzip input is treated as a bomb


def gunzip_limited(f, path=None, chunk: int = 1 << 20) -> bytes:
    """Decompress the gzip file object `f` (all members), refusing with `InputError` before keeping
    anything when it would expand past `limits.max_decompressed` bytes: a first pass only counts, so a
    bomb costs time (about 1 s per GiB) but no memory."""
    limit = limits.max_decompressed()
    start = f.tell()
    total = 0
    try:
        with gzip.GzipFile(fileobj=f, mode="rb") as g:
            while True:
                piece = g.read(chunk)
                if not piece:
                    break
                total += len(piece)
                if total > limit:
                    raise InputError(limits.too_big("gzip data expands past"), path)
                # a bomb shows itself long before the limit: no real trace compresses 500x (deflate's
                # maximum is ~1000x); stop after limit/16 bytes at such a ratio instead of counting on
                if total > limit // 16 and total > MAX_RATIO * max(f.tell() - start, 1):
                    raise InputError(limits.too_big(f"gzip data expands more than {MAX_RATIO}x and would go "
                                                    "past"), path)
        f.seek(start)
        out = bytearray(total)
        with gzip.GzipFile(fileobj=f, mode="rb") as g:
            view = memoryview(out)
            got = 0
            while got < total:
                n = g.readinto(view[got:])
                if not n:
                    break
                got += n
    except InputError:
        raise
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"gzip data is corrupt or truncated ({exc})", path) from None
    return out
