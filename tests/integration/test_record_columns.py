"""The recording's close on numpy columns: `Columns` makes the frames pandas would make, the Trace
built from them is the one `Trace.from_tables` makes of the same tables, and spill files go with their
recording."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

import memlens
from memlens.recording import columns as columns_mod
from memlens.recording import spill
from memlens.recording.columns import Columns, Nullable
from memlens.trace import SCHEMA, Trace, event_order


def _table():
    return Columns(3, {
        "block_id": np.array([4, 5, 6]), "device": np.array(["cpu", "cuda:0", "cpu"], dtype=object),
        "addr": Nullable.of([16, 0, 32], [False, True, False]), "category": np.array(["a", "b", "c"], dtype=object),
        "phase": np.array(["forward", "backward", "other"]),              # numpy text
        "rule": np.array(["x", "y", "z"], dtype=object),                   # object text outside the schema
        "mixed": np.array(["x", 3, None], dtype=object), "flag": np.array([True, False, True])})


def test_to_frame_makes_the_dtypes_pandas_constructor_would_and_the_schema_asks():
    schema = {"block_id": "int64", "device": "str", "addr": "Int64", "category": "object"}
    df = _table().to_frame(schema)
    assert list(df.columns) == ["block_id", "device", "addr", "category", "phase", "rule", "mixed", "flag"]
    assert df["block_id"].dtype == np.int64 and df["addr"].dtype == "Int64" and df["flag"].dtype == bool
    assert df["addr"].isna().tolist() == [False, True, False] and df["addr"].iloc[2] == 32
    assert df["category"].dtype == object                                   # the schema's object text
    # what pd.DataFrame({...}) infers for the others: str for text, object for a mixed column
    inferred = pd.DataFrame({c: _table()[c] for c in ("device", "phase", "rule", "mixed")})
    for c in ("device", "phase", "rule", "mixed"):
        assert df[c].dtype == inferred[c].dtype, c
        assert df[c].tolist()[:2] == inferred[c].tolist()[:2]
    assert df["mixed"].tolist()[2] is None and df["mixed"].dtype == object


def test_empty_columns_keep_the_dtypes_of_the_constructor():
    empty = Columns(0, {"phase": np.empty(0, dtype="<U8"), "rule": np.empty(0, dtype=object),
                        "device": np.empty(0, dtype=object)})
    df = empty.to_frame({"device": "str"})
    expected = pd.DataFrame({"phase": np.empty(0, dtype="<U8"), "rule": np.empty(0, dtype=object)})
    assert df["phase"].dtype == expected["phase"].dtype and df["rule"].dtype == expected["rule"].dtype
    assert df["device"].dtype == pd.Series([], dtype=object).astype(str).dtype


def test_the_public_constructor_fallback_makes_the_same_frame(monkeypatch):
    schema = {"block_id": "int64", "device": "str", "addr": "Int64", "category": "object"}
    fast = _table().to_frame(schema)

    def missing(*args, **kwargs):
        raise AttributeError("_from_mgr")
    # the fast path builds through pandas' internal `_from_mgr`; without it, the public constructor
    monkeypatch.setattr(pd.DataFrame, "_from_mgr", missing)
    with pytest.raises(AttributeError):
        pd.DataFrame._from_mgr(None, axes=None)
    slow = _table().to_frame(schema)
    pd.testing.assert_frame_equal(fast, slow, check_exact=True)
    assert fast.columns.dtype == slow.columns.dtype


def test_take_concat_and_round_trip_through_a_frame():
    t = _table()
    part = t.take(np.array([2, 0]))
    assert part["block_id"].tolist() == [6, 4] and part["addr"].missing.tolist() == [False, False]
    masked = t.take(np.array([False, True, True]))
    assert masked["addr"].missing.tolist() == [True, False] and len(masked) == 2
    both = Columns.concat([part, masked])
    assert both["block_id"].tolist() == [6, 4, 5, 6] and both["addr"].filled(-1).tolist() == [32, 16, -1, 32]
    back = Columns.from_frame(t.to_frame({"device": "str", "addr": "Int64"}))
    assert back["device"].dtype == object and back["device"].tolist() == ["cpu", "cuda:0", "cpu"]
    assert back["addr"].values.tolist()[0] == 16 and back["addr"].missing.tolist() == [False, True, False]
    with pytest.raises(ValueError, match="has 2 rows, the table 3"):
        t["bad"] = np.arange(2)


def test_nullable_fill_and_absent():
    col = Nullable.of([1, 2, 3], [False, True, False])
    assert col.filled(-1).tolist() == [1, -1, 3]
    assert np.isnan(col.filled(np.nan)[1]) and col.filled(np.nan)[2] == 3.0
    assert Nullable.absent(2).missing.tolist() == [True, True]


def test_event_order_by_hand():
    """Blocks 0: [10, 20), 1: [20, 30), 2: allocated and freed at 20, 3: before recording, never freed.
    Events: 3 alloc (missing = first), 0 alloc @10, then @20: free 0, alloc 1, alloc 2, free 2 (a zero-length
    block is freed after that instant's allocs), then free 1 @30, and 3's free (missing = last)."""
    alloc_seq, free_seq = event_order(np.array([0, 1, 2, 3]), np.array([10, 20, 20, 0]),
                                      np.array([False, False, False, True]), np.array([20, 30, 20, 0]),
                                      np.array([False, False, False, True]))
    assert alloc_seq.tolist() == [1, 3, 4, 0]
    assert free_seq.tolist() == [2, 6, 5, 7]


@pytest.mark.parametrize("backend", ["compiled", "python"])
def test_recorded_trace_is_what_from_tables_makes_of_its_tables(backend):
    """The recorder builds its frames once, without `conform`'s casts: the same frames as `from_tables`."""
    from memlens.recording import native
    if backend == "compiled" and not native.available():
        pytest.skip("compiled recorder does not build here")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with memlens.record(model, backend=backend, stacks=True) as rec:
        model(torch.randn(5, 8)).square().mean().backward()
        opt.step()
    trace = rec.trace
    blocks = trace.blocks.drop(columns=["alloc_seq", "free_seq"])      # from_tables fills them again
    again = Trace.from_tables(blocks, trace.accesses, trace.ops, metadata=dict(trace.metadata), stacks=trace.stacks)
    for name in ("blocks", "accesses", "ops", "stacks"):
        pd.testing.assert_frame_equal(getattr(trace, name), getattr(again, name), check_exact=True)
        assert getattr(trace, name).columns.dtype == getattr(again, name).columns.dtype
        assert list(getattr(trace, name).columns)[:len(SCHEMA[name])] == list(SCHEMA[name])


def test_spill_files_go_with_their_recording_and_the_directory_is_private():
    first, second = spill.spill_prefix(), spill.spill_prefix()
    directory = os.path.dirname(first)
    assert os.path.dirname(second) == directory and first != second
    assert os.stat(directory).st_mode & 0o077 == 0            # only this user
    for prefix in (first, second):
        for suffix in (".t0", ".mem"):
            with open(prefix + suffix, "wb") as f:
                f.write(b"x")
    # "rec1" must not take "rec10"'s files: a name is the prefix plus a dot
    longer = first + "0"
    with open(longer + ".t0", "wb") as f:
        f.write(b"x")
    spill.remove_spill_files(first)
    left = sorted(os.listdir(directory))
    assert os.path.basename(first) + ".t0" not in left and os.path.basename(second) + ".t0" in left
    assert os.path.basename(longer) + ".t0" in left
    spill.remove_spill_files(second)
    spill.remove_spill_files(longer)
    spill.remove_spill_files(os.path.join(directory + "-gone", "rec0"))     # a missing directory: nothing
    assert not any(n.startswith((os.path.basename(second), os.path.basename(longer))) for n in os.listdir(directory))


def test_a_recording_that_spills_leaves_no_files(monkeypatch):
    from memlens.recording import native
    if not native.available():
        pytest.skip("compiled recorder does not build here")
    x = torch.randn(64, 64)
    with memlens.record(backend="compiled", max_buffer_bytes=4096) as rec:
        for _ in range(400):
            x = (x + 1).relu()
    assert rec.trace.metadata.get("recorder_spilled_bytes", 0) > 0
    directory = os.path.dirname(spill.spill_prefix())
    assert [n for n in os.listdir(directory) if not n.startswith("rec")] == []
    assert all(not n.endswith((".t0", ".mem", ".frees", ".blocks", ".ctx")) for n in os.listdir(directory))


def test_spill_files_are_looked_for_only_when_the_recording_went_over_its_budget(monkeypatch):
    """A spill file exists only after the C++ side found the recording over its byte budget: a recording
    whose drained peak stays within it skips the directory listing; one over it (or not drained) looks."""
    from memlens.recording import compiled, native
    if not native.available():
        pytest.skip("compiled recorder does not build here")
    looked = []
    real = compiled.remove_spill_files
    monkeypatch.setattr(compiled, "remove_spill_files", lambda prefix: (looked.append(prefix), real(prefix)))
    x = torch.randn(8, 8)
    with memlens.record(backend="compiled") as rec:
        (x + 1).relu()
    assert rec.trace.metadata["recorder_bytes"] <= rec.max_buffer_bytes and looked == []
    with memlens.record(backend="compiled", max_buffer_bytes=4096) as rec:
        for _ in range(400):
            x = (x + 1).relu()
    assert rec.trace.metadata["recorder_bytes"] > 4096 and len(looked) == 1
    session = compiled.CompiledSession(native=native.load(), model=None)
    session._spill_dir = "/nonexistent-memlens-dir/rec0"       # never drained: the files are looked for
    session._remove_spill_dir()
    assert looked[-1] == "/nonexistent-memlens-dir/rec0" and session._spill_dir is None


def test_column_labels_are_shared_per_table_shape():
    a = _table().to_frame({"block_id": "int64"})
    b = _table().to_frame({"block_id": "int64"})
    assert a.columns is b.columns and len(columns_mod._COLUMN_INDEX) <= 64


@pytest.mark.parametrize("constructor", ["fast", "public"])
def test_text_and_object_columns_as_the_schema_asks(monkeypatch, constructor):
    """"str" columns become pandas' str dtype whatever they hold (torch.device objects, numbers: their str()),
    "object" ones stay Python objects (numpy text too); `objects` makes object arrays, not numpy text. The
    same through pandas' public constructor (the fallback)."""
    if constructor == "public":
        def missing(*args, **kwargs):
            raise AttributeError("_from_mgr")
        monkeypatch.setattr(pd.DataFrame, "_from_mgr", missing)
    t = Columns(2, {"device": np.array([torch.device("cpu"), torch.device("cuda", 0)], dtype=object),
                    "n": np.array([3, 4]), "u": np.array(["a", "bb"])})
    df = t.to_frame({"device": "str", "n": "str", "u": "object"})
    str_dtype = pd.Series(["x"]).dtype
    assert df["device"].dtype == str_dtype and df["device"].tolist() == ["cpu", "cuda:0"]
    assert df["n"].dtype == str_dtype and df["n"].tolist() == ["3", "4"]
    assert df["u"].dtype == object and df["u"].tolist() == ["a", "bb"]
    assert columns_mod.objects(["a", "bb"]).dtype == object


def test_from_frame_keeps_int64_values_and_numbers_as_numbers():
    df = pd.DataFrame({"addr": pd.array([16, None], dtype="Int64"), "size": np.array([8, 9]),
                       "device": pd.Series(["cpu", None], dtype="str"), "x": np.array([0.5, 1.5])})
    cols = Columns.from_frame(df)
    assert cols["addr"].values.dtype == np.int64 and cols["addr"].values[0] == 16
    assert cols["addr"].missing.tolist() == [False, True]
    assert cols["size"].dtype == np.int64 and cols["x"].dtype == np.float64
    assert cols["device"].dtype == object and cols["device"][0] == "cpu"
    pd.testing.assert_frame_equal(cols.to_frame({"addr": "Int64"}), df, check_exact=True)
    mask = Nullable.of([1, 2], [0, 1])                       # a 0/1 mask is taken as bool
    assert mask.missing.dtype == bool and mask.present().tolist() == [True, False]


def test_arrow_str_dtype_is_pandas_str_dtype(monkeypatch):
    """Computed afresh (not from the process's cache): pandas' "str" dtype when it is pyarrow-backed."""
    monkeypatch.setattr(columns_mod, "_ARROW_STR", [])
    made = pd.array(np.array(["a"], dtype=object), dtype="str")
    expected = made.dtype if isinstance(made, pd.arrays.ArrowStringArray) and made.dtype.storage == "pyarrow" \
        else None
    assert columns_mod._arrow_str_dtype() == expected and columns_mod._ARROW_STR == [expected]


def test_column_labels_cache_keeps_at_most_64_shapes(monkeypatch):
    """A new shape is kept (and shared by the next frame of that shape) while fewer than 64 are; at 64 it is
    made afresh each time and the cache does not grow."""
    monkeypatch.setattr(columns_mod, "_COLUMN_INDEX", {})
    a = Columns(1, {"p": np.array([1])}).to_frame()
    b = Columns(1, {"p": np.array([2])}).to_frame()
    assert a.columns is b.columns and list(columns_mod._COLUMN_INDEX) == [("p",)]
    full = {(f"c{i}",): pd.Index([f"c{i}"]) for i in range(64)}
    monkeypatch.setattr(columns_mod, "_COLUMN_INDEX", full)
    c = Columns(1, {"q": np.array([1])}).to_frame()
    assert list(c.columns) == ["q"] and len(full) == 64 and ("q",) not in full
