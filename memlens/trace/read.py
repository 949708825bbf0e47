"""Loading traces saved by `memlens.trace.tracedir.save_trace` (the ``NAME.memlens/`` directory of Parquet tables
plus ``manifest.json`` described there), and the checks every table file passes before it is read.

Loading checks sizes before it reads or hashes anything: each table file's size against the manifest's
``bytes`` and `memlens.limits.max_decompressed`, and the Parquet footer's uncompressed size and row count
against the limit and the manifest. Readers hold a shared lock of the parent directory for the whole load,
so a concurrent save is seen whole or not at all.

Saving lives below the Trace class (`memlens.trace.tracedir`), so that `Trace.save` needs no import of this
module; the format's names (`MANIFEST`, `FORMAT_NAME`, `is_trace_dir`) live there too.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pandas as pd

from memlens import limits
from memlens.errors import InputError
from memlens.trace.checks import check_metadata, validate_trace
from memlens.trace.model import Trace
from memlens.trace.schema import OPTIONAL_TABLES, REQUIRED_TABLES, SCHEMA, SCHEMA_VERSION, conform
from memlens.trace.tracedir import FORMAT_NAME, MANIFEST, dir_lock, file_sha256, settle

__all__ = ["MAX_PARQUET_RATIO", "check_table_file", "load_trace"]

# uncompressed / on-disk bytes of a Parquet table beyond which it is treated as a bomb (real memlens tables
# compress 2-30x; a table of one repeated value can reach ~100x)
MAX_PARQUET_RATIO = 256


def load_trace(path, *, verify_checksums: bool = True) -> Trace:
    """Read a trace saved by `save_trace`, validating manifest, sizes, checksums and schema.

    Recovers a trace whose save was killed between its renames. Holds a shared lock of the parent
    directory while reading, so a concurrent `save_trace` to the same path is seen whole or not at all.
    Every problem raises `InputError` naming the file and what is wrong.
    """
    path = Path(path)
    settle(path)
    with dir_lock(path.parent, exclusive=False):
        return _load_locked(path, verify_checksums)


def check_table_file(fpath: Path, info: dict, mpath: Path, verify_checksums: bool = True,
                     whole_table: bool = True) -> None:
    """Sizes first (cheap, and before anything is hashed or decompressed): the file's size against the
    manifest and the limit, then the Parquet footer's row count and uncompressed size.

    `whole_table`: the table is read at once, so its whole uncompressed size must fit the limit; readers
    that go a row group at a time (the out-of-core engine) pass False and only each row group must."""
    limit = limits.max_decompressed()
    size = fpath.stat().st_size
    expected = info.get("bytes")
    if expected is not None:
        if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
            raise InputError(f"manifest entry 'bytes' of table file {fpath.name} is not a size", mpath)
        if size != expected and verify_checksums:
            raise InputError(f"file is {size} bytes, the manifest says {expected}: it was modified or "
                             "truncated (checksum mismatch)", fpath)
    if size > limit and whole_table:
        raise InputError(limits.too_big(f"table file is {size} bytes, past"), fpath)
    if size < 12:
        raise InputError("not a Parquet file (too short)", fpath)
    with open(fpath, "rb") as f:
        f.seek(size - 8)
        footer_len, magic = struct.unpack("<I4s", f.read(8))
    if magic != b"PAR1" or footer_len + 12 > size:
        raise InputError("not a Parquet file (bad footer)", fpath)
    try:
        import pyarrow.parquet as pq
        meta = pq.ParquetFile(fpath).metadata
        per_group = [max(sum(meta.row_group(i).column(j).total_uncompressed_size for j in range(meta.num_columns)),
                         meta.row_group(i).total_byte_size) for i in range(meta.num_row_groups)]
        uncompressed = sum(per_group) if whole_table else max(per_group, default=0)
        rows = meta.num_rows
        # what the rows take once decoded: at least 8 bytes per value. Run-length and dictionary encoding
        # make a column of one repeated value (or of nulls) nearly free on disk and in the footer's
        # uncompressed sizes, so a footer may claim a billion rows that read_parquet would then allocate
        group_rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        decoded = 8 * max(meta.num_columns, 1) * (sum(group_rows) if whole_table else max(group_rows, default=0))
    except Exception as exc:  # pyarrow raises many types for corrupt footers
        raise InputError(f"cannot read Parquet metadata ({type(exc).__name__}: {str(exc)[:160]})",
                         fpath) from None
    # read a row group at a time, a big table is fine; a small file that expands past the limit by a
    # factor no real table reaches is a bomb all the same
    total = sum(per_group)
    if not whole_table and total > limit and total > MAX_PARQUET_RATIO * size:
        raise InputError(limits.too_big(f"table decompresses to {total} bytes from {size} ({total // size}x; "
                                        "a decompression bomb?), past"), fpath)
    if decoded > limit:
        raise InputError(limits.too_big(f"table claims {rows:,} rows of {meta.num_columns} columns, at least "
                                        f"{decoded} bytes once read, past"), fpath)
    if uncompressed > limit:
        raise InputError(limits.too_big(f"{'table' if whole_table else 'a row group'} decompresses to "
                                         f"{uncompressed} bytes, past"), fpath)
    if "rows" in info and rows != info["rows"]:
        raise InputError(f"has {rows} rows, manifest says {info['rows']}", fpath)


def _load_locked(path: Path, verify_checksums: bool) -> Trace:
    if not path.exists():
        raise InputError("no such file or directory", path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise InputError("not a memlens trace directory (no manifest.json)", path)
    try:
        if mpath.stat().st_size > (64 << 20):
            raise InputError("manifest is larger than 64 MiB; not a memlens manifest", mpath)
        manifest = json.loads(mpath.read_bytes())
        limits.check_nesting(manifest, mpath)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"manifest is not valid JSON ({type(exc).__name__})", mpath) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise InputError("manifest is not a memlens trace manifest", mpath)
    version = manifest.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise InputError(f"unsupported schema version {version!r} (this memlens reads 1..{SCHEMA_VERSION}; "
                         "upgrade memlens to read newer traces)", mpath)
    tables_info = manifest.get("tables")
    if not isinstance(tables_info, dict):
        raise InputError("manifest has no 'tables' entry", mpath)
    metadata = manifest.get("metadata") or {}
    check_metadata(metadata, mpath)
    frames = {}
    for name, info in tables_info.items():
        if name not in SCHEMA:
            raise InputError(f"manifest names an unknown table '{name}'", mpath)
        if not isinstance(info, dict) or not isinstance(info.get("file"), str) or "/" in info["file"] \
                or "\\" in info["file"] or info["file"].startswith(".") or "\0" in info["file"]:
            raise InputError(f"manifest entry for table '{name}' is malformed", mpath)
        if "rows" in info and (isinstance(info["rows"], bool) or not isinstance(info["rows"], int)
                               or info["rows"] < 0):
            raise InputError(f"manifest entry 'rows' of table '{name}' is not a row count", mpath)
        if info.get("sha256") is not None and not isinstance(info["sha256"], str):
            raise InputError(f"manifest entry 'sha256' of table '{name}' is not a string", mpath)
        fpath = path / info["file"]
        if not fpath.is_file():
            raise InputError("table file is missing (manifest lists it)", fpath)
        check_table_file(fpath, info, mpath, verify_checksums)
        if verify_checksums and info.get("sha256") and file_sha256(fpath) != info["sha256"]:
            raise InputError("checksum mismatch: the file was modified or is corrupt", fpath)
        try:
            df = pd.read_parquet(fpath, engine="pyarrow")
        except MemoryError:
            raise InputError("Parquet table is too large for the memory available", fpath) from None
        except Exception as exc:  # pyarrow raises many types for corrupt files
            raise InputError(f"cannot read Parquet table ({type(exc).__name__}: {str(exc)[:200]})",
                             fpath) from None
        if "rows" in info and len(df) != info["rows"]:
            raise InputError(f"has {len(df)} rows, manifest says {info['rows']}", fpath)
        try:
            frames[name] = conform(name, df, strict=True)
        except InputError as exc:
            raise InputError(exc.message, fpath) from None
    for name in REQUIRED_TABLES:
        if name not in frames:
            raise InputError(f"manifest lacks the required table '{name}'", mpath)
    trace = Trace(blocks=frames["blocks"], accesses=frames["accesses"], ops=frames["ops"],
                  metadata=metadata, **{k: frames.get(k) for k in OPTIONAL_TABLES})
    try:
        validate_trace(trace)
    except InputError as exc:
        raise InputError(exc.message, path) from None
    return trace
