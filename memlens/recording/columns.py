"""Tables under construction at the end of a recording: named numpy columns, no DataFrame until the end.

Closing a recording joins and refines three small tables (ops, blocks, accesses) with a few hundred array
operations. On pandas 3 every DataFrame step costs 10-300 us whatever the row count (a column lookup goes
through an arrow-backed label index, a construction re-infers every text column), so a one-step close paid
~15 ms of that fixed cost for ~1 ms of numpy work. Here each table is a `Columns`: a dict of
numpy arrays of one length, text as object arrays, nullable integers as `Nullable` (values + missing mask),
and becomes a DataFrame once, with the schema's dtypes, when the Trace is made (`to_frame`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from memlens.trace.schema import SCHEMA

# the frames' dtypes: the schema's, with "device" left to pandas' inference (its str dtype), as `conform`
# casts it with astype(str)
FRAME_DTYPES = {name: {c: ("str" if c == "device" else d) for c, d in cols.items()} for name, cols in SCHEMA.items()}

class Nullable(NamedTuple):
    """An Int64 column: int64 `values` (meaningless where missing) and a bool `missing` mask."""

    values: np.ndarray
    missing: np.ndarray

    @classmethod
    def of(cls, values, missing=None) -> "Nullable":
        """`values` as int64 with `missing` (default: nothing missing)."""
        values = np.asarray(values, dtype=np.int64)
        if missing is None:
            missing = np.zeros(len(values), dtype=bool)
        return cls(values, np.asarray(missing, dtype=bool))

    @classmethod
    def absent(cls, n: int) -> "Nullable":
        """A column of `n` missing values."""
        return cls(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))

    def filled(self, value) -> np.ndarray:
        """The values with `value` where missing (int64 unless `value` is a float such as NaN)."""
        if isinstance(value, float):
            return np.where(self.missing, value, self.values.astype(np.float64))
        return np.where(self.missing, value, self.values)

    def present(self) -> np.ndarray:
        """True where a value is present."""
        return ~self.missing

    def take(self, rows) -> "Nullable":
        return Nullable(self.values[rows], self.missing[rows])

    def to_array(self) -> pd.arrays.IntegerArray:
        """The pandas Int64 array (no copy)."""
        return pd.arrays.IntegerArray(self.values, self.missing)


def first_occurrences(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values, sorted; the index of each one's first occurrence): `np.unique(values,
    return_index=True)` as one stable sort, about a third of its call cost on the few hundred rows of a
    one-step close."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    head = np.ones(len(ordered), dtype=bool)
    head[1:] = ordered[1:] != ordered[:-1]
    return ordered[head], order[head]


def objects(values) -> np.ndarray:
    """A text column as a numpy object array."""
    return np.asarray(values, dtype=object)


class Columns:
    """A table being built: an ordered {name: column} of one length (`n` rows). A column is a numpy array
    (object dtype for text) or a `Nullable`. `to_frame` makes the DataFrame once."""

    __slots__ = ("cols", "n")

    def __init__(self, n: int, cols: dict | None = None):
        self.n = int(n)
        self.cols = {}
        for name, col in (cols or {}).items():
            self[name] = col

    def __len__(self) -> int:
        return self.n

    def __contains__(self, name) -> bool:
        return name in self.cols

    def __getitem__(self, name):
        return self.cols[name]

    def __setitem__(self, name, col) -> None:
        if not isinstance(col, Nullable):
            col = np.asarray(col)
        if len(col[0] if isinstance(col, Nullable) else col) != self.n:
            raise ValueError(f"column {name!r} has {len(col[0] if isinstance(col, Nullable) else col)} rows, "
                             f"the table {self.n}")
        self.cols[name] = col

    @property
    def columns(self) -> list[str]:
        return list(self.cols)

    def copy(self) -> "Columns":
        """A new table sharing the column arrays (set a column to replace it; never edit one in place)."""
        out = Columns(self.n)
        out.cols = dict(self.cols)
        return out

    def take(self, rows) -> "Columns":
        """The rows `rows` (an index array or a bool mask), in that order."""
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        out = Columns(len(rows))
        out.cols = {k: (c.take(rows) if isinstance(c, Nullable) else c[rows]) for k, c in self.cols.items()}
        return out

    @staticmethod
    def concat(parts: list["Columns"]) -> "Columns":
        """Rows of `parts` one after the other; every part has the first part's columns, in any order."""
        names = parts[0].columns
        out = Columns(sum(p.n for p in parts))
        for name in names:
            cols = [p[name] for p in parts]
            if isinstance(cols[0], Nullable):
                out.cols[name] = Nullable(np.concatenate([c.values for c in cols]),
                                          np.concatenate([c.missing for c in cols]))
            else:
                out.cols[name] = np.concatenate(cols)
        return out

    @classmethod
    def from_frame(cls, df: pd.DataFrame) -> "Columns":
        """A DataFrame's columns: Int64 as `Nullable`, text (object or pandas str) as object arrays."""
        out = cls(len(df))
        for name in df.columns:
            s = df[name]
            if isinstance(s.dtype, pd.Int64Dtype):
                out.cols[name] = Nullable(s.to_numpy(dtype=np.int64, na_value=0), s.isna().to_numpy())
            elif s.dtype == object or isinstance(s.dtype, pd.StringDtype):
                out.cols[name] = s.to_numpy(dtype=object)
            else:
                out.cols[name] = s.to_numpy()
        return out

    def to_frame(self, schema: dict[str, str] | None = None) -> pd.DataFrame:
        """The DataFrame, built once: `schema`'s columns first (those present, in its order), then the
        others; Int64 for `Nullable`; the schema's text columns (dtype "object") kept as Python objects,
        "str" ones as pandas' str dtype, other text columns as pandas infers them (its str dtype)."""
        schema = schema or {}
        names = [c for c in schema if c in self.cols]
        names += [c for c in self.cols if c not in schema]
        arrays = []
        for name in names:
            col = self.cols[name]
            if isinstance(col, Nullable):
                arrays.append(col.to_array())
            elif schema.get(name) == "object":
                arrays.append(np.asarray(col, dtype=object))
            elif schema.get(name) == "str" or (col.dtype == object or col.dtype.kind == "U"):
                # pandas' str dtype: what its constructor infers for text and `conform` casts "device" to
                arrays.append(_text_array(col, schema.get(name) == "str"))
            else:
                arrays.append(col)
        return _frame(arrays, names, self.n)


def _text_array(col: np.ndarray, cast: bool):
    """A text column as pandas' constructor would hold it: its str dtype for a numpy text array, an object
    array whose values are strings (or missing), or when `cast`; else the object array as it is (an empty
    or mixed object column stays object)."""
    if col.dtype.kind == "U":        # numpy text: always pandas' str dtype, even empty
        cast, col = True, col.astype(object)
    if cast or len(col) and pd.api.types.infer_dtype(col, skipna=True) == "string":
        return _str_array(col)
    return col


def _str_array(col: np.ndarray):
    """pandas' str array of an object array of strings (missing values: None / NaN), made by pyarrow
    directly (~40% less than `pd.array(col, dtype="str")`, which checks every value again); the same array
    (when pandas' str dtype is not the pyarrow one this pandas would make, `pd.array` makes it)."""
    dtype = _arrow_str_dtype()
    if dtype is not None:
        import pyarrow as pa
        try:
            return pd.arrays.ArrowStringArray(pa.chunked_array([pa.array(col, type=pa.large_string(),
                                                                         from_pandas=True)]), dtype=dtype)
        except (TypeError, ValueError, pa.ArrowException):
            pass     # values pyarrow does not take as text: pandas' own conversion decides, or says why
    return pd.array(col, dtype="str")


_ARROW_STR: list = []


def _arrow_str_dtype():
    """pandas' "str" dtype when it is pyarrow large strings with NaN for missing (pandas 3), else None."""
    if not _ARROW_STR:
        try:
            dtype = pd.array(np.array(["a"], dtype=object), dtype="str").dtype
            arrow = isinstance(pd.array(np.array(["a"], dtype=object), dtype="str"), pd.arrays.ArrowStringArray)
            _ARROW_STR.append(dtype if arrow and dtype.storage == "pyarrow" else None)
        except (ImportError, TypeError, ValueError, AttributeError):
            _ARROW_STR.append(None)
    return _ARROW_STR[0]


_COLUMN_INDEX: dict[tuple, pd.Index] = {}     # column labels of each table shape met (Index objects are immutable)


def _frame(arrays: list, names: list[str], n: int) -> pd.DataFrame:
    """One DataFrame of `arrays` (already of their final dtypes), labelled `names`, index 0..n-1."""
    key = tuple(names)
    columns = _COLUMN_INDEX.get(key)
    if columns is None:
        columns = _COLUMN_INDEX.setdefault(key, pd.Index(names)) if len(_COLUMN_INDEX) < 64 else pd.Index(names)
    try:   # pandas' own constructor from arrays, without re-inferring or consolidating columns (~2.5x faster)
        from pandas.core.internals.construction import arrays_to_mgr
        manager = arrays_to_mgr(arrays, columns, pd.RangeIndex(n), verify_integrity=False, consolidate=False)
        return pd.DataFrame._from_mgr(manager, axes=manager.axes)
    except (ImportError, AttributeError, TypeError):    # another pandas: the public constructor, same frame
        return pd.DataFrame({name: (pd.Series(a, dtype=object, copy=False) if getattr(a, "dtype", None) == object
                                    else a) for name, a in zip(names, arrays)}, index=pd.RangeIndex(n),
                            columns=columns)
