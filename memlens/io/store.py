"""Saving and loading traces: a ``NAME.memlens/`` directory of Parquet tables plus ``manifest.json``.

Layout::

    NAME.memlens/
        manifest.json      {"format": "memlens-trace", "schema_version": 1, "metadata": {...},
                            "tables": {"blocks": {"file": "blocks.parquet", "rows": N, "sha256": ...}}}
        blocks.parquet  accesses.parquet  ops.parquet  [segments|segment_blocks|events|stacks].parquet

Each table is a plain Parquet file, so other tools read it directly, e.g.
``pandas.read_parquet("run.memlens/blocks.parquet")``, DuckDB's
``SELECT * FROM 'run.memlens/accesses.parquet'`` or ``dask.dataframe.read_parquet(...)``.

Writes are atomic: everything goes to a hidden sibling directory with a unique name
(``.NAME.<pid>.<random>.tmp``), fsynced, and is then swapped into place under an exclusive `flock` of the
parent directory: the old trace is renamed to ``.NAME.<pid>.<random>.old``, the new one to ``NAME``, and
the old one removed. Readers hold a shared lock of the same directory for the whole load, so a reader
sees the old trace or the new one, never a mix or nothing; writers never share a temporary name. A save
killed between the two renames is recovered by the next load or save: the complete new trace (its
manifest is written last) or else the old one is renamed back to ``NAME``. Temporary directories of
writers that are no longer running are removed. Saved traces get the permissions the umask allows
(like any file the user creates), not ``drwx------``.

Loading checks sizes before it reads or hashes anything: each table file's size against the manifest's
``bytes`` and `memlens.limits.max_decompressed`, and the Parquet footer's uncompressed size and row count
against the limit and the manifest.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import struct
from pathlib import Path

import numpy as np
import pandas as pd

from memlens import limits
from memlens.errors import InputError
from memlens.trace import OPTIONAL_TABLES, REQUIRED_TABLES, SCHEMA, SCHEMA_VERSION, Trace, conform

MANIFEST = "manifest.json"
# uncompressed / on-disk bytes of a Parquet table beyond which it is treated as a bomb (real memlens tables
# compress 2-30x; a table of one repeated value can reach ~100x)
MAX_PARQUET_RATIO = 256
FORMAT_NAME = "memlens-trace"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _jsonable(obj):
    """Metadata must survive JSON: turn numpy scalars and other oddities into plain values."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


@contextlib.contextmanager
def _dir_lock(directory: Path, exclusive: bool):
    """flock of `directory` (shared for readers, exclusive for the swap); a no-op where flock is missing
    or the directory cannot be opened (then no writer can swap there either)."""
    try:
        import fcntl
        fd = os.open(directory, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _siblings(path: Path, suffix: str) -> list[Path]:
    """Hidden siblings ``.NAME.<pid>.<token><suffix>`` of `path`."""
    prefix = f".{path.name}."
    try:
        return [p for p in path.parent.iterdir() if p.name.startswith(prefix) and p.name.endswith(suffix)]
    except OSError:
        return []


def _owner_alive(sibling: Path, path: Path) -> bool:
    pid = sibling.name[len(path.name) + 2:].split(".", 1)[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _recover(path: Path) -> None:
    """Undo a save that was killed between its renames (call with the exclusive lock held): when `path`
    is missing, rename back the complete new trace of a dead writer, else the old trace. Then remove
    the leftovers of dead writers."""
    if not path.exists():
        done = [p for p in _siblings(path, ".tmp") if (p / MANIFEST).is_file() and not _owner_alive(p, path)]
        old = [p for p in _siblings(path, ".old") if (p / MANIFEST).is_file()]
        for candidate in sorted(done, key=lambda p: p.stat().st_mtime, reverse=True) + old:
            try:
                os.replace(candidate, path)
                break
            except OSError:
                continue
    for leftover in _siblings(path, ".tmp") + _siblings(path, ".old"):
        if not _owner_alive(leftover, path) or leftover.name.endswith(".old"):
            shutil.rmtree(leftover, ignore_errors=True)


ROWS_PER_GROUP = 1 << 20  # rows per Parquet row group (and per slice converted to Arrow at once)


def write_table(df: pd.DataFrame, fpath: Path, rows_per_group: int = ROWS_PER_GROUP) -> int:
    """Write a conformed table to the Parquet file `fpath` a row group at a time; returns the row-group
    count. Only one slice of `rows_per_group` rows is converted to Arrow at once, so saving a big trace
    needs a slice's worth of memory beside the trace, not a second copy of every table."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    # the schema from the whole frame (a column at a time), so a slice whose strings are all missing still
    # gets the string type
    schema = pa.Schema.from_pandas(df, preserve_index=False)
    groups = 0
    with pq.ParquetWriter(fpath, schema) as writer:
        if len(df) == 0:
            writer.write_table(pa.Table.from_pandas(df, schema=schema, preserve_index=False))
            return 1
        for lo in range(0, len(df), rows_per_group):
            part = pa.Table.from_pandas(df.iloc[lo:lo + rows_per_group], schema=schema, preserve_index=False)
            writer.write_table(part, row_group_size=rows_per_group)
            groups += 1
            del part
    return groups


def _time_ordered(accesses: pd.DataFrame) -> bool:
    t = accesses["t_ns"].to_numpy(dtype=np.int64)
    return bool(len(t) < 2 or (t[1:] >= t[:-1]).all())


def save_trace(trace: Trace, path, *, overwrite: bool = False) -> Path:
    """Write `trace` to the directory `path` atomically; returns the final path.

    Raises `InputError` if `path` exists and is not a memlens trace, or exists and `overwrite` is False,
    or its directory cannot be written.
    """
    path = Path(path)
    if not path.exists() and any(_siblings(path, ".old")):
        with _dir_lock(path.parent, exclusive=True):
            _recover(path)
    if path.exists():
        if not overwrite:
            raise InputError("already exists (pass overwrite=True to replace it)", path)
        if not (path / MANIFEST).is_file():
            raise InputError("exists and is not a memlens trace; refusing to replace it", path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
        tmp.mkdir(mode=0o777 & ~_umask())
    except OSError as exc:
        raise InputError(f"cannot write here ({exc.strerror or exc})", path) from None
    try:
        tables = {}
        for name in REQUIRED_TABLES + OPTIONAL_TABLES:
            df = trace.table(name)
            if df is None:
                continue
            df = conform(name, df)
            fname = f"{name}.parquet"
            groups = write_table(df, tmp / fname, ROWS_PER_GROUP)
            with open(tmp / fname, "rb") as f:
                os.fsync(f.fileno())
            tables[name] = {"file": fname, "rows": int(len(df)), "bytes": (tmp / fname).stat().st_size,
                            "sha256": _sha256(tmp / fname), "row_groups": groups,
                            "rows_per_group": ROWS_PER_GROUP}
            if name == "accesses" and _time_ordered(df):
                tables[name]["sorted_by"] = "t_ns"  # each row group one time range: the dask engine uses it
        manifest = {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION,
                    "metadata": _jsonable(trace.metadata), "tables": tables}
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        with _dir_lock(path.parent, exclusive=True):
            _recover(path)
            if path.exists():
                if not overwrite:  # another writer created it meanwhile
                    raise InputError("already exists (pass overwrite=True to replace it)", path)
                # swap: move the old one aside (a unique name) so that a crash never leaves no trace at all
                old = tmp.with_suffix(".old")
                os.replace(path, old)
                os.replace(tmp, path)
            else:
                old = None
                os.replace(tmp, path)
            _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_trace_dir(path) -> bool:
    """True when `path` looks like a saved memlens trace directory."""
    return (Path(path) / MANIFEST).is_file()


def load_trace(path, *, verify_checksums: bool = True) -> Trace:
    """Read a trace saved by `save_trace`, validating manifest, sizes, checksums and schema.

    Recovers a trace whose save was killed between its renames. Holds a shared lock of the parent
    directory while reading, so a concurrent `save_trace` to the same path is seen whole or not at all.
    Every problem raises `InputError` naming the file and what is wrong.
    """
    path = Path(path)
    leftovers = _siblings(path, ".old") + _siblings(path, ".tmp")
    if leftovers and (not path.exists() or not all(_owner_alive(p, path) for p in leftovers)):
        with _dir_lock(path.parent, exclusive=True):
            _recover(path)
    with _dir_lock(path.parent, exclusive=False):
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
    except Exception as exc:  # pyarrow raises many types for corrupt footers
        raise InputError(f"cannot read Parquet metadata ({type(exc).__name__}: {str(exc)[:160]})",
                         fpath) from None
    # read a row group at a time, a big table is fine; a small file that expands past the limit by a
    # factor no real table reaches is a bomb all the same
    total = sum(per_group)
    if not whole_table and total > limit and total > MAX_PARQUET_RATIO * size:
        raise InputError(limits.too_big(f"table decompresses to {total} bytes from {size} ({total // size}x; "
                                        "a decompression bomb?), past"), fpath)
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
        if verify_checksums and info.get("sha256") and _sha256(fpath) != info["sha256"]:
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


# metadata keys memlens itself reads, with the types it needs
_METADATA_TYPES = {
    "source_kind": str, "source_path": str, "name": str, "notes": list, "devices": list, "clock": (dict, str),
    "t0_unix_ns": int, "schema_version": int, "iteration_source": str, "stop_reason": str,
    "allocator_settings": dict,
}


def check_metadata(metadata, where) -> None:
    """Raise `InputError` when trace metadata is not a dict or a key memlens reads has the wrong type."""
    if not isinstance(metadata, dict):
        raise InputError(f"metadata must be a JSON object, not {type(metadata).__name__}", where)
    for key, kind in _METADATA_TYPES.items():
        value = metadata.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kind):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise InputError(f"metadata '{key}' must be a {names}, not {type(value).__name__}", where)
        if kind is list and key in ("notes", "devices") and not all(isinstance(v, str) for v in value):
            raise InputError(f"metadata '{key}' must be a list of strings", where)
    clock = metadata.get("clock")
    if isinstance(clock, dict) and clock.get("kind") not in (None, "host", "cuda", "modeled"):
        raise InputError(f"metadata clock kind {clock.get('kind')!r} is not host, cuda or modeled", where)


# times and sizes beyond these are garbage (a float that overflowed int64, NaN cast to an integer) and
# would overflow int64 arithmetic in sums and differences: 2**62 ns is 146 years, 2**56 bytes 64 PiB
_MAX_ABS_NS = 1 << 62
_MAX_SIZE = 1 << 56
_TIME_COLUMNS = {"blocks": ("alloc_ns", "free_ns", "free_requested_ns"), "accesses": ("t_ns",),
                 "ops": ("start_ns", "end_ns"), "events": ("t_ns",)}
_SIZE_COLUMNS = {"blocks": ("size",), "segments": ("total_size", "allocated_size", "active_size",
                                                    "requested_size"),
                 "segment_blocks": ("size", "requested_size"), "events": ("size",)}


def _column_values(trace: Trace, spec: dict):
    """(table, column, values as float64 with NA as 0) of each non-empty column named in `spec`."""
    for table, columns in spec.items():
        df = trace.table(table)
        for col in columns:
            if df is None or col not in df.columns or not len(df):
                continue
            yield table, col, pd.to_numeric(df[col], errors="coerce").to_numpy(dtype="float64", na_value=0.0)


def _check_ranges(trace: Trace) -> None:
    for table, col, values in _column_values(trace, _TIME_COLUMNS):
        if not np.isfinite(values).all() or (np.abs(values) >= _MAX_ABS_NS).any():
            raise InputError(f"{table}: {col} has a time that is not finite or beyond 2**62 ns "
                             "(NaN, inf or an overflowed value)")
    for table, col, values in _column_values(trace, _SIZE_COLUMNS):
        if (values < 0).any():
            raise InputError(f"{table}: negative {col.replace('_', ' ')}")
        if (values >= _MAX_SIZE).any() or not np.isfinite(values).all():
            raise InputError(f"{table}: a {col.replace('_', ' ')} is 2**56 bytes (64 PiB) or more")
    if float(trace.blocks["size"].to_numpy(dtype="float64").sum()) >= _MAX_ABS_NS:
        raise InputError("blocks: sizes add up past 2**62 bytes; byte sums would overflow")


def validate_trace(trace: Trace) -> None:
    """Raise `InputError` if the trace is internally inconsistent, or holds times or sizes that are
    not finite, negative (sizes), or so large that int64 sums overflow."""
    b = trace.blocks
    if b["block_id"].duplicated().any():
        raise InputError("blocks: block_id values are not unique")
    _check_ranges(trace)
    both = b["alloc_ns"].notna() & b["free_ns"].notna()
    if (b.loc[both, "free_ns"] < b.loc[both, "alloc_ns"]).any():
        raise InputError("blocks: a block is freed before it is allocated")
    a = trace.accesses
    if len(a):
        known = np.isin(a["block_id"].to_numpy(), b["block_id"].to_numpy())
        if not known.all():
            raise InputError(f"accesses: {int((~known).sum())} rows name a block_id not in blocks")
