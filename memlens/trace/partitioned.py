"""Writing big traces in pieces: the same ``NAME.memlens/`` layout as `memlens.trace.tracedir`, written row
group by row group as the data arrives, so a trace larger than memory is never materialised.

A trace written here is an ordinary memlens trace (`memlens.load` reads it whole when it fits in memory);
what it adds is a promise the out-of-core engine (`memlens.analysis.outofcore`) relies on: the
``accesses`` table is in time order (``t_ns`` non-decreasing), so each Parquet row group covers one time
range. The manifest records it (``"sorted_by": "t_ns"``, and ``"row_groups"``, ``"rows_per_group"`` per
table). Parquet keeps each row group's min/max per column, so a reader finds the time range of every
piece without reading it.

    with PartitionedTraceWriter("big.memlens", metadata={"source_kind": "memlens"}) as w:
        for chunk in chunks:                 # any number, any size
            w.add("blocks", chunk.blocks)    # tables may be interleaved
            w.add("accesses", chunk.accesses)  # time-ordered across chunks
            w.add("ops", chunk.ops)

Writes are atomic like `tracedir.save_trace`: everything goes to a hidden sibling directory that is renamed
into place by `close()`; an exception inside the ``with`` block discards it and leaves nothing behind.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.errors import InputError
from memlens.trace.schema import OPTIONAL_TABLES, REQUIRED_TABLES, SCHEMA, SCHEMA_VERSION, conform

DEFAULT_ROWS_PER_GROUP = 1 << 20  # 1 Mi rows: ~25 MB of accesses per piece in memory


class PartitionedTraceWriter:
    """Write a trace table by table in row groups of `rows_per_group` rows, never holding more than one
    row group per table in memory. `close()` (or leaving the ``with`` block) writes the manifest and
    renames the directory into place; returns the path."""

    def __init__(self, path, metadata: dict | None = None, *, rows_per_group: int = DEFAULT_ROWS_PER_GROUP,
                 overwrite: bool = False):
        if rows_per_group < 1:
            raise InputError(f"rows_per_group must be at least 1, got {rows_per_group}")
        from memlens.trace.tracedir import MANIFEST
        self.path = Path(path)
        if self.path.exists():
            if not overwrite:
                raise InputError("already exists (pass overwrite=True to replace it)", self.path)
            if not (self.path / MANIFEST).is_file():
                raise InputError("exists and is not a memlens trace; refusing to replace it", self.path)
        self.metadata = dict(metadata or {})
        self.rows_per_group = int(rows_per_group)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent))
        self._writers: dict = {}     # table -> pyarrow.parquet.ParquetWriter
        self._schemas: dict = {}     # table -> pyarrow schema of the first chunk
        self._pending: dict[str, list[pd.DataFrame]] = {}
        self._pending_rows: dict[str, int] = {}
        self._rows: dict[str, int] = {}
        self._groups: dict[str, int] = {}
        self._last_t: int | None = None
        self._devices: set[str] = set()
        self._empty: dict[str, pd.DataFrame] = {}  # table -> the first empty frame added (its columns)
        self._closed = False

    # ---- writing ------------------------------------------------------------------------------
    def add(self, table: str, df: pd.DataFrame) -> None:
        """Append rows to `table` (a name in `memlens.trace.SCHEMA`); columns are conformed to the
        schema. Accesses must arrive in time order, across calls too (`InputError` otherwise)."""
        if self._closed:
            raise InputError("the writer is closed", self.path)
        if table not in SCHEMA:
            raise InputError(f"unknown table '{table}'", self.path)
        if df is None or len(df) == 0:
            self._rows.setdefault(table, 0)
            if df is not None and table not in self._empty:  # its columns, should no row ever come
                self._empty[table] = conform(table, df)
            return
        df = conform(table, df)
        if table == "accesses":
            t = df["t_ns"].to_numpy(dtype=np.int64)
            if np.any(t[1:] < t[:-1]) or (self._last_t is not None and t[0] < self._last_t):
                raise InputError("accesses must be added in time order (t_ns non-decreasing)", self.path)
            self._last_t = int(t[-1])
        if table == "blocks":
            self._devices.update(df["device"].astype(str).unique().tolist())
        self._pending.setdefault(table, []).append(df)
        self._pending_rows[table] = self._pending_rows.get(table, 0) + len(df)
        self._rows[table] = self._rows.get(table, 0) + len(df)
        while self._pending_rows[table] >= self.rows_per_group:
            self._flush(table, self.rows_per_group)

    def flush(self, table: str) -> None:
        """Write the rows of `table` added so far as a row group now (a short one), freeing them before
        the caller moves on to other work."""
        if table in self._pending_rows:
            self._flush(table)

    def _flush(self, table: str, rows: int | None = None) -> None:
        """Write the first `rows` pending rows of `table` (all when None) as one row group."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        frames = self._pending.get(table) or []
        if not frames:
            return
        pending = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        rows = len(pending) if rows is None else rows
        head, rest = pending.iloc[:rows], pending.iloc[rows:]
        self._pending[table] = [rest.reset_index(drop=True)] if len(rest) else []
        self._pending_rows[table] = len(rest)
        if table not in self._writers:
            arrow = pa.Table.from_pandas(head, preserve_index=False)
            self._schemas[table] = arrow.schema
            # dictionary encoding for the text columns only: Parquet's dictionary for an integer column with
            # many distinct values costs ~5x the row group in hash tables while it is written (measured:
            # +53 MB for 128Ki event rows, +3 MB without it) and is abandoned as too large anyway
            text = [f.name for f in arrow.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
            self._writers[table] = pq.ParquetWriter(self._tmp / f"{table}.parquet", arrow.schema,
                                                    use_dictionary=text)
        else:
            try:
                arrow = pa.Table.from_pandas(head, schema=self._schemas[table], preserve_index=False)
            except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as exc:
                raise InputError(f"table '{table}': a chunk does not match the first one's columns ({exc})",
                                 self.path) from None
        self._writers[table].write_table(arrow, row_group_size=len(head))
        self._groups[table] = self._groups.get(table, 0) + 1

    # ---- finishing ----------------------------------------------------------------------------
    def close(self) -> Path:
        """Flush, write the manifest and move the trace into place atomically; returns its path."""
        from memlens.trace.tracedir import FORMAT_NAME, MANIFEST, jsonable, file_sha256
        if self._closed:
            return self.path
        for name in REQUIRED_TABLES:
            self._rows.setdefault(name, 0)
        tables = {}
        for name in list(self._rows):
            self._flush(name)
            if name in self._writers:
                self._writers[name].close()
            else:  # an empty table still gets its (empty) file, as tracedir.save_trace writes it
                self._empty.get(name, conform(name, None)).to_parquet(self._tmp / f"{name}.parquet", index=False, engine="pyarrow")
            fname = f"{name}.parquet"
            tables[name] = {"file": fname, "rows": int(self._rows[name]), "sha256": file_sha256(self._tmp / fname),
                            "row_groups": int(self._groups.get(name, 0)), "rows_per_group": self.rows_per_group}
        tables["accesses"]["sorted_by"] = "t_ns"
        meta = {"schema_version": SCHEMA_VERSION, "source_kind": "unknown", "notes": []}
        meta.update(self.metadata)
        meta.setdefault("devices", sorted(self._devices))
        manifest = {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION, "metadata": jsonable(meta),
                    "tables": tables}
        with open(self._tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        if self.path.exists():
            old = self.path.with_name(f".{self.path.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(self.path, old)
            os.replace(self._tmp, self.path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self._tmp, self.path)
        self._closed = True
        return self.path

    def abort(self) -> None:
        """Discard everything written so far (the target path is left as it was)."""
        for w in self._writers.values():
            try:
                w.close()
            except Exception:  # already failing: the directory is removed below anyway
                pass
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False


def save_partitioned(trace, path, *, rows_per_group: int = DEFAULT_ROWS_PER_GROUP,
                     overwrite: bool = False) -> Path:
    """Save an in-memory `trace` with its accesses in time order and every table in row groups of
    `rows_per_group` rows, ready for the out-of-core engine. Accesses not already in time order are
    sorted by (t_ns, op_id), the order the in-memory ATI analysis groups them in."""
    acc = trace.accesses
    t = acc["t_ns"].to_numpy(dtype=np.int64)
    if len(t) > 1 and np.any(t[1:] < t[:-1]):
        acc = acc.iloc[np.lexsort((acc["op_id"].to_numpy(), t))].reset_index(drop=True)
    with PartitionedTraceWriter(path, trace.metadata, rows_per_group=rows_per_group, overwrite=overwrite) as w:
        for name in REQUIRED_TABLES + OPTIONAL_TABLES:
            df = acc if name == "accesses" else trace.table(name)
            if df is None:
                continue
            for lo in range(0, max(len(df), 1), rows_per_group):
                w.add(name, df.iloc[lo:lo + rows_per_group])
    return Path(path)
