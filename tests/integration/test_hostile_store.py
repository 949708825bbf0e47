"""Issue 18, items 5, 6, 9, 12 and 15 for saved traces: size checks before reading or hashing, atomic
saves that survive a kill at any point and concurrent readers/writers, permissions from the umask, and
wrong values refused on import as on load."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import textwrap

import numpy as np
import pandas as pd
import pytest

from hostile import ROOT, assert_refused, run_memlens, run_python
from memlens.errors import InputError
from memlens.trace.read import load_trace
from memlens.trace.tracedir import MANIFEST, save_trace
from memlens.trace import Trace


def small_trace(n: int = 4, shift: int = 0) -> Trace:
    blocks = pd.DataFrame({"block_id": np.arange(n), "device": "cuda:0", "size": 512 * (np.arange(n) + 1),
                           "alloc_ns": 10 * np.arange(n) + shift, "free_ns": 10 * np.arange(n) + 5 + shift})
    return Trace.from_tables(blocks, metadata={"name": f"run{shift}"})


def _rewrite_manifest(path, edit) -> None:
    manifest = json.loads((path / MANIFEST).read_text())
    edit(manifest)
    (path / MANIFEST).write_text(json.dumps(manifest))


# ---------------------------------------------------------------- 5. Parquet that decompresses huge

def test_parquet_row_groups_past_the_limit_are_refused_before_reading(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = save_trace(small_trace(), tmp_path / "bomb.memlens")
    rows_per_batch, batches = 8_000_000, 20  # 20 x 64 MB of zeros: 1.28 GB uncompressed, ~1 MB on disk
    table_path = path / "accesses.parquet"
    schema = pa.schema([("block_id", pa.int64()), ("t_ns", pa.int64()), ("op_id", pa.int64()),
                        ("is_write", pa.bool_())])
    zeros = pa.array(np.zeros(rows_per_batch, dtype=np.int64))
    falses = pa.array(np.zeros(rows_per_batch, dtype=bool))
    with pq.ParquetWriter(table_path, schema, compression="zstd", use_dictionary=False) as writer:
        for _ in range(batches):
            writer.write_table(pa.Table.from_arrays([zeros, zeros, zeros, falses], schema=schema))
    assert table_path.stat().st_size < 32 << 20

    def edit(m):
        m["tables"]["accesses"].update(rows=rows_per_batch * batches, bytes=table_path.stat().st_size,
                                       sha256=hashlib.sha256(table_path.read_bytes()).hexdigest())
    _rewrite_manifest(path, edit)
    for engine in ("auto", "memory", "dask"):  # a row group at a time or not: refused before reading
        assert_refused(run_memlens("info", path, "--engine", engine), "accesses.parquet", "MEMLENS_MAX_DECOMPRESSED")


def test_parquet_row_count_checked_against_manifest_before_reading(tmp_path):
    path = save_trace(small_trace(), tmp_path / "rows.memlens")
    _rewrite_manifest(path, lambda m: m["tables"]["blocks"].update(rows=3))
    with pytest.raises(InputError, match="has 4 rows, manifest says 3"):
        load_trace(path)


# ---------------------------------------------------------------- 6. sparse terabyte with a checksum

def test_sparse_terabyte_table_is_refused_without_hashing(tmp_path):
    path = save_trace(small_trace(), tmp_path / "sparse.memlens")
    with open(path / "ops.parquet", "r+b") as f:
        f.truncate(1 << 40)  # sparse: a terabyte of holes, hashing it would take hours
    line = assert_refused(run_memlens("info", path), "ops.parquet")
    assert "bytes" in line


def test_sparse_terabyte_without_manifest_size_hits_the_limit(tmp_path):
    path = save_trace(small_trace(), tmp_path / "sparse.memlens")
    _rewrite_manifest(path, lambda m: m["tables"]["ops"].pop("bytes"))  # as in traces saved before sizes
    with open(path / "ops.parquet", "r+b") as f:
        f.truncate(1 << 40)
    assert_refused(run_memlens("info", path), "ops.parquet")  # the out-of-core engine: no footer there
    assert_refused(run_memlens("info", path, "--engine", "memory"), "ops.parquet", "MEMLENS_MAX_DECOMPRESSED")


# ---------------------------------------------------------------- 9. atomic save, recovery, concurrency

_KILL_AT_RENAME = textwrap.dedent("""
    import os, shutil, signal, sys
    import numpy as np, pandas as pd
    from memlens.trace import tracedir
    from memlens.trace import Trace
    from memlens.trace.tracedir import save_trace
    path, shift, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    exchange = sys.argv[4] if len(sys.argv) > 4 else "auto"
    blocks = pd.DataFrame({"block_id": np.arange(4), "device": "cuda:0", "size": 512 * (np.arange(4) + 1),
                           "alloc_ns": 10 * np.arange(4) + shift, "free_ns": 10 * np.arange(4) + 5 + shift})
    if exchange == "off":  # the two-rename swap of systems without renameat2(RENAME_EXCHANGE)
        tracedir._exchange = lambda a, b: False
    calls = [0]
    def step(real):  # every step of a save that touches the disk counts; SIGKILL at step `kill_at`
        def wrapped(*args, **kwargs):
            calls[0] += 1
            if calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        return wrapped
    os.replace, os.fsync, shutil.rmtree = step(os.replace), step(os.fsync), step(shutil.rmtree)
    tracedir._exchange, tracedir._fsync_dir, tracedir.file_sha256 = (
        step(tracedir._exchange), step(tracedir._fsync_dir), step(tracedir.file_sha256))
    save_trace(Trace.from_tables(blocks), path, overwrite=True)
""")


@pytest.mark.parametrize("exchange", ["auto", "off"])
@pytest.mark.parametrize("kill_at", range(1, 14))
def test_kill_during_overwrite_leaves_a_loadable_trace(tmp_path, kill_at, exchange):
    """Issue 26: a save SIGKILLed at any of its steps (each fsync, checksum, rename or exchange, removal)
    leaves the old trace or the complete new one, which the next reader finds (never "no such file")."""
    from memlens.io import load
    path = save_trace(small_trace(shift=0), tmp_path / "run.memlens")
    script = tmp_path / "kill.py"
    script.write_text(_KILL_AT_RENAME)
    killed = run_python([script, path, 1000, kill_at, exchange])
    assert killed.code in (-9, 0), killed.stderr
    trace = load(path)  # detect_format, then load_trace: both recover a killed save
    assert trace.blocks["alloc_ns"].min() in (0, 1000)
    if killed.code == 0:
        assert trace.blocks["alloc_ns"].min() == 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kill.py", "run.memlens"]


def test_kill_during_first_save_leaves_nothing_half_written(tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(_KILL_AT_RENAME)
    target = tmp_path / "new.memlens"
    # steps of a first save of three tables: fsync and checksum of each (6), the manifest's fsync (7), the
    # rename into place (8)
    assert run_python([script, target, 0, 8]).code == -9
    assert not target.exists()  # killed before its one rename: the complete trace sits in a temp directory
    # the next load recovers it: what the writer had fully written is not lost
    assert load_trace(target).blocks["alloc_ns"].tolist() == [0, 10, 20, 30]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kill.py", "new.memlens"]


_LOOP = textwrap.dedent("""
    import sys, time
    import numpy as np, pandas as pd
    from memlens.trace import Trace
    from memlens.trace.read import load_trace
    from memlens.trace.tracedir import save_trace
    path, role, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    failures = 0
    for i in range(count):
        try:
            if role == "read":
                t = load_trace(path)
                assert len(t.blocks) in (4, 6), len(t.blocks)
            else:
                n = 4 if (i + (role == "write2")) % 2 else 6
                blocks = pd.DataFrame({"block_id": np.arange(n), "device": "cuda:0", "size": 512 + np.arange(n),
                                       "alloc_ns": np.arange(n), "free_ns": np.arange(n) + 1})
                save_trace(Trace.from_tables(blocks), path, overwrite=True)
        except Exception as exc:
            failures += 1
            print(type(exc).__name__, exc, file=sys.stderr)
    print(failures)
""")


def test_concurrent_readers_and_writers_always_see_a_whole_trace(tmp_path):
    import subprocess
    import sys
    path = save_trace(small_trace(), tmp_path / "shared.memlens")
    script = tmp_path / "loop.py"
    script.write_text(_LOOP)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, str(script), str(path), role, str(count)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for role, count in (("read", 150), ("write", 40), ("write2", 40), ("read", 150))]
    results = [p.communicate(timeout=300) for p in procs]
    for (out, err), p in zip(results, procs):
        assert p.returncode == 0, err
        assert out.strip() == "0", err[-2000:]
    assert len(load_trace(path).blocks) in (4, 6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop.py", "shared.memlens"]


# ---------------------------------------------------------------- 15. permissions

def test_saved_trace_gets_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = save_trace(small_trace(), tmp_path / "perm.memlens")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert stat.S_IMODE((path / MANIFEST).stat().st_mode) == 0o644


def test_unwritable_parent_is_input_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(InputError, match="cannot write"):
            save_trace(small_trace(), ro / "x.memlens")
    finally:
        ro.chmod(0o755)


# ---------------------------------------------------------------- 12. wrong values

@pytest.mark.parametrize("value", [True, "1", 1.0, None, [1]])
def test_schema_version_of_the_wrong_type(tmp_path, value):
    path = save_trace(small_trace(), tmp_path / "v.memlens")
    _rewrite_manifest(path, lambda m: m.update(schema_version=value))
    assert_refused(run_memlens("info", path), "schema version")


@pytest.mark.parametrize("key,value", [("notes", 5), ("notes", [1, 2]), ("devices", "cuda:0"),
                                       ("clock", 5), ("clock", {"kind": "sundial"}),
                                       ("source_kind", ["x"]), ("t0_unix_ns", "yesterday")])
def test_manifest_metadata_of_wrong_types(tmp_path, key, value):
    path = save_trace(small_trace(), tmp_path / "m.memlens")
    _rewrite_manifest(path, lambda m: m["metadata"].update({key: value}))
    assert_refused(run_memlens("info", path), "manifest.json", key)


def test_metadata_not_an_object(tmp_path):
    path = save_trace(small_trace(), tmp_path / "m.memlens")
    _rewrite_manifest(path, lambda m: m.update(metadata=[1, 2]))
    assert_refused(run_memlens("info", path), "metadata")


def _kineto(ts_values) -> dict:
    events = [{"ph": "i", "s": "t", "name": "[memory]", "pid": 0, "tid": 0, "ts": ts,
               "args": {"Addr": 4096, "Bytes": b, "Total Allocated": 0, "Total Reserved": 0,
                        "Device Id": 0, "Device Type": 1}}
              for ts, b in zip(ts_values, (512, -512))]
    return {"schemaVersion": 1, "traceEvents": events}


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1e300"])
def test_kineto_timestamps_not_finite_or_huge(tmp_path, bad):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_kineto([1.0, 2.0])).replace('"ts": 2.0', f'"ts": {bad}'))
    assert_refused(run_memlens("info", path), str(path), "ts")


def _snapshot_file(tmp_path, **entry) -> str:
    e = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1, "frames": []}
    e.update(entry)
    first = {"action": "alloc", "addr": 8192, "size": 512, "stream": 0, "time_us": 0, "frames": []}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[first, e]]}, protocol=4))
    return path


@pytest.mark.parametrize("entry,needle", [({"size": -512}, "negative size"),
                                          ({"size": 2**63 - 1}, "2**56"),
                                          ({"time_us": float("nan")}, "nan"),
                                          ({"time_us": 2**61}, "2**62")])
def test_snapshot_values_out_of_range(tmp_path, entry, needle):
    path = _snapshot_file(tmp_path, **entry)
    assert_refused(run_memlens("info", path), str(path), needle)


def test_sizes_whose_sum_overflows_int64(tmp_path):
    entries = [{"action": "alloc", "addr": 4096 * (i + 1), "size": 2**55, "stream": 0, "time_us": i,
                "frames": []} for i in range(300)]
    path = tmp_path / "sum.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    assert_refused(run_memlens("info", path), "overflow")


def test_what_is_imported_reloads_after_save(tmp_path):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(_kineto([1.0, 2.0])))
    out = tmp_path / "ok.memlens"
    imported = run_memlens("import", path, "-o", out)
    assert imported.code == 0, imported.stderr
    info = run_memlens("info", "--json", out)
    assert info.code == 0, info.stderr
    assert json.loads(info.stdout)["blocks"] == 1


def test_load_trace_checks_sizes_before_hashing(tmp_path, monkeypatch):
    import memlens.trace.read as store
    path = save_trace(small_trace(), tmp_path / "order.memlens")
    with open(path / "ops.parquet", "r+b") as f:
        f.truncate(1 << 40)

    real_sha256 = store.file_sha256

    def no_hashing(p):
        if p.name == "ops.parquet":
            raise AssertionError(f"hashed {p} before checking its size")
        return real_sha256(p)
    monkeypatch.setattr(store, "file_sha256", no_hashing)
    with pytest.raises(InputError, match="bytes"):
        load_trace(path)


def test_out_of_core_engine_checks_the_same_manifest(tmp_path):
    path = save_trace(small_trace(), tmp_path / "ooc.memlens")
    with open(path / "ops.parquet", "r+b") as f:
        f.truncate(1 << 40)
    assert_refused(run_memlens("info", path, "--engine", "dask"), "ops.parquet", "bytes")
    good = save_trace(small_trace(), tmp_path / "ooc2.memlens")
    _rewrite_manifest(good, lambda m: m.update(schema_version=True))
    assert_refused(run_memlens("info", good, "--engine", "dask"), "schema version")


def test_load_trace_refuses_a_boolean_schema_version(tmp_path):
    # in-process: the CLI also meets the out-of-core engine's own manifest check, which would hide a
    # regression in load_trace
    path = save_trace(small_trace(), tmp_path / "bool.memlens")
    _rewrite_manifest(path, lambda m: m.update(schema_version=True))
    with pytest.raises(InputError, match="schema version True"):
        load_trace(path)
