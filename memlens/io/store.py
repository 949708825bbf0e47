"""Saving and loading traces: a ``NAME.memlens/`` directory of Parquet tables plus ``manifest.json``.

Layout::

    NAME.memlens/
        manifest.json      {"format": "memlens-trace", "schema_version": 1, "metadata": {...},
                            "tables": {"blocks": {"file": "blocks.parquet", "rows": N, "sha256": ...}}}
        blocks.parquet  accesses.parquet  ops.parquet  [segments|segment_blocks|events|stacks].parquet

Each table is a plain Parquet file, so other tools read it directly, e.g.
``pandas.read_parquet("run.memlens/blocks.parquet")``, DuckDB's
``SELECT * FROM 'run.memlens/accesses.parquet'`` or ``dask.dataframe.read_parquet(...)``.

Writes are atomic: everything goes to a hidden sibling directory that is renamed into place, so an
interrupted save leaves either the old trace or the new one, never half of one.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.errors import InputError
from memlens.trace import OPTIONAL_TABLES, REQUIRED_TABLES, SCHEMA, SCHEMA_VERSION, Trace, conform

MANIFEST = "manifest.json"
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


def save_trace(trace: Trace, path, *, overwrite: bool = False) -> Path:
    """Write `trace` to the directory `path` atomically; returns the final path.

    Raises `InputError` if `path` exists and is not a memlens trace, or exists and `overwrite` is False.
    """
    path = Path(path)
    if path.exists():
        if not overwrite:
            raise InputError("already exists (pass overwrite=True to replace it)", path)
        if not (path / MANIFEST).is_file():
            raise InputError("exists and is not a memlens trace; refusing to replace it", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        tables = {}
        for name in REQUIRED_TABLES + OPTIONAL_TABLES:
            df = trace.table(name)
            if df is None:
                continue
            df = conform(name, df)
            fname = f"{name}.parquet"
            df.to_parquet(tmp / fname, index=False, engine="pyarrow")
            tables[name] = {"file": fname, "rows": int(len(df)), "sha256": _sha256(tmp / fname)}
        manifest = {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION,
                    "metadata": _jsonable(trace.metadata), "tables": tables}
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            # swap: move the old one aside first so that a crash never leaves no trace at all
            old = path.with_name(f".{path.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def is_trace_dir(path) -> bool:
    """True when `path` looks like a saved memlens trace directory."""
    return (Path(path) / MANIFEST).is_file()


def load_trace(path, *, verify_checksums: bool = True) -> Trace:
    """Read a trace saved by `save_trace`, validating manifest, checksums and schema.

    Every problem raises `InputError` naming the file and what is wrong.
    """
    path = Path(path)
    if not path.exists():
        raise InputError("no such file or directory", path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise InputError("not a memlens trace directory (no manifest.json)", path)
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"manifest is not valid JSON ({exc})", mpath) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise InputError("manifest is not a memlens trace manifest", mpath)
    version = manifest.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise InputError(f"unsupported schema version {version!r} (this memlens reads 1..{SCHEMA_VERSION}; "
                         "upgrade memlens to read newer traces)", mpath)
    tables_info = manifest.get("tables")
    if not isinstance(tables_info, dict):
        raise InputError("manifest has no 'tables' entry", mpath)
    frames = {}
    for name, info in tables_info.items():
        if name not in SCHEMA:
            raise InputError(f"manifest names an unknown table '{name}'", mpath)
        if not isinstance(info, dict) or not isinstance(info.get("file"), str) or "/" in info["file"] \
                or "\\" in info["file"] or info["file"].startswith("."):
            raise InputError(f"manifest entry for table '{name}' is malformed", mpath)
        fpath = path / info["file"]
        if not fpath.is_file():
            raise InputError(f"table file is missing (manifest lists it)", fpath)
        if verify_checksums and info.get("sha256") and _sha256(fpath) != info["sha256"]:
            raise InputError("checksum mismatch: the file was modified or is corrupt", fpath)
        try:
            df = pd.read_parquet(fpath, engine="pyarrow")
        except Exception as exc:  # pyarrow raises many types for corrupt files
            raise InputError(f"cannot read Parquet table ({type(exc).__name__}: {exc})", fpath) from None
        if "rows" in info and len(df) != info["rows"]:
            raise InputError(f"has {len(df)} rows, manifest says {info['rows']}", fpath)
        try:
            frames[name] = conform(name, df, strict=True)
        except InputError as exc:
            raise InputError(exc.message, fpath) from None
    for name in REQUIRED_TABLES:
        if name not in frames:
            raise InputError(f"manifest lacks the required table '{name}'", mpath)
    metadata = manifest.get("metadata") or {}
    trace = Trace(blocks=frames["blocks"], accesses=frames["accesses"], ops=frames["ops"],
                  metadata=metadata, **{k: frames.get(k) for k in OPTIONAL_TABLES})
    try:
        validate_trace(trace)
    except InputError as exc:
        raise InputError(exc.message, path) from None
    return trace


def validate_trace(trace: Trace) -> None:
    """Raise `InputError` if the trace is internally inconsistent."""
    b = trace.blocks
    if b["block_id"].duplicated().any():
        raise InputError("blocks: block_id values are not unique")
    if (b["size"] < 0).any():
        raise InputError("blocks: negative size")
    both = b["alloc_ns"].notna() & b["free_ns"].notna()
    if (b.loc[both, "free_ns"] < b.loc[both, "alloc_ns"]).any():
        raise InputError("blocks: a block is freed before it is allocated")
    a = trace.accesses
    if len(a):
        known = np.isin(a["block_id"].to_numpy(), b["block_id"].to_numpy())
        if not known.all():
            raise InputError(f"accesses: {int((~known).sum())} rows name a block_id not in blocks")
