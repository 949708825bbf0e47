"""Buffer-lifetime CSVs in MiniMalloc's format: ``id,lower,upper,size[,alignment][,offset]``.

Lifetimes are half-open ``[lower, upper)`` in the file's own time unit (usually an event index); memlens
treats one unit as one nanosecond. ``id`` may be any string; it is kept in the `buffer_id` column.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from memlens.errors import InputError

REQUIRED = ("id", "lower", "upper", "size")
OPTIONAL_INT = ("alignment", "offset")


def read_lifetimes_csv(path) -> pd.DataFrame:
    """Read and check a MiniMalloc CSV; returns columns id (str), lower, upper, size (int64) and the
    optional alignment / offset (Int64) when present. Raises `InputError` naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path)
    try:
        # index_col=False: a row with more fields than the header is not read as an index column; pandas
        # then drops the extra fields with a ParserWarning, which is an error here
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(path, dtype={"id": str}, skipinitialspace=True, index_col=False)
    except pd.errors.EmptyDataError:
        raise InputError("file is empty", path) from None
    except pd.errors.ParserWarning as exc:
        raise InputError(f"a row has more fields than the header ({str(exc).splitlines()[0][:120]})", path) from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"not a readable CSV ({exc})", path) from None
    df.columns = [str(c).strip().lower() for c in df.columns]
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(f"buffer-lifetime CSV lacks column(s) {', '.join(missing)} "
                         "(expected header id,lower,upper,size)", path)
    for col in ("lower", "upper", "size") + tuple(c for c in OPTIONAL_INT if c in df.columns):
        numeric = pd.to_numeric(df[col], errors="coerce")
        bad = numeric.isna() & (df[col].notna() if col in OPTIONAL_INT else True)
        if bad.any() or (numeric.dropna() % 1 != 0).any():
            row = int(bad.idxmax()) + 2 if bad.any() else 0
            raise InputError(f"column '{col}' has a non-integer value" + (f" on line {row}" if row else ""), path)
        df[col] = numeric.astype("Int64" if col in OPTIONAL_INT else "int64")
    if (df["size"] < 0).any():
        raise InputError(f"negative size on line {int((df['size'] < 0).idxmax()) + 2}", path)
    if (df["upper"] < df["lower"]).any():
        raise InputError(f"upper < lower on line {int((df['upper'] < df['lower']).idxmax()) + 2}", path)
    if df["id"].duplicated().any():
        raise InputError(f"duplicate buffer id '{df.loc[df['id'].duplicated(), 'id'].iloc[0]}'", path)
    df["id"] = df["id"].astype(str)
    return df.reset_index(drop=True)


def import_lifetimes_csv(path):
    """A buffer-lifetime CSV as a `Trace` on device "plan": one block per buffer, alloc_ns = lower,
    free_ns = upper (the file's unit taken as ns). No accesses, no addresses unless `offset` is given."""
    from memlens.trace import Trace

    df = read_lifetimes_csv(path)
    blocks = pd.DataFrame({
        "block_id": range(len(df)), "device": "plan", "size": df["size"],
        "addr": df["offset"] if "offset" in df.columns else pd.NA,
        "alloc_ns": df["lower"], "free_ns": df["upper"], "source": "lifetimes_csv",
        "buffer_id": df["id"],
    })
    if "alignment" in df.columns:
        blocks["alignment"] = df["alignment"]
    meta = {"source_kind": "lifetimes_csv", "source_path": str(path), "clock": "file_units",
            "notes": ["buffer-lifetime CSV: lifetimes only (no accesses, ops or stacks); the file's time "
                      "unit is read as nanoseconds"]}
    return Trace.from_tables(blocks, metadata=meta)
