"""Issue 18 fuzz target: hypothesis mutates a sample trace of every format (bit flips, truncation,
splices, hostile bytes) and `memlens info` must exit 0 or 2, never 1 (an internal error), never print a
traceback or more than one error line; a mutated file that still imports must give the same numbers
after a save and reload (no silent wrong number), with every figure finite and non-negative. Peak memory
of each format's run (growth over what the test process held before it) stays under 1 GiB.

Run longer with ``MEMLENS_FUZZ_EXAMPLES=2000 pytest tests/unit/test_fuzz_inputs.py``.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import pickle
import shutil

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from memlens.cli import main  # noqa: E402

EXAMPLES = int(os.environ.get("MEMLENS_FUZZ_EXAMPLES", "40"))
HOSTILE_BYTES = [b"\x00", b"\xff", b"\x1b[2J", b"\xe2\x80\xae", b"NaN", b"1e400", b"-1", b"]]]]", b"{{{{",
                 b"r\xff\xff\xff\x7f", b"j\xff\xff\xff\x7f", b"\x8c\x08builtins\x8c\x04eval\x93", b"(((("]


def _snapshot() -> dict:
    frames = [{"name": "forward", "filename": "/home/u/model.py", "line": 7},
              {"name": "at::_ops::zeros_like::call(x)", "filename": "??", "line": 0}]
    trace = [{"action": a, "addr": 4096 * (i // 2 + 1), "size": 1024 * (i // 2 + 1), "stream": 0,
              "time_us": 10 * i, "frames": frames} for i, a in enumerate(["alloc", "free_completed"] * 4)]
    segments = [{"device": 0, "address": 1 << 20, "total_size": 2 << 20, "allocated_size": 1024, "active_size": 1024,
                 "requested_size": 1000, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                 "is_expandable": False, "frames": [],
                 "blocks": [{"address": 1 << 20, "size": 1024, "requested_size": 1000, "state": "active_allocated",
                             "frames": frames}]}]
    return {"segments": segments, "device_traces": [trace]}


def _kineto() -> dict:
    mem = [{"ph": "i", "s": "t", "name": "[memory]", "pid": 0, "tid": 0, "ts": 5.0 + i,
            "args": {"Addr": 4096 * (i % 3 + 1), "Bytes": (512 if i < 3 else -512), "Total Allocated": 512 * (i + 1),
                     "Total Reserved": 4096, "Device Id": 0, "Device Type": 1}} for i in range(6)]
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 4.0 + i, "dur": 0.5, "pid": 0, "tid": 0,
            "args": {"External id": i}} for i in range(6)]
    return {"schemaVersion": 1, "traceEvents": ops + mem}


def seeds(tmp_root) -> dict[str, bytes]:
    """name -> bytes of a valid sample of each single-file format."""
    return {
        "snapshot.pickle": pickle.dumps(_snapshot(), protocol=4),
        "snapshot_p2.pickle": pickle.dumps(_snapshot(), protocol=2),
        "snapshot.pickle.gz": gzip.compress(pickle.dumps(_snapshot(), protocol=4)),
        "kineto.json": json.dumps(_kineto()).encode(),
        "kineto.json.gz": gzip.compress(json.dumps(_kineto()).encode()),
        "timeline_raw.json": json.dumps([[-1, 1, 2048, 0], [1000, 2, 512, 4], [2000, 4, -512, 4]]).encode(),
        "timeline_curves.json": json.dumps([[0, 1, 2], [[0] * 8, [512] + [0] * 7, [0] * 8]]).encode(),
        "lifetimes.csv": b"id,lower,upper,size\n0,0,10,512\n1,5,15,1024\n2,12,20,256\n",
    }


def _mutate(data: bytes, ops) -> bytes:
    buf = bytearray(data)
    for kind, pos, value, extra in ops:
        if not buf:
            break
        at = pos % len(buf)
        if kind == 0:    # flip bits of one byte
            buf[at] ^= (value % 255) + 1
        elif kind == 1:  # truncate
            del buf[at:]
        elif kind == 2:  # insert hostile bytes
            buf[at:at] = HOSTILE_BYTES[value % len(HOSTILE_BYTES)]
        elif kind == 3:  # duplicate a slice (repeats structure)
            buf[at:at] = buf[at:at + (extra % 64)]
        elif kind == 4:  # overwrite with a digit run (huge numbers)
            buf[at:at + 1] = b"9" * (extra % 40 + 1)
    return bytes(buf)


MUTATIONS = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1 << 20), st.integers(0, 255),
                               st.integers(0, 255)), min_size=1, max_size=4)


def _run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _check_numbers(doc: dict) -> None:
    for key in ("blocks", "accesses", "ops", "duration_ns"):
        assert isinstance(doc[key], int) and doc[key] >= 0, (key, doc[key])
    for dev, peak in doc["peak_live_bytes"].items():
        assert isinstance(peak, int) and 0 <= peak < 2**62, (dev, peak)


def _status_bytes(field: str) -> int | None:
    """A ``/proc/self/status`` memory field in bytes (Linux), else None."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(field.encode() + b":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@contextlib.contextmanager
def _peak_growth():
    """Yields a list that gets the peak RSS growth (bytes) of the block, or NaN where it cannot be measured.

    The test process has held whatever earlier tests allocated, so its lifetime high-water mark says nothing
    about this block: the mark is reset (``clear_refs`` 5) and compared with the RSS at the start."""
    result: list[float] = []
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        start = _status_bytes("VmRSS")
    except OSError:
        start = None
    yield result
    peak = _status_bytes("VmHWM") if start is not None else None
    result.append(float("nan") if peak is None else float(peak - start))


def _fuzz_one(tmp_path, name: str, data: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    code, out, err = _run("info", "--json", path)
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("memlens: error:"), err
        return
    doc = json.loads(out)
    _check_numbers(doc)
    # what imports must survive a save and a reload with the same numbers
    saved = tmp_path / "saved.memlens"
    shutil.rmtree(saved, ignore_errors=True)
    code, _, err = _run("import", path, "-o", saved, "--overwrite")
    assert code == 0, err
    code, out2, err = _run("info", "--json", saved)
    assert code == 0, err
    again = json.loads(out2)
    for key in ("blocks", "accesses", "ops", "duration_ns", "peak_live_bytes"):
        assert again[key] == doc[key], (key, again[key], doc[key])


@pytest.mark.parametrize("name", sorted(seeds(None)))
def test_fuzz_each_format(tmp_path_factory, name):
    seed = seeds(None)[name]
    base = tmp_path_factory.mktemp("fuzz")
    # the unmutated seed must import: otherwise the fuzzing below would only exercise error paths
    _fuzz_one(base, name, seed)
    assert _run("info", "--json", base / name)[0] == 0

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(MUTATIONS)
    def fuzz(ops):
        _fuzz_one(base, name, _mutate(seed, ops))

    with _peak_growth() as growth:
        fuzz()
    assert growth[0] < 1 << 30 or math.isnan(growth[0]), f"peak RSS grew by {growth[0] / 2**20:.0f} MiB"


def test_fuzz_saved_trace_manifest(tmp_path_factory):
    """Mutations of a saved trace's manifest.json."""
    from memlens.trace import Trace
    import pandas as pd
    base = tmp_path_factory.mktemp("fuzzstore")
    blocks = pd.DataFrame({"block_id": [0, 1], "device": "cuda:0", "size": [512, 1024], "alloc_ns": [0, 5],
                           "free_ns": [10, 20]})
    original = Trace.from_tables(blocks, metadata={"name": "x", "notes": ["n"]}).save(base / "t.memlens")
    manifest = (original / "manifest.json").read_bytes()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(MUTATIONS)
    def fuzz(ops):
        (original / "manifest.json").write_bytes(_mutate(manifest, ops))
        code, out, err = _run("info", "--json", original)
        assert code in (0, 2), (code, err)
        assert "Traceback" not in err
        if code == 0:
            _check_numbers(json.loads(out))
        else:
            assert len(err.strip().splitlines()) == 1, err

    fuzz()


@pytest.mark.parametrize("text", [
    b"id,lower,upper,size\n0,0,id,lower,upper,size\n0,0,10,512\n",  # found by this fuzzer: was exit 1
    b"id,lower,upper,size\n0,0,10,512,7,8\n",                         # extra fields were silently dropped
])
def test_csv_rows_with_more_fields_than_the_header(tmp_path, text):
    path = tmp_path / "extra.csv"
    path.write_bytes(text)
    code, _, err = _run("info", path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
