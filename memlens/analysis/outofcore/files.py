"""A saved trace opened without reading it: its manifest, its Parquet files and their row groups.

Every reader of the out-of-core engine goes through `TraceFiles`, which validates the manifest the same way
`memlens.trace.read.load_trace` does (and raises `InputError` naming the file) but reads table data only a
row group at a time, on whichever worker asks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.errors import InputError
from memlens.trace import REQUIRED_TABLES, SCHEMA, SCHEMA_VERSION, conform

TIME_COLUMNS = {"blocks": ("alloc_ns", "free_ns"), "accesses": ("t_ns",), "ops": ("start_ns", "end_ns"),
                "events": ("t_ns",)}


@dataclass
class TraceFiles:
    """The files of a ``.memlens`` directory. Picklable (paths and small numbers only), so it travels to
    dask workers, which open the Parquet files themselves."""

    path: str
    metadata: dict
    rows: dict[str, int]
    files: dict[str, str]
    row_groups: dict[str, list[int]] = field(default_factory=dict)  # rows of each row group, per table
    accesses_sorted: bool = False

    @classmethod
    def open(cls, path) -> "TraceFiles":
        """Read and check the manifest of the trace directory `path` (no table data is read). Holds the
        shared lock of its folder meanwhile, as `load_trace` does, so that a concurrent save is seen whole
        (the tables read later are read as they are then)."""
        from memlens.trace.tracedir import dir_lock, settle
        path = Path(path)
        settle(path)  # a save in progress or killed: wait for it / recover it
        with dir_lock(path.parent, exclusive=False):
            return cls._open_locked(path)

    @classmethod
    def _open_locked(cls, path: Path) -> "TraceFiles":
        import pyarrow.parquet as pq
        from memlens.trace.checks import check_metadata
        from memlens.trace.read import check_table_file
        from memlens.trace.tracedir import FORMAT_NAME, MANIFEST
        if not path.exists():
            raise InputError("no such file or directory", path)
        mpath = path / MANIFEST
        if not mpath.is_file():
            raise InputError("the out-of-core engine reads saved memlens traces (a NAME.memlens directory); "
                             "convert this file with `memlens import` first", path)
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"manifest is not valid JSON ({exc})", mpath) from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
            raise InputError("manifest is not a memlens trace manifest", mpath)
        version = manifest.get("schema_version")
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
            raise InputError(f"unsupported schema version {version!r}", mpath)
        tables = manifest.get("tables")
        if not isinstance(tables, dict):
            raise InputError("manifest has no 'tables' entry", mpath)
        rows, files, groups = {}, {}, {}
        for name, info in tables.items():
            if name not in SCHEMA:
                raise InputError(f"manifest names an unknown table '{name}'", mpath)
            fname = info.get("file") if isinstance(info, dict) else None
            if not isinstance(fname, str) or "/" in fname or "\\" in fname or fname.startswith("."):
                raise InputError(f"manifest entry for table '{name}' is malformed", mpath)
            fpath = path / fname
            if not fpath.is_file():
                raise InputError("table file is missing (manifest lists it)", fpath)
            # sizes against the manifest and footers against the limit, per row group (read one at a time)
            check_table_file(fpath, info, mpath, whole_table=False)
            try:
                meta = pq.ParquetFile(fpath).metadata
            except Exception as exc:  # pyarrow raises many types for corrupt files
                raise InputError(f"cannot read Parquet table ({type(exc).__name__}: {exc})", fpath) from None
            if "rows" in info and meta.num_rows != info["rows"]:
                raise InputError(f"has {meta.num_rows} rows, manifest says {info['rows']}", fpath)
            rows[name] = int(meta.num_rows)
            files[name] = str(fpath)
            groups[name] = [int(meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
        check_metadata(manifest.get("metadata") or {}, mpath)
        for name in REQUIRED_TABLES:
            if name not in rows:
                raise InputError(f"manifest lacks the required table '{name}'", mpath)
        return cls(path=str(path), metadata=manifest.get("metadata") or {}, rows=rows, files=files,
                   row_groups=groups,
                   accesses_sorted=tables["accesses"].get("sorted_by") == "t_ns")

    # ---- reading pieces -----------------------------------------------------------------------
    def batches(self, table: str, target_rows: int) -> list[list[int]]:
        """Row groups of `table` gathered into consecutive batches of about `target_rows` rows."""
        out, current, n = [], [], 0
        for i, r in enumerate(self.row_groups.get(table, [])):
            if current and n + r > target_rows:
                out.append(current)
                current, n = [], 0
            current.append(i)
            n += r
        if current:
            out.append(current)
        return out

    def read(self, table: str, row_groups: list[int] | None = None, columns=None) -> pd.DataFrame:
        """Rows of `table` (the given row groups, or all), conformed to the schema when all columns are
        read; raw (selected columns) otherwise."""
        import pyarrow.parquet as pq
        fpath = self.files[table]
        try:
            pf = pq.ParquetFile(fpath)
            arrow = pf.read_row_groups(row_groups, columns=columns) if row_groups is not None \
                else pf.read(columns=columns)
        except Exception as exc:
            raise InputError(f"cannot read Parquet table ({type(exc).__name__}: {exc})", fpath) from None
        df = arrow.to_pandas()
        return _conformed(table, df, fpath) if columns is None else df

    def iter_batches(self, table: str, row_groups: list[int], batch_rows: int, columns=None):
        """The given row groups of `table` as frames of at most `batch_rows` rows (a big row group is not
        read whole), conformed to the schema when all columns are read."""
        import pyarrow.parquet as pq
        fpath = self.files[table]
        try:
            pf = pq.ParquetFile(fpath)
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=row_groups, columns=columns):
                df = batch.to_pandas()
                yield _conformed(table, df, fpath) if columns is None else df
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"cannot read Parquet table ({type(exc).__name__}: {exc})", fpath) from None

    def columns(self, table: str) -> list[str]:
        """Column names of `table` as stored."""
        import pyarrow.parquet as pq
        return list(pq.ParquetFile(self.files[table]).schema_arrow.names)

    def nbytes(self) -> int:
        """Bytes of the table files on disk."""
        return int(sum(Path(f).stat().st_size for f in self.files.values()))

    def column_range(self, table: str, column: str) -> tuple[int, int] | None:
        """(min, max) of a column over the table, from the row groups' Parquet statistics when every
        row group has them, else by reading the column a row group at a time; None when all missing."""
        import pyarrow.parquet as pq
        if table not in self.files or self.rows.get(table, 0) == 0:
            return None
        pf = pq.ParquetFile(self.files[table])
        meta = pf.metadata
        idx = pf.schema_arrow.get_field_index(column)
        lo, hi, complete = None, None, True
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(idx).statistics
            if stats is None or not stats.has_min_max:
                if stats is not None and stats.null_count == meta.row_group(g).num_rows:
                    continue  # all missing: nothing to add
                complete = False
                break
            lo = stats.min if lo is None else min(lo, stats.min)
            hi = stats.max if hi is None else max(hi, stats.max)
        if not complete:
            lo = hi = None
            for g in range(meta.num_row_groups):
                s = pf.read_row_group(g, columns=[column]).column(0).drop_null()
                if len(s):
                    values = s.to_numpy()
                    lo = int(values.min()) if lo is None else min(lo, int(values.min()))
                    hi = int(values.max()) if hi is None else max(hi, int(values.max()))
        return None if lo is None else (int(lo), int(hi))

    def time_span_ns(self) -> tuple[int, int]:
        """The trace's (first, last) timestamp over all tables, as `Trace.time_span_ns` computes it."""
        values = []
        for table, cols in TIME_COLUMNS.items():
            for c in cols:
                r = self.column_range(table, c)
                if r is not None:
                    values += list(r)
        return (min(values), max(values)) if values else (0, 0)


def empty_like(table: str) -> pd.DataFrame:
    """An empty conformed frame of `table`."""
    return conform(table, None)


def as_int64(values) -> np.ndarray:
    """A column as int64 numpy (the schema guarantees integers)."""
    return np.asarray(values, dtype=np.int64)


def _conformed(table: str, df, fpath):
    """`df` conformed to `table`'s schema; a mismatch is bad input naming the file."""
    try:
        return conform(table, df, strict=True)
    except InputError as exc:
        raise InputError(exc.message, fpath) from None
