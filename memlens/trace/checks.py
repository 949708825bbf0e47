"""Consistency checks of a trace's tables and metadata: what `Trace.validate` and every loader run.

They read a trace through its tables (``blocks``, ``accesses``, ``table(name)``) and need nothing above the
error types, so the Trace class and the loaders both import them from here.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens import limits
from memlens.errors import InputError

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


def _column_values(trace, spec: dict):
    """(table, column, values as float64 with NA as 0) of each non-empty column named in `spec`."""
    for table, columns in spec.items():
        df = trace.table(table)
        for col in columns:
            if df is None or col not in df.columns or not len(df):
                continue
            yield table, col, pd.to_numeric(df[col], errors="coerce").to_numpy(dtype="float64", na_value=0.0)


def _check_ranges(trace) -> None:
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


def validate_trace(trace) -> None:
    """Raise `InputError` if the trace is internally inconsistent, or holds times or sizes that are
    not finite, negative (sizes), or so large that int64 sums overflow."""
    b = trace.blocks
    if b["block_id"].duplicated().any():
        raise InputError("blocks: block_id values are not unique")
    limits.check_devices(int(b["device"].nunique()))
    _check_ranges(trace)
    both = b["alloc_ns"].notna() & b["free_ns"].notna()
    if (b.loc[both, "free_ns"] < b.loc[both, "alloc_ns"]).any():
        raise InputError("blocks: a block is freed before it is allocated")
    a = trace.accesses
    if len(a):
        known = np.isin(a["block_id"].to_numpy(), b["block_id"].to_numpy())
        if not known.all():
            raise InputError(f"accesses: {int((~known).sum())} rows name a block_id not in blocks")
