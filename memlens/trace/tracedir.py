"""The ``NAME.memlens/`` directory on disk: its layout, and how a trace is written into it atomically.

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
parent directory. Where the kernel and file system can (Linux ``renameat2(RENAME_EXCHANGE)``: ext4, xfs,
btrfs, tmpfs), the swap is one atomic exchange of the two directories, so ``NAME`` is there at every
instant, holding the old trace or the new one, and the old one (now under the temporary name) is removed
after. Elsewhere the old trace is renamed to ``.NAME.<pid>.<random>.old``, the new one to ``NAME``, and
the old one removed; a reader that finds ``NAME`` missing then waits for the lock (`settle`). Readers hold a shared lock of the same directory for the whole load, so a reader
sees the old trace or the new one, never a mix or nothing; writers never share a temporary name. A save
killed between the two renames is recovered by the next load or save: the complete new trace (its
manifest is written last) or else the old one is renamed back to ``NAME``. Temporary directories of
writers that are no longer running are removed. Saved traces get the permissions the umask allows
(like any file the user creates), not ``drwx------``.

Writing needs only the table schema, not the `memlens.trace.Trace` class, so this module sits below it and
`Trace.save` calls `save_trace` here without a loop; reading back into a Trace is `memlens.trace.read`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.errors import InputError
from memlens.trace.schema import OPTIONAL_TABLES, REQUIRED_TABLES, SCHEMA_VERSION, conform

MANIFEST = "manifest.json"
FORMAT_NAME = "memlens-trace"


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of the file at `path`, read 1 MiB at a time (the manifest's ``sha256`` of each table)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def jsonable(obj):
    """Metadata must survive JSON: turn numpy scalars and other oddities into plain values."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
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
def dir_lock(directory: Path, exclusive: bool):
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
    """The process's umask: read from /proc (no change to it, so safe beside other threads), else set and
    restored (where there is no /proc, or it cannot be read)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass      # no /proc here: the set-and-restore below answers
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


def settle(path) -> None:
    """Before reading `path`: when it is missing or a save's leftovers of a dead writer lie beside it,
    wait for any swap in progress (the exclusive lock) and undo a save killed between its renames, so
    that a reader never reports "no such file" for a trace being re-saved or whose save was killed."""
    path = Path(path)
    leftovers = _siblings(path, ".old") + _siblings(path, ".tmp")
    if not leftovers or (path.exists() and all(_owner_alive(p, path) for p in leftovers)):
        return
    with dir_lock(path.parent, exclusive=True):
        _recover(path)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directories `a` and `b` in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where
    the system or the file system cannot (the caller then renames twice)."""
    import ctypes
    import errno
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


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


def save_trace(trace, path, *, overwrite: bool = False) -> Path:
    """Write `trace` (a `memlens.trace.Trace`: its ``table(name)`` and ``metadata``) to the directory `path`
    atomically; returns the final path.

    Raises `InputError` if `path` exists and is not a memlens trace, or exists and `overwrite` is False,
    or its directory cannot be written.
    """
    tables = ((name, trace.table(name)) for name in REQUIRED_TABLES + OPTIONAL_TABLES)
    return save_tables(path, lambda: trace.metadata, tables, overwrite=overwrite)


def save_tables(path, metadata, tables, *, overwrite: bool = False, rows_per_group: int | None = None) -> Path:
    """Write tables to the trace directory `path` atomically (as `save_trace`); returns the final path.

    `tables`: (name, value) pairs, written in that order; a value is a DataFrame (written in row groups of
    `rows_per_group` rows, default `ROWS_PER_GROUP`), an iterator of DataFrames (each conformed and written
    as one row group as it comes, so a table bigger than memory is never held: the recorder's streaming
    save), or None (no such table). `metadata`: the manifest's metadata, or a function returning it, called
    after every table is written (a streaming writer learns some of it from the tables).
    """
    path = Path(path)
    rows_per_group = int(rows_per_group or ROWS_PER_GROUP)
    if not path.exists() and any(_siblings(path, ".old")):
        with dir_lock(path.parent, exclusive=True):
            _recover(path)
    if path.is_symlink() and not path.exists():
        raise InputError("is a symbolic link to nothing; refusing to replace it", path)
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
        written = {}
        for name, value in tables:
            if value is None:
                continue
            fname = f"{name}.parquet"
            if isinstance(value, pd.DataFrame):
                df = conform(name, value)
                groups = write_table(df, tmp / fname, rows_per_group)
                rows, per_group, ordered = len(df), rows_per_group, name == "accesses" and _time_ordered(df)
            else:
                rows, groups, per_group, ordered = write_chunks(name, value, tmp / fname)
            with open(tmp / fname, "rb") as f:
                os.fsync(f.fileno())
            written[name] = {"file": fname, "rows": int(rows), "bytes": (tmp / fname).stat().st_size,
                             "sha256": file_sha256(tmp / fname), "row_groups": groups, "rows_per_group": per_group}
            if ordered:
                written[name]["sorted_by"] = "t_ns"  # each row group one time range: the dask engine uses it
        meta = metadata() if callable(metadata) else metadata
        manifest = {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION,
                    "metadata": jsonable(meta), "tables": written}
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        with dir_lock(path.parent, exclusive=True):
            _recover(path)
            if path.exists():
                if not overwrite:  # another writer created it meanwhile
                    raise InputError("already exists (pass overwrite=True to replace it)", path)
                if _exchange(tmp, path):  # one step: `path` never missing; `tmp` now holds the old trace
                    old = tmp
                else:
                    # two steps: move the old one aside (a unique name) so that a crash never leaves no
                    # trace at all; readers that find `path` missing wait for this lock (`settle`)
                    old = tmp.with_suffix(".old")
                    os.replace(path, old)
                    os.replace(tmp, path)
            else:
                old = None
                os.replace(tmp, path)
            _fsync_dir(path.parent)
        if old is not None:
            _remove(old)
    except BaseException:
        _remove(tmp)
        raise
    return path


def _remove(entry: Path) -> None:
    """Remove a directory tree, or the symbolic link an exchange left in its place (replacing a trace whose
    path was a link leaves the link under the temporary name; rmtree refuses links)."""
    if entry.is_symlink():
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
    else:
        shutil.rmtree(entry, ignore_errors=True)


def write_chunks(name: str, chunks, fpath: Path) -> tuple[int, int, int, bool]:
    """Write the DataFrames of the iterator `chunks` to the Parquet file `fpath` as table `name`, one row
    group per non-empty chunk, each conformed and converted to Arrow alone; returns (rows, row groups, rows
    of the largest group, whether t_ns never decreases (accesses only))."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    writer, schema = None, None
    rows = groups = largest = 0
    ordered, last_t = name == "accesses", None
    try:
        for chunk in chunks:
            if chunk is None or len(chunk) == 0:
                continue
            df = conform(name, chunk)
            if ordered:
                t = df["t_ns"].to_numpy(dtype=np.int64)
                ordered = bool((t[1:] >= t[:-1]).all()) and (last_t is None or t[0] >= last_t)
                last_t = int(t[-1])
            if writer is None:
                schema = pa.Schema.from_pandas(df, preserve_index=False)
                writer = pq.ParquetWriter(fpath, schema)
            part = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
            writer.write_table(part, row_group_size=len(df))
            rows, groups, largest = rows + len(df), groups + 1, max(largest, len(df))
            del part, df
        if writer is None:   # no rows: one empty group, as write_table writes an empty table
            return 0, write_table(conform(name, None), fpath), ROWS_PER_GROUP, ordered
    finally:
        if writer is not None:
            writer.close()
    return rows, groups, largest, ordered


def _fsync_dir(directory: Path) -> None:
    """Flush a directory's entries (a rename made durable); best effort: some file systems refuse it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass      # a file system without directory fsync: the rename itself was atomic, only its durability waits
    finally:
        os.close(fd)


def is_trace_dir(path) -> bool:
    """True when `path` looks like a saved memlens trace directory."""
    return (Path(path) / MANIFEST).is_file()
