"""A CUDA memory snapshot converted without building the Trace (`convert_snapshot`, events written a row group
at a time) is the trace the in-memory import saves: every table, dtype, seq and metadata key equal, on the real
snapshots and on crafted ones (two devices, no time_us, pending frees, ooms, annotations), with either pickle
walker. Bad input leaves nothing behind, and the conversion holds less memory per entry than the import."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from memlens.errors import InputError
from memlens.io.snapshot.importer import import_snapshot
from memlens.io.snapshot.convert import convert_snapshot
from memlens.trace.read import load_trace
from memlens.trace import OPTIONAL_TABLES, REQUIRED_TABLES
from test_import_snapshot import SNAPSHOTS, crafted


def assert_same_saved_trace(a, b) -> None:
    """Every table (columns, dtypes, values, row order) and the metadata of two loaded traces equal."""
    for name in REQUIRED_TABLES + OPTIONAL_TABLES:
        x, y = a.table(name), b.table(name)
        assert (x is None) == (y is None), name
        if x is not None:
            pd.testing.assert_frame_equal(x, y, obj=name)
    assert a.metadata == b.metadata


def converted_and_imported(src, tmp_path, rows_per_group: int = 1000):
    """(load_trace of the conversion, load_trace of the in-memory import saved) of the pickle `src`."""
    conv = convert_snapshot(src, tmp_path / "conv.memlens", rows_per_group=rows_per_group)
    mem = import_snapshot(src).save(tmp_path / "mem.memlens")
    return load_trace(conv), load_trace(mem)


@pytest.mark.parametrize("walker", ["compiled", "python"])
@pytest.mark.parametrize("rel", SNAPSHOTS)
def test_real_snapshots_convert_to_the_in_memory_import(shared, tmp_path, monkeypatch, rel, walker):
    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", walker)
    got, want = converted_and_imported(shared(rel), tmp_path)
    assert_same_saved_trace(got, want)
    if len(want.events) > 1000:  # the events really went in several row groups
        manifest = json.loads((tmp_path / "conv.memlens" / "manifest.json").read_text())
        assert manifest["tables"]["events"]["row_groups"] == -(-len(want.events) // 1000)
    # the global order: seq increasing within each device, as in the source
    for _, ev in got.events.groupby("device"):
        assert np.all(np.diff(ev["seq"].to_numpy()) > 0)


def _variants():
    two_devices = crafted()
    no_time = crafted()
    for trace in no_time["device_traces"]:
        for entry in trace:
            entry.pop("time_us")
    annotated = crafted()
    annotated["external_annotations"] = [
        {"name": "Optimizer.step#AdamW.step", "stage": "START", "time_us": 12, "device": 0},
        {"name": "Optimizer.step#AdamW.step", "stage": "END", "time_us": 16, "device": 0}]
    only_segments = {"segments": crafted()["segments"], "device_traces": []}
    return {"two_devices": two_devices, "no_time_us": no_time, "annotated": annotated,
            "only_segments": only_segments, "old_list_of_segments": crafted()["segments"]}


@pytest.mark.parametrize("name", list(_variants()))
def test_crafted_snapshots_convert_to_the_in_memory_import(tmp_path, name):
    src = tmp_path / f"{name}.pickle"
    src.write_bytes(pickle.dumps(_variants()[name], protocol=4))
    got, want = converted_and_imported(src, tmp_path, rows_per_group=2)
    assert_same_saved_trace(got, want)


@pytest.mark.parametrize("content, message", [
    (b"not a pickle at all", "pickle"),
    (pickle.dumps({"foo": 1}), "no 'segments' or 'device_traces'"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": "x", "size": 1}]]}), "integer"),
])
def test_bad_snapshots_name_the_file_and_leave_nothing(tmp_path, content, message):
    src = tmp_path / "bad.pickle"
    src.write_bytes(content)
    with pytest.raises(InputError, match=message) as err:
        convert_snapshot(src, tmp_path / "bad.memlens")
    assert "bad.pickle" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pickle"]


def test_an_existing_destination_is_kept_unless_overwrite(tmp_path):
    src = tmp_path / "s.pickle"
    src.write_bytes(pickle.dumps(crafted(), protocol=4))
    dst = convert_snapshot(src, tmp_path / "s.memlens")
    with pytest.raises(InputError, match="already exists"):
        convert_snapshot(src, dst)
    convert_snapshot(src, dst, overwrite=True)
    assert len(load_trace(dst).events) == 12


def test_import_command_converts_a_large_snapshot_without_a_trace(tmp_path, monkeypatch, capsys):
    from memlens.cli import main
    from memlens.commands import import_
    src = tmp_path / "s.pickle"
    src.write_bytes(pickle.dumps(crafted(), protocol=4))
    monkeypatch.setattr(import_, "STREAM_ABOVE_BYTES", 1)  # every snapshot counts as large
    dst = tmp_path / "s.memlens"
    assert main(["import", str(src), "-o", str(dst), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["streamed"] and doc["source_kind"] == "cuda_snapshot" and (doc["blocks"], doc["events"]) == (6, 12)
    assert_same_saved_trace(load_trace(dst), load_trace(import_snapshot(src).save(tmp_path / "m.memlens")))


def write_training_like_snapshot(path, n_entries: int, seed: int = 0) -> None:
    """One device, ~`n_entries` alloc / free_requested / free_completed entries with time_us, 200 blocks
    live at a time, each entry's frames list drawn from 50 stacks (as torch writes them: a list per entry)."""
    rng = np.random.default_rng(seed)
    frames = [{"name": f"fn_{i}", "filename": f"/src/m{i % 7}.py", "line": i} for i in range(100)]
    stacks = [[frames[j] for j in rng.integers(0, 100, 12)] for _ in range(50)]
    entries, live, t, addr = [], [], 1_700_000_000_000_000, 1 << 40
    while len(entries) < n_entries:
        size = int(rng.integers(1, 1 << 12)) * 512
        t += 3
        entries.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t,
                        "frames": list(stacks[len(entries) % 50])})
        live.append((addr, size))
        addr += size
        if len(live) > 200:
            a, s = live.pop(int(rng.integers(0, len(live))))
            for action in ("free_requested", "free_completed"):
                t += 1
                entries.append({"action": action, "addr": a, "size": s, "stream": 0, "time_us": t, "frames": []})
    with open(path, "wb") as f:
        pickle.dump({"segments": [], "device_traces": [entries]}, f, protocol=4)


CHILD = """
import sys
import pyarrow  # one thread each: how many buffers are in flight at once must not depend on the machine's load
pyarrow.set_cpu_count(1)
pyarrow.set_io_thread_count(1)
from memlens.io.snapshot.importer import import_snapshot
from memlens.io.snapshot.convert import convert_snapshot
if sys.argv[1] == "convert":  # row groups smaller than both sizes: their (bounded) buffers are in both
    convert_snapshot(sys.argv[2], sys.argv[3], rows_per_group=16384)
else:
    import_snapshot(sys.argv[2]).save(sys.argv[3])
print([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1])
"""


def test_conversion_memory_grows_less_than_the_in_memory_import(tmp_path):
    """Child VmHWM at 1x and 10x entries. Not flat: the clock, the pairing of entries into blocks and the
    story (phases smoothed over every event, categories counted over every block) need every entry, so the
    conversion keeps numpy columns per entry (~80 bytes) and the blocks, and the story's per-event arrays
    peak on top; the import also holds the events as DataFrames and their Arrow copy while saving. Measured
    here: +103 MB converting vs +230 MB importing from 40k to 400k entries (~25 MB noise seen), so the bound
    (2/3 of the import's growth) leaves ~50 MB of room; materialising the events would bring the conversion
    to the import's growth. Each child pins Arrow to one thread and each figure is the lower of two runs:
    one import's growth once read 158 MB on a loaded machine, a third under the usual."""
    hwm = {}
    for n in (40_000, 400_000):
        src = tmp_path / f"s{n}.pickle"
        write_training_like_snapshot(src, n, seed=n)
        for mode in ("convert", "import"):
            runs = []
            for run in range(2):
                proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(src),
                                       str(tmp_path / f"{mode}{n}-{run}.memlens")], capture_output=True, text=True,
                                      timeout=300)
                assert proc.returncode == 0, proc.stderr
                runs.append(int(proc.stdout.split()[-1]) * 1024)
            hwm[mode, n] = min(runs)
        src.unlink()
    grow = {mode: hwm[mode, 400_000] - hwm[mode, 40_000] for mode in ("convert", "import")}
    assert grow["convert"] < 2 / 3 * grow["import"], (grow, hwm)


def _outcome(fn):
    """("ok", value) or ("refused", message) of fn(); anything but an `InputError` propagates."""
    try:
        return "ok", fn()
    except InputError as exc:
        return "refused", exc.message


@pytest.mark.parametrize("seed_name", ["snapshot.pickle", "snapshot_p2.pickle", "snapshot.pickle.gz"])
def test_mutated_snapshots_convert_as_they_import(tmp_path_factory, seed_name):
    """Differential fuzzing: on mutated snapshots the conversion refuses exactly what the import (with the
    checks of `memlens.io.load`) refuses, and otherwise writes the same trace."""
    from hypothesis import HealthCheck, given, settings

    from memlens.io.detect import load
    from test_fuzz_inputs import MUTATIONS, _mutate, seeds
    seed = seeds(None)[seed_name]
    base = tmp_path_factory.mktemp("fuzz")

    @settings(max_examples=25, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(MUTATIONS)
    def fuzz(ops):
        src = base / seed_name
        src.write_bytes(_mutate(seed, ops))
        for name in ("conv.memlens", "mem.memlens"):
            if (base / name).exists():
                import shutil
                shutil.rmtree(base / name)
        conv = _outcome(lambda: convert_snapshot(src, base / "conv.memlens", rows_per_group=3))
        mem = _outcome(lambda: load(src, format="cuda_snapshot").save(base / "mem.memlens"))
        assert conv[0] == mem[0], (conv, mem)
        if conv[0] == "ok":
            assert_same_saved_trace(load_trace(conv[1]), load_trace(mem[1]))
        else:
            assert not (base / "conv.memlens").exists()

    fuzz()
