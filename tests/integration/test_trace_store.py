"""The Trace model and its storage: round trip, atomic writes, schema errors, info."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from memlens import Trace
from memlens.errors import InputError
from memlens.io import load
from memlens.trace.tracedir import MANIFEST, save_trace


def hand_trace() -> Trace:
    """Four blocks on two devices with known lifetimes (ns).

    cpu: A [0,100) 100 B, B [10,50) 300 B, C [60,∞) 50 B  -> peak 400 at t in [10,50)
    cuda:0: D allocated before recording, freed at 80, 1000 B -> peak 1000
    """
    blocks = pd.DataFrame({
        "block_id": [0, 1, 2, 3], "device": ["cpu", "cpu", "cpu", "cuda:0"],
        "addr": [4096, 8192, 4096 + 512, 1 << 30], "size": [100, 300, 50, 1000],
        "alloc_ns": [0, 10, 60, None], "free_ns": [100, 50, None, 80],
        "category": ["parameter", "activation", "temporary", "unknown"],
        "op": ["aten::empty", "aten::mm", "aten::add", ""], "module": ["m", "m.l1", "", ""],
        "allocated_before": [False, False, False, True], "source": "test",
    })
    accesses = pd.DataFrame({"block_id": [0, 1, 0, 2], "t_ns": [5, 20, 40, 70], "op_id": [0, 1, 1, 2],
                             "is_write": [True, True, False, False]})
    ops = pd.DataFrame({"op_id": [0, 1, 2], "name": ["aten::fill_", "aten::mm", "aten::add"],
                        "start_ns": [5, 20, 70], "end_ns": [6, 41, 71], "module": ["m", "m.l1", ""],
                        "iteration": [0, 0, 1]})
    return Trace.from_tables(blocks, accesses, ops, metadata={"source_kind": "test"})


def test_summary_hand_computed():
    s = hand_trace().summary()
    assert s["blocks"] == 4 and s["accesses"] == 4 and s["ops"] == 3
    assert s["devices"] == ["cpu", "cuda:0"]
    assert s["duration_ns"] == 100
    assert s["peak_live_bytes"] == {"cpu": 400, "cuda:0": 1000}
    assert s["allocated_before"] == 1 and s["alive_at_end"] == 1


def test_half_open_lifetimes_do_not_overlap():
    # B frees at 50 and E allocs at 50: half-open lifetimes, so they never coexist
    blocks = pd.DataFrame({"block_id": [0, 1], "device": "cpu", "size": [10, 20],
                           "alloc_ns": [0, 50], "free_ns": [50, 60]})
    t = Trace.from_tables(blocks)
    assert t.peak_live_bytes() == {"cpu": 20}


def test_round_trip_all_columns_and_dtypes(tmp_path):
    t = hand_trace()
    t.stacks = pd.DataFrame({"stack_id": [0, 0], "depth": [0, 1], "name": ["f", "<module>"],
                             "filename": ["a.py", "b.py"], "line": [3, 9]})
    path = t.save(tmp_path / "run.memlens")
    back = load(path)
    for name in ("blocks", "accesses", "ops"):
        pd.testing.assert_frame_equal(getattr(t, name), getattr(back, name))
    pd.testing.assert_frame_equal(t.stacks, back.stacks, check_dtype=False)
    assert back.metadata["source_kind"] == "test"
    assert back.summary() == t.summary()


def test_tables_readable_by_pandas_and_duckdb(tmp_path):
    path = hand_trace().save(tmp_path / "run.memlens")
    df = pd.read_parquet(path / "blocks.parquet")
    assert len(df) == 4
    duckdb = pytest.importorskip("duckdb")
    n = duckdb.connect().execute(f"SELECT count(*) FROM '{path / 'accesses.parquet'}'").fetchall()[0][0]
    assert n == 4
    dd = pytest.importorskip("dask.dataframe")
    assert int(dd.read_parquet(str(path / "ops.parquet")).shape[0].compute()) == 3


def test_atomic_write_interrupted_leaves_nothing(tmp_path, monkeypatch):
    t = hand_trace()
    target = tmp_path / "run.memlens"

    def boom(*a, **k):
        raise KeyboardInterrupt("power cut")

    import pyarrow.parquet as pq
    monkeypatch.setattr(pq.ParquetWriter, "write_table", boom)  # interrupted inside a table's row groups
    with pytest.raises(KeyboardInterrupt):
        t.save(target)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_overwrite_keeps_old_on_failure(tmp_path, monkeypatch):
    target = hand_trace().save(tmp_path / "run.memlens")
    before = (target / MANIFEST).read_text()
    with pytest.raises(InputError):
        hand_trace().save(target)  # no overwrite flag
    import pyarrow.parquet as pq
    monkeypatch.setattr(pq.ParquetWriter, "write_table", lambda *a, **k: (_ for _ in ()).throw(OSError("disk")))
    with pytest.raises(OSError):
        hand_trace().save(target, overwrite=True)
    assert (target / MANIFEST).read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["run.memlens"]


def test_refuses_to_overwrite_a_non_trace(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("x")
    with pytest.raises(InputError, match="not a memlens trace"):
        hand_trace().save(tmp_path / "data", overwrite=True)
    assert (tmp_path / "data" / "precious.txt").exists()


def test_schema_errors(tmp_path):
    path = hand_trace().save(tmp_path / "run.memlens")
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["schema_version"] = 99
    (path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="schema version 99"):
        load(path)
    manifest["schema_version"] = 1
    (path / MANIFEST).write_text(json.dumps(manifest))
    # a table missing a required column (checksum updated so that the schema check is what fails)
    df = pd.read_parquet(path / "blocks.parquet").drop(columns=["size"])
    df.to_parquet(path / "blocks.parquet")
    with pytest.raises(InputError, match="checksum"):
        load(path)
    with pytest.raises(InputError, match="lacks column 'size'"):
        from memlens.trace.read import load_trace
        load_trace(path, verify_checksums=False)


def test_inconsistent_trace_rejected():
    t = hand_trace()
    t.accesses.loc[0, "block_id"] = 99
    with pytest.raises(InputError, match="block_id not in blocks"):
        t.validate()


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "memlens", *map(str, args)], capture_output=True, text=True)


def test_cli_info_json_matches_hand_computed(tmp_path):
    path = hand_trace().save(tmp_path / "run.memlens")
    r = _cli("info", path, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["blocks"] == 4 and data["accesses"] == 4 and data["ops"] == 3
    assert data["devices"] == ["cpu", "cuda:0"] and data["duration_ns"] == 100
    assert data["peak_live_bytes"] == {"cpu": 400, "cuda:0": 1000}
    r = _cli("info", path)
    assert r.returncode == 0 and "peak live: cpu" in r.stdout


@pytest.mark.parametrize("case", ["missing", "plain_dir", "corrupt_parquet", "garbage_file", "empty_file"])
def test_cli_info_bad_input(tmp_path, case):
    if case == "missing":
        target = tmp_path / "nope.memlens"
    elif case == "plain_dir":
        target = tmp_path / "d"
        target.mkdir()
    elif case == "corrupt_parquet":
        target = hand_trace().save(tmp_path / "run.memlens")
        with open(target / "ops.parquet", "r+b") as f:
            f.seek(10)
            f.write(b"\x00" * 50)
        manifest = json.loads((target / MANIFEST).read_text())
        del manifest["tables"]["ops"]["sha256"]
        (target / MANIFEST).write_text(json.dumps(manifest))
    elif case == "garbage_file":
        target = tmp_path / "x.bin"
        target.write_bytes(os.urandom(256).replace(b"\x80", b"\x81").replace(b"\x1f", b"\x20"))
    else:
        target = tmp_path / "empty.json"
        target.write_bytes(b"")
    r = _cli("info", target)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert target.name in lines[0]


def test_save_writes_row_groups_a_slice_at_a_time(tmp_path, monkeypatch):
    """Big tables are written a row group at a time (the out-of-core engine reads them so): every table is
    split into row groups of ROWS_PER_GROUP rows, a string column missing from the first slice keeps its
    type, the round trip is exact, and time-ordered accesses are marked so in the manifest."""
    import pyarrow.parquet as pq
    from memlens.trace import tracedir
    monkeypatch.setattr(tracedir, "ROWS_PER_GROUP", 3)
    t = hand_trace()
    t.blocks["op"] = pd.Series([None, None, None, "aten::late"], dtype=object)
    path = t.save(tmp_path / "run.memlens")
    assert [pq.ParquetFile(path / f"{n}.parquet").metadata.num_row_groups for n in ("blocks", "accesses", "ops")] \
        == [2, 2, 1]  # 4, 4 and 3 rows
    assert pq.ParquetFile(path / "blocks.parquet").schema_arrow.field("op").type == "string"
    back = load(path)
    assert back.blocks["op"].tolist() == ["", "", "", "aten::late"]  # missing labels are stored as ""
    pd.testing.assert_frame_equal(back.blocks.drop(columns="op"), t.blocks.drop(columns="op"))
    pd.testing.assert_frame_equal(back.accesses, t.accesses)
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["tables"]["accesses"]["sorted_by"] == "t_ns"
    assert manifest["tables"]["blocks"]["row_groups"] == 2
    from memlens.analysis.outofcore.files import TraceFiles
    assert TraceFiles.open(path).row_groups["accesses"] == [3, 1]
    # accesses out of time order: not marked
    t.accesses = t.accesses.iloc[::-1].reset_index(drop=True)
    path2 = t.save(tmp_path / "rev.memlens")
    assert "sorted_by" not in json.loads((path2 / MANIFEST).read_text())["tables"]["accesses"]
    pd.testing.assert_frame_equal(load(path2).accesses, t.accesses)
