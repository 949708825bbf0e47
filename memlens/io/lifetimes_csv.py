"""Buffer-lifetime CSVs in MiniMalloc's format: ``id,lower,upper,size[,alignment][,offset]``.

Lifetimes are half-open ``[lower, upper)`` in the file's own time unit (usually an event index); memlens
treats one unit as one nanosecond. ``id`` may be any string; it is kept in the `buffer_id` column.
"""
from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from memlens import limits
from memlens.errors import InputError

REQUIRED = ("id", "lower", "upper", "size")
_MAX_VALUE = 2 ** 62  # times, sizes, alignments and offsets: beyond this an int64 sum overflows
OPTIONAL_INT = ("alignment", "offset")


def read_lifetimes_csv(path) -> pd.DataFrame:
    """Read and check a MiniMalloc CSV; returns columns id (str), lower, upper, size (int64) and the
    optional alignment / offset (Int64) when present. Raises `InputError` naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path)
    limits.check_input_file(path, "buffer-lifetime CSV")  # read whole: bounded before pandas holds it
    with _csv_errors(path):
        df = pd.read_csv(path, dtype={"id": str}, skipinitialspace=True, index_col=False)
    return _validated(df, path)


@contextlib.contextmanager
def _csv_errors(path):
    """pandas' CSV parse errors as one-line `InputError`s naming `path`.

    index_col=False (the callers' choice): a row with more fields than the header is not read as an index
    column; pandas then drops the extra fields with a ParserWarning, which is an error here."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            yield
    except pd.errors.EmptyDataError:
        raise InputError("file is empty", path) from None
    except pd.errors.ParserWarning as exc:
        raise InputError(f"a row has more fields than the header ({str(exc).splitlines()[0][:120]})", path) from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"not a readable CSV ({exc})", path) from None


def _validated(df: pd.DataFrame, path, first_line: int = 2) -> pd.DataFrame:
    """`df` (rows of the CSV from file line `first_line`) checked and typed as `read_lifetimes_csv`
    returns it; duplicate ids are checked within `df` only."""
    df.columns = [str(c).strip().lower() for c in df.columns]
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(f"buffer-lifetime CSV lacks column(s) {', '.join(missing)} "
                         "(expected header id,lower,upper,size)", path)
    df = df.reset_index(drop=True)
    line = first_line
    for col in ("lower", "upper", "size") + tuple(c for c in OPTIONAL_INT if c in df.columns):
        numeric = pd.to_numeric(df[col], errors="coerce")
        bad = numeric.isna() & (df[col].notna() if col in OPTIONAL_INT else True)
        if bad.any() or (numeric.dropna() % 1 != 0).any():
            row = int(bad.idxmax()) + line if bad.any() else 0
            raise InputError(f"column '{col}' has a non-integer value" + (f" on line {row}" if row else ""), path)
        huge = numeric.abs() >= _MAX_VALUE  # int64 casts would wrap (1e23 would read as a negative size)
        if huge.any():
            raise InputError(f"column '{col}' holds {numeric[huge].iloc[0]:.6g} on line {int(huge.idxmax()) + line}: "
                             "values must be below 2**62", path)
        df[col] = numeric.astype("Int64" if col in OPTIONAL_INT else "int64")
    if (df["size"] < 0).any():
        raise InputError(f"negative size on line {int((df['size'] < 0).idxmax()) + line}", path)
    if (df["upper"] < df["lower"]).any():
        raise InputError(f"upper < lower on line {int((df['upper'] < df['lower']).idxmax()) + line}", path)
    if df["id"].duplicated().any():
        raise InputError(f"duplicate buffer id '{df.loc[df['id'].duplicated(), 'id'].iloc[0]}'", path)
    df["id"] = df["id"].astype(str)
    return df


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


# in a streamed conversion, an event's seq orders it among events at the same time as `Trace.from_tables`
# orders a CSV's (frees before allocs, then block id): free_seq = block id, alloc_seq = this + block id; a
# buffer that lives zero time units is freed after that instant's allocs (twice this + block id), never
# before its own alloc
ALLOC_SEQ_BASE = 1 << 40
CHUNK_ROWS = 1 << 18  # CSV rows parsed, checked and written at once (~0.2 GB with string ids, measured)


def _blocks_of(df: pd.DataFrame, first_block: int) -> pd.DataFrame:
    """The blocks rows of some validated CSV rows, block ids from `first_block` on."""
    ids = first_block + pd.RangeIndex(len(df)).to_numpy()
    blocks = pd.DataFrame({
        "block_id": ids, "device": "plan", "size": df["size"].to_numpy(),
        "addr": df["offset"].array if "offset" in df.columns else pd.NA,
        "alloc_ns": df["lower"].to_numpy(), "free_ns": df["upper"].to_numpy(),
        "alloc_seq": ALLOC_SEQ_BASE + ids,
        "free_seq": np.where(df["lower"].to_numpy() == df["upper"].to_numpy(), 2 * ALLOC_SEQ_BASE + ids, ids),
        "source": "lifetimes_csv", "buffer_id": df["id"].to_numpy(),
    })
    if "alignment" in df.columns:
        blocks["alignment"] = df["alignment"].array
    return blocks


def _id_hashes(ids: pd.Series) -> "np.ndarray":
    """A 64-bit hash of each buffer id (pandas' stable `hash_array`): 8 bytes per id to find duplicates."""
    from pandas.util import hash_array
    return hash_array(ids.to_numpy(dtype=object), categorize=False)


def convert_lifetimes_csv(path, dst, *, rows_per_group: int = CHUNK_ROWS, overwrite: bool = False):
    """Convert a buffer-lifetime CSV to a saved ``NAME.memlens`` trace a chunk of `rows_per_group` rows at
    a time (`trace.partitioned.PartitionedTraceWriter`), never holding the whole table: the same blocks as
    `import_lifetimes_csv` saved (block ids in file order; alloc/free order at equal times the same, its
    seq values spaced as `ALLOC_SEQ_BASE` says). Duplicate ids are found from an 8-byte hash per row, then
    confirmed by re-reading the ids with a colliding hash. Returns the path written; bad input raises
    `InputError` naming the line and leaves nothing behind."""
    import numpy as np

    from memlens.trace.partitioned import PartitionedTraceWriter
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path)
    meta = {"source_kind": "lifetimes_csv", "source_path": str(path), "clock": "file_units",
            "notes": ["buffer-lifetime CSV: lifetimes only (no accesses, ops or stacks); the file's time "
                      "unit is read as nanoseconds"]}
    with PartitionedTraceWriter(dst, meta, rows_per_group=rows_per_group, overwrite=overwrite) as w:
        hashes, n = [], 0
        for chunk in _chunks(path, rows_per_group):
            df = _validated(chunk, path, first_line=n + 2)
            w.add("blocks", _blocks_of(df, n))
            hashes.append(_id_hashes(df["id"]))
            n += len(df)
        h = np.sort(np.concatenate(hashes)) if hashes else np.zeros(0, np.uint64)
        del hashes
        suspects = np.unique(h[1:][h[1:] == h[:-1]])
        if len(suspects):
            _confirm_duplicates(path, suspects, rows_per_group)
    return Path(dst)


def _chunks(path: Path, rows: int):
    """The CSV as frames of `rows` rows, with `read_lifetimes_csv`'s parse errors."""
    with _csv_errors(path):
        yield from pd.read_csv(path, dtype={"id": str}, skipinitialspace=True, index_col=False, chunksize=rows)


def _confirm_duplicates(path: Path, suspects, rows: int) -> None:
    """Raise `InputError` for the first id that really repeats among those whose hash is in `suspects`
    (a second pass keeping only those ids); a hash collision of different ids passes."""
    import numpy as np
    seen: set[str] = set()
    for chunk in _chunks(path, rows):
        chunk.columns = [str(c).strip().lower() for c in chunk.columns]
        ids = chunk["id"].astype(str)
        for value in ids[np.isin(_id_hashes(ids), suspects)]:
            if value in seen:
                raise InputError(f"duplicate buffer id '{value}'", path)
            seen.add(value)
