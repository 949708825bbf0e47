"""A Kineto trace read a piece at a time, keeping only the events the importer reads (`read_kineto_filtered`),
imports to the same Trace as the whole-file parse; bad JSON is refused with the file and the place named; the
streamed read holds far less memory for a trace full of events memlens does not use."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pandas as pd
import pytest

import memlens.io.kineto.stream as kineto_stream
from memlens.errors import InputError
from memlens.io.kineto.importer import import_kineto
from memlens.io.kineto.stream import import_kineto_streamed, read_kineto_filtered

KINETO = ["kineto/hta_df_index_resolver.json.gz", "kineto/kineto_resnet50_2021format.pt.trace.json.gz",
          "kineto/tracelens_h100_bert_small.json.gz", "kineto/tracelens_mi300_bert_small.json.gz"]


def assert_same_trace(a, b) -> None:
    for name in ("blocks", "events", "ops", "accesses"):
        pd.testing.assert_frame_equal(a.table(name), b.table(name), obj=name)
    assert a.metadata == b.metadata


@pytest.mark.parametrize("read_bytes", [4096, 1 << 20])
@pytest.mark.parametrize("rel", KINETO)
def test_real_traces_import_the_same_streamed(shared, monkeypatch, rel, read_bytes):
    monkeypatch.setattr(kineto_stream, "READ_CHARS", read_bytes)  # pieces cut events, keys and numbers
    path = shared(rel)
    assert_same_trace(import_kineto_streamed(path), import_kineto(path))


def small_trace(n: int = 50, pad_events: int = 0, pad_cat: str = "kernel") -> dict:
    """[memory] alloc / free pairs inside cpu_ops on one thread, with `pad_events` events of category
    `pad_cat` per op (kernels without their launch: the importer only counts them; python_function spans:
    events it never reads), ProfilerStep ranges and top-level keys."""
    events = []
    for i in range(n):
        t = 1000.0 + 10 * i
        events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 5}", "pid": 1, "tid": 2, "ts": t,
                       "dur": 8, "args": {"External id": i}})
        events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 2, "ts": t + 1,
                       "args": {"Bytes": 512 * (i + 1), "Addr": 4096 * i, "Device Type": 1, "Device Id": 0,
                                "Total Allocated": 512 * (i + 1), "Total Reserved": 1 << 20, "Ev Idx": 2 * i}})
        events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 2, "ts": t + 2,
                       "args": {"Bytes": -512 * (i + 1), "Addr": 4096 * i, "Device Type": 1, "Device Id": 0,
                                "Total Allocated": 0, "Total Reserved": 1 << 20, "Ev Idx": 2 * i + 1}})
        for k in range(pad_events):
            events.append({"ph": "X", "cat": pad_cat, "name": f"void kernel_{k}<float>(...)", "pid": 0,
                           "tid": 7, "ts": t + 3, "dur": 1.5, "args": {"stream": 7, "correlation": i * 100 + k,
                                                                      "grid": [1, 2, 3], "block": [128, 1, 1]}})
    events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 2, "ts": 990.0,
                   "dur": 20 + 10 * n})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU"}], "traceEvents": events,
            "traceName": "t.json", "baseTimeNanoseconds": 1_700_000_000_000_000_000}


@pytest.mark.parametrize("shape", ["dict", "bare_list", "gzip", "pretty"])
def test_crafted_traces_import_the_same_streamed(tmp_path, monkeypatch, shape):
    monkeypatch.setattr(kineto_stream, "READ_CHARS", 333)
    doc = small_trace(pad_events=2)
    if shape == "bare_list":
        doc = doc["traceEvents"]
    text = json.dumps(doc, indent=2 if shape == "pretty" else None)
    path = tmp_path / ("t.json.gz" if shape == "gzip" else "t.json")
    path.write_bytes(gzip.compress(text.encode()) if shape == "gzip" else text.encode())
    assert_same_trace(import_kineto_streamed(path), import_kineto(path))
    kept = read_kineto_filtered(path)
    kept_events = kept if shape == "bare_list" else kept["traceEvents"]
    assert len(kept_events) == 50 * 3 + 1  # the kernels are dropped, ops / memory / step kept
    if shape != "bare_list":
        assert kept["traceName"] == "t.json" and kept["deviceProperties"] == [{"id": 0, "name": "GPU"}]


@pytest.mark.parametrize("text, message", [
    ("", "file is empty"),
    ('{"traceEvents": [{"name": "[memory]", "ts": 1', "invalid JSON"),
    ('{"traceEvents": [{"name": "x"} {"name": "y"}]}', "expected ',' or ']'"),
    ('{"traceEvents": []} trailing', "extra data"),
    ('{"traceEvents": [nope]}', "invalid JSON at character 17"),
    ('{"traceEvents": [' + "[" * 5000 + "]" * 5000 + "]}", "nested too deeply"),
])
def test_bad_json_names_the_file_and_the_place(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message) as err:
        read_kineto_filtered(path)
    assert "bad.json" in str(err.value)


def test_not_utf8_and_missing_files_are_refused(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"traceEvents": ["\xff\xfe"]}')
    with pytest.raises(InputError, match="not UTF-8"):
        read_kineto_filtered(path)
    with pytest.raises(InputError, match="no such file"):
        read_kineto_filtered(tmp_path / "absent.json")


def test_import_command_streams_a_large_kineto_trace(tmp_path, monkeypatch, capsys):
    from memlens.cli import main
    from memlens.commands import import_
    from memlens.trace.read import load_trace
    src = tmp_path / "t.json"
    src.write_text(json.dumps(small_trace()))
    monkeypatch.setattr(import_, "STREAM_ABOVE_BYTES", 1)  # every trace counts as large
    assert main(["import", str(src), "-o", str(tmp_path / "t.memlens"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["streamed"] and doc["source_kind"] == "kineto" and doc["ops"] == 50
    assert_same_trace(load_trace(tmp_path / "t.memlens"), import_kineto(src))


CHILD = """
import sys
from memlens.io.kineto.importer import import_kineto
from memlens.io.kineto.stream import import_kineto_streamed
(import_kineto_streamed if sys.argv[1] == "streamed" else import_kineto)(sys.argv[2])
print([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1])
"""


def test_streamed_read_holds_much_less_for_a_trace_of_unused_events(tmp_path):
    """Child VmHWM at 1x and 8x a trace whose events are mostly ones the importer never reads (20
    python_function spans per op; kernels are read, into flat arrays: `GpuEvents`): the whole-file parse
    holds the text and a dict per event; the streamed read a piece of text and the kept events (ops and
    memory events, slimmed), then the Trace built from them (not flat: the attribution of memory events
    to ops needs every op). Measured: +413 MB whole vs +60 MB streamed from 2k to 16k ops (~25 MB noise
    seen); keeping every event would grow by ~300 MB."""
    hwm = {}
    for n in (2_000, 16_000):
        src = tmp_path / f"t{n}.json"
        src.write_text(json.dumps(small_trace(n, pad_events=20, pad_cat="python_function")))
        for mode in ("streamed", "whole"):
            proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(src)], capture_output=True, text=True,
                                  timeout=300)
            assert proc.returncode == 0, proc.stderr
            hwm[mode, n] = int(proc.stdout.split()[-1]) * 1024
        src.unlink()
    grow = {mode: hwm[mode, 16_000] - hwm[mode, 2_000] for mode in ("streamed", "whole")}
    assert grow["streamed"] < grow["whole"] / 4, (grow, hwm)


@pytest.mark.parametrize("seed_name", ["kineto.json", "kineto.json.gz"])
def test_mutated_traces_import_as_the_whole_parse(tmp_path_factory, seed_name):
    """Differential fuzzing: on mutated traces the streamed read refuses what the whole-file import (with the
    checks of `memlens.io.load`) refuses, and otherwise gives the same trace."""
    from hypothesis import HealthCheck, given, settings

    from memlens.io.detect import load, validated
    from test_fuzz_inputs import MUTATIONS, _mutate, seeds
    seed = seeds(None)[seed_name]
    src = tmp_path_factory.mktemp("fuzz") / seed_name

    def outcome(fn):
        try:
            return "ok", fn()
        except InputError as exc:
            return "refused", exc.message

    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(MUTATIONS)
    def fuzz(ops):
        src.write_bytes(_mutate(seed, ops))
        streamed = outcome(lambda: validated(import_kineto_streamed(src), src))
        whole = outcome(lambda: load(src, format="kineto"))
        assert streamed[0] == whole[0], (streamed, whole)
        if streamed[0] == "ok":
            assert_same_trace(streamed[1], whole[1])

    fuzz()
