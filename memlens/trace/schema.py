"""The table schema of a trace: every table's columns and dtypes, and `conform`, which fills and casts a
producer's DataFrame to them. `memlens.trace` describes the tables and re-exports these names; they live
here, below the Trace class, so that the writer of saved traces (`memlens.trace.tracedir`) can use them too.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from memlens.errors import InputError

SCHEMA_VERSION = 1

CATEGORIES = (
    "parameter", "buffer", "gradient", "activation", "optimizer_state", "input", "temporary",
    "autograd_detail", "unknown",
)

# table -> ordered {column: pandas dtype}
SCHEMA: dict[str, dict[str, str]] = {
    "blocks": {
        "block_id": "int64", "device": "object", "addr": "Int64", "size": "int64",
        "alloc_ns": "Int64", "free_ns": "Int64", "alloc_seq": "Int64", "free_seq": "Int64",
        "category": "object", "op": "object", "alloc_op_id": "Int64", "module": "object",
        "stack_id": "Int64", "stream": "int64", "allocated_before": "bool",
        "free_without_alloc": "bool", "source": "object",
    },
    "accesses": {"block_id": "int64", "t_ns": "int64", "op_id": "int64", "is_write": "bool"},
    "ops": {"op_id": "int64", "name": "object", "start_ns": "int64", "end_ns": "int64",
            "module": "object", "iteration": "Int64", "flops": "int64", "bytes_read": "int64",
            "bytes_written": "int64", "dtype": "object", "shapes": "object"},
    "segments": {"device": "object", "addr": "int64", "total_size": "int64", "allocated_size": "int64",
                 "active_size": "int64", "requested_size": "int64", "stream": "int64", "pool": "object",
                 "is_expandable": "bool"},
    "segment_blocks": {"device": "object", "segment_addr": "int64", "addr": "int64", "size": "int64",
                       "requested_size": "int64", "state": "object"},
    "events": {"seq": "int64", "t_ns": "int64", "device": "object", "action": "object", "addr": "Int64",
               "size": "int64", "stream": "int64"},
    "stacks": {"stack_id": "int64", "depth": "int64", "name": "object", "filename": "object",
               "line": "int64"},
}
# columns added after traces were first saved: filled with their default even when reading strictly
OPTIONAL_COLUMNS: dict[str, frozenset] = {
    "ops": frozenset({"flops", "bytes_read", "bytes_written", "dtype", "shapes"}),
}
# ``metadata["clock"]``: the clock a trace's times are on, the same dict on every trace (recorded, imported,
# re-stamped). kind: "host" (the recording process's clock: a CPU recording's op times, a CUDA recording's or
# a profile's launch times), "cuda" (measured device kernel times, `memlens.clock.onto_kernel_clock`) or
# "modeled" (`memlens.retime`); gpu: the device the times are of (None on the host clock); model: the cost
# model (modeled only); from: the kind of the clock the trace was re-stamped from (None when never);
# device_busy_ns / kernels: device busy time (ns) and kernel count on a device clock, where every op carries its
# own time ``device_self_ns`` and its inclusive time ``device_ns`` (children summed) and the top-level ops'
# ``device_ns`` add up to device_busy_ns (`memlens.clock`, on the measured, modeled and calibrated clocks alike); source_units: how the
# source file counted time when it was imported ("ts_us", "time_us", "event_index", "ns", "us",
# "file_units"; None for recordings). Producers may add keys (retime adds "tf32": {"matmul": bool, "conv": bool,
# "source": where the settings came from}, `memlens.devicetime.tf32`).
CLOCK_KINDS = ("host", "cuda", "modeled")
CLOCK_KEYS = ("kind", "gpu", "model", "from", "device_busy_ns", "kernels", "source_units")


def make_clock(kind: str = "host", **fields) -> dict:
    """A ``metadata["clock"]`` dict of `kind` with every key of `CLOCK_KEYS` (None where not given)."""
    clock = dict.fromkeys(CLOCK_KEYS)
    clock.update(fields, kind=kind)
    return clock


def conform_clock(value) -> dict:
    """The contract's clock dict for a metadata ``clock`` value: a dict gains the keys it lacks (None); a
    string, which importers wrote before the contract (``"ts_us"``, ``"time_us"``, ``"event_index"`` ...),
    is the host clock with that string as ``source_units``; None (older recordings) is the host clock."""
    if isinstance(value, dict):
        return make_clock(**{"kind": "host", **value}) if value.get("kind") is not None else \
            make_clock(**{**value, "kind": "host"})
    return make_clock("host", source_units=value if isinstance(value, str) else None)


REQUIRED_TABLES = ("blocks", "accesses", "ops")
OPTIONAL_TABLES = ("segments", "segment_blocks", "events", "stacks")

# defaults used to fill a column a producer did not supply
_FILL: dict[str, Any] = {
    "category": "unknown", "op": "", "module": "", "stream": 0, "allocated_before": False,
    "free_without_alloc": False, "source": "unknown", "name": "", "filename": "", "line": 0,
    "pool": "", "state": "", "is_expandable": False, "allocated_size": 0, "active_size": 0,
    "requested_size": 0, "flops": 0, "bytes_read": 0, "bytes_written": 0, "dtype": "", "shapes": "",
}


def empty_table(table: str) -> pd.DataFrame:
    """An empty DataFrame with the columns and dtypes of `table`."""
    return pd.DataFrame({c: pd.Series(dtype=d) for c, d in SCHEMA[table].items()})


def _already(series: pd.Series, dtype: str) -> bool:
    """Whether `series` is already what `conform` would make of it for `dtype`: the same non-object dtype,
    or an object column with no missing value (strings as Python objects, not pandas' str dtype)."""
    if dtype == "object":
        return series.dtype == object and not series.isna().any()
    return series.dtype == dtype


def conform(table: str, df: pd.DataFrame | None, *, strict: bool = False) -> pd.DataFrame:
    """Return `df` with every schema column of `table` present and cast to its dtype.

    Missing columns are filled with defaults (or NA for nullable ones) unless `strict`, in which case a
    missing column raises `InputError`. Extra columns are kept after the schema's columns.
    """
    if df is None:
        return empty_table(table)
    schema = SCHEMA[table]
    n = len(df)
    out = {}
    for col, dtype in schema.items():
        if col in df.columns:
            series = df[col]
            if col != "device" and _already(series, dtype):     # nothing to cast (astype would copy the column)
                out[col] = series
                continue
        elif strict and col not in OPTIONAL_COLUMNS.get(table, ()):
            raise InputError(f"table '{table}' lacks column '{col}'")
        elif dtype == "Int64":
            series = pd.Series(pd.NA, index=df.index, dtype="Int64")
        elif col not in _FILL:
            raise InputError(f"table '{table}' lacks required column '{col}'")
        else:
            series = pd.Series([_FILL[col]] * n, index=df.index)
        try:
            if dtype == "object":
                if col == "device":
                    series = series.astype(str)
                else:
                    present = series.notna()
                    series = series.astype(object)
                    if not present.all():  # (`where` copies the column even when nothing is missing)
                        series = series.where(present, "")
            elif dtype == "bool":
                series = series.fillna(False).astype(bool)
            else:
                series = series.astype(dtype)
        except (TypeError, ValueError) as exc:
            raise InputError(f"table '{table}' column '{col}' cannot be read as {dtype}: {exc}") from None
        out[col] = series
    for c in df.columns:       # extra columns after the schema's, in one construction (no insert per column)
        if c not in schema:
            out[c] = df[c]
    result = pd.DataFrame(out, index=df.index, copy=False)
    if isinstance(df.index, pd.RangeIndex) and df.index.start == 0 and df.index.step == 1:
        return result          # already 0..n-1 (reset_index would build the frame a second time)
    return result.reset_index(drop=True)
