"""Issue 18, item 17: the compiled snapshot-pickle walker (memlens/io/native/stream_walk.cpp) and the Python
one (memlens/io/snapshot/stream.py) make the same decisions and give the same results: on the hostile
inputs of tests/unit/test_hostile_input.py, on hand-made opcode sequences at each check, on seeded random
mutations of real-looking snapshots, and on the shared real snapshots.
How they read stack frames, and the compiled walk's memory, are checked in
tests/unit/test_import_snapshot_frames.py."""
from __future__ import annotations

import gzip
import pickle
import random
import struct
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_fuzz_inputs import HOSTILE_BYTES, _snapshot  # noqa: E402

from _snapshot_walker_cases import FRAME, _canonical, _entry  # noqa: E402
from memlens.errors import InputError  # noqa: E402
from memlens.io import native  # noqa: E402
from memlens.io.snapshot import stream as snapshot_stream  # noqa: E402
from memlens.io.snapshot.importer import import_snapshot  # noqa: E402
from memlens.io.snapshot.frames import StackInterner  # noqa: E402
from memlens.io.snapshot.stream import stream_snapshot  # noqa: E402
from memlens.trace import OPTIONAL_TABLES, REQUIRED_TABLES  # noqa: E402

pytestmark = pytest.mark.skipif(not native.available(), reason="no C++ compiler: only the Python walker exists")


def _with(walker: str, monkeypatch, fn):
    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", walker)
    try:
        return ("ok", fn())
    except InputError as exc:
        return ("refused", str(exc))


def _stream_outcome(data: bytes):
    interner = StackInterner()
    try:
        result = stream_snapshot(data, interner)
    except InputError as exc:
        return ("refused", str(exc))
    if result is None:
        return ("general unpickler", None)
    return ("streamed", _canonical(result), interner.table().to_dict("list"), interner.odd_frames,
            interner.unknown_lines)


def _import_outcome(path: Path):
    try:
        trace = import_snapshot(path)
    except InputError as exc:
        return ("refused", str(exc))
    tables = {name: trace.table(name) for name in REQUIRED_TABLES + OPTIONAL_TABLES}
    return ("ok", tables, trace.metadata)


def _assert_same(a, b):
    assert a[0] == b[0], (a[0], b[0], a[1] if a[0] == "refused" else "", b[1] if b[0] == "refused" else "")
    if a[0] != "ok":
        assert a == b
        return
    for name, table in a[1].items():
        other = b[1][name]
        if table is None or other is None:
            assert table is None and other is None, name
        else:
            pd.testing.assert_frame_equal(table, other, obj=name)
    assert repr(a[2]) == repr(b[2])


def _both_streams(data: bytes, monkeypatch):
    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", "python")
    py = _stream_outcome(data)
    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", "compiled")
    c = _stream_outcome(data)
    assert repr(py) == repr(c)
    return py


def _both_imports(path: Path, monkeypatch):
    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", "python")
    py = _import_outcome(path)
    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", "compiled")
    c = _import_outcome(path)
    _assert_same(py, c)
    return py


def test_the_compiled_walker_is_the_one_used(monkeypatch):
    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", "compiled")
    assert snapshot_stream._compiled_walk() is native.load().walk
    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", "python")
    assert snapshot_stream._compiled_walk() is None


# ---- hostile inputs (those of test_hostile_input.py, at a scale a unit test affords) ----------------------
def _hostile() -> dict[str, bytes]:
    frame = dict(FRAME)
    real = bytearray(pickle.dumps({"segments": [], "device_traces": [
        [_entry(4096 * i, [dict(FRAME, line=i)]) for i in range(300)]]}, protocol=2))
    at = real.find(b"r" + struct.pack("<I", 300))
    real[at + 1:at + 5] = struct.pack("<I", 1 << 30)
    nested = b"\x80\x04" + b"]" * 200 + b"a" * 199 + b"."
    return {
        "memo index": b"\x80\x04]r" + struct.pack("<I", 1 << 27) + b".",
        "mutated memo index": bytes(real),
        "bytearray global": b"\x80\x04\x8c\x08builtins\x8c\tbytearray\x93J\x00\x00\x00\x40\x85R.",
        "eval global": b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c\x011\x85R.",
        "5000 frames": pickle.dumps({"segments": [], "device_traces": [[_entry(0, [frame] * 5000)]]}, protocol=4),
        "5000 frames, one by one": pickle.dumps({"segments": [], "device_traces": [[_entry(0, [frame] * 5000)]]},
                                                protocol=0 + 2),
        "nesting 200": nested,
        "marks 200": b"\x80\x04" + b"(" * 200 + b"N" + b"t" * 200 + b".",
        "flood of NONE": b"\x80\x04" + b"N" * 1_000_001 + b".",
        "flood of gets": b"\x80\x04N\x94" + b"j\x00\x00\x00\x00" * 1_000_001 + b".",
        "flood of memoize": b"\x80\x04N" + b"\x94" * 2_000_000 + b"h\x07\x86.",
        "persistent id": b"\x80\x04\x8c\x01xQ.",
    }


@pytest.mark.parametrize("name", list(_hostile()))
def test_hostile_inputs_get_the_same_decision(name, tmp_path, monkeypatch):
    data = _hostile()[name]
    _both_streams(data, monkeypatch)
    path = tmp_path / "h.pickle"
    path.write_bytes(data)
    _both_imports(path, monkeypatch)


def test_frames_limit_is_hit_at_the_same_point(monkeypatch):
    monkeypatch.setenv("MEMLENS_MAX_FRAMES", "300")
    data = pickle.dumps({"segments": [], "device_traces": [[_entry(0, [dict(FRAME)] * 301)]]}, protocol=4)
    outcome = _both_streams(data, monkeypatch)
    assert outcome[0] == "refused" and "300" in outcome[1]


# ---- every opcode's edge (what each branch of the loop checks) ------------------------------------------
EDGES = {
    "tuple2 on one item": b"\x80\x04K\x01\x86.",
    "tuple3 on empty stack": b"\x80\x04\x87.",
    "tuple1 on empty stack": b"\x80\x04\x85.",
    "tuple from mark": b"\x80\x04(K\x01K\x02t.",
    "tuple without mark": b"\x80\x04K\x01t.",
    "setitems odd": b"\x80\x04}(K\x01K\x02K\x03u.",
    "setitems on list": b"\x80\x04](K\x01K\x02u.",
    "setitems unhashable key": b"\x80\x04}(]K\x02u.",
    "setitem": b"\x80\x04}K\x01K\x02s.",
    "setitem short": b"\x80\x04K\x01s.",
    "append": b"\x80\x04]K\x01a.",
    "append on dict": b"\x80\x04}K\x01a.",
    "append empty": b"\x80\x04a.",
    "appends without mark": b"\x80\x04]K\x01e.",
    "floats": b"\x80\x04G" + struct.pack(">d", 1.5) + b"G" + struct.pack(">d", float("nan")) + b"\x86.",
    "float truncated": b"\x80\x04G\x00\x00.",
    "long1": b"\x80\x04\x8a\x09" + (2**70 - 3).to_bytes(9, "little", signed=True) + b".",
    "long1 negative": b"\x80\x04\x8a\x02\xff\x80.",
    "long1 empty": b"\x80\x04\x8a\x00.",
    "long1 truncated": b"\x80\x04\x8a\x09\x01.",
    "binint": b"\x80\x04J\xff\xff\xff\xff.",
    "binint2": b"\x80\x04M\xff\xfe.",
    "binint truncated": b"\x80\x04J\x01.",
    "binunicode": b"\x80\x04X\x03\x00\x00\x00abc.",
    "binunicode bad utf8": b"\x80\x04X\x02\x00\x00\x00\xff\xfe.",
    "binunicode surrogate": b"\x80\x04X\x03\x00\x00\x00\xed\xb2\x80.",
    "binunicode too long": b"\x80\x04X\xff\xff\xff\x7fabc.",
    "short_binunicode too long": b"\x80\x04\x8c\xffab.",
    "frame": b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x07.",
    "frame past the end": b"\x80\x04\x95\x05\x00\x00",
    "protocol 6": b"\x80\x06N.",
    "no stop": b"\x80\x04N",
    "two at stop": b"\x80\x04NN.",
    "mark open at stop": b"\x80\x04(N.",
    "empty": b"",
    "memoize empty stack": b"\x80\x04\x94.",
    "binput in order": b"\x80\x02]q\x00h\x00\x86.",
    "binput out of order": b"\x80\x02]q\x01.",
    "long_binput out of order": b"\x80\x02]r\x05\x00\x00\x00.",
    "binget unfilled": b"\x80\x04h\x00.",
    "long_binget unfilled": b"\x80\x04j\x00\x00\x00\x00.",
    "long_binget truncated": b"\x80\x04]\x94j\x00\x00.",
    "long_binget run then short": b"\x80\x04]\x94(j\x00\x00\x00\x00j\x00\x00t.",
    "bools and none": b"\x80\x04(\x88\x89N)t.",
    "shared list twice": b"\x80\x04]\x94(K\x01eh\x00\x86.",
    "unknown opcode": b"\x80\x04c__builtin__\nset\n.",
    "entries appended to a non-empty list": pickle.dumps(
        {"segments": [], "device_traces": [[1, _entry(0, [FRAME])]]}, protocol=4),
    "entries outside device_traces": pickle.dumps({"x": [_entry(0, [FRAME])]}, protocol=4),
    "entry appended alone": b"\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\rdevice_traces\x94]\x94]\x94}\x94("
                            b"\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94K\x10uaau.",
    "reference to a converted entry": b"\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\rdevice_traces\x94]\x94]"
                                      b"\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94ue]\x94h\x06a\x86u.",
}


@pytest.mark.parametrize("name", list(EDGES))
def test_opcode_edges_get_the_same_decision(name, monkeypatch):
    _both_streams(EDGES[name], monkeypatch)


def test_edges_that_stream_do_stream(monkeypatch):
    # the Python loop accepts these (derived by reading its branches); the compiled one must not refuse them
    for name in ("tuple2 on one item", "floats", "long1", "binunicode surrogate", "frame", "binput in order",
                 "shared list twice", "entry appended alone"):
        assert _both_streams(EDGES[name], monkeypatch)[0] == "streamed", name
    assert _both_streams(EDGES["long1"], monkeypatch)[1] == 2**70 - 3
    assert _both_streams(EDGES["tuple2 on one item"], monkeypatch)[1] == (1,)


# ---- seeded random mutations --------------------------------------------------------------------------
def _distinct_snapshot() -> dict:
    trace = [_entry(4096 * (i // 2 + 1), [dict(FRAME, line=i, name=f"f{i % 7}")] * (i % 3 + 1),
                    "alloc" if i % 2 == 0 else "free_completed") for i in range(40)]
    shared_frames = [dict(FRAME)]
    trace += [_entry(4096 * (100 + i), shared_frames) for i in range(30)]
    snap = _snapshot()
    snap["device_traces"].append(trace)
    return snap


def _mutants(seed: int, count: int):
    rng = random.Random(seed)
    seeds_ = [pickle.dumps(_snapshot(), protocol=4), pickle.dumps(_snapshot(), protocol=2),
              pickle.dumps(_distinct_snapshot(), protocol=4), pickle.dumps(_distinct_snapshot(), protocol=2)]
    for _ in range(count):
        buf = bytearray(rng.choice(seeds_))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(buf))
            kind = rng.randrange(5)
            if kind == 0:
                buf[at] ^= rng.randint(1, 255)
            elif kind == 1:
                del buf[at:]
            elif kind == 2:
                buf[at:at] = rng.choice(HOSTILE_BYTES)
            elif kind == 3:
                buf[at:at] = buf[at:at + rng.randint(1, 64)]
            else:
                buf[at:at + 1] = bytes([rng.choice(b"(tue]a}N\x94h\x85\x86\x87.")])
            if not buf:
                break
        yield bytes(buf)


def test_mutated_snapshots_get_the_same_decisions_and_results(monkeypatch, tmp_path):
    kinds = set()
    for data in _mutants(seed=18, count=1500):
        kinds.add(_both_streams(data, monkeypatch)[0])
    # the corpus reaches every outcome, so the comparison is not vacuous
    assert kinds >= {"streamed", "general unpickler"}
    path = tmp_path / "m.pickle"
    for data in list(_mutants(seed=19, count=40)):
        path.write_bytes(data)
        _both_imports(path, monkeypatch)


# ---- the shared real snapshots, and a distinct-stacks one -------------------------------------------------
@pytest.mark.parametrize("name", ["cs336_wedsonlin_medium_128_inference.pickle",
                                  "cs336_wedsonlin_medium_128_training.pickle", "decomfl_memory.pickle",
                                  "flexgen_opt1.3b_2023format.pickle", "verl_segments_only.pickle"])
def test_shared_snapshots_import_the_same(name, shared, monkeypatch):
    path = shared(f"snapshots/{name}")
    data = path.read_bytes()
    _both_streams(data, monkeypatch)
    outcome = _both_imports(path, monkeypatch)
    assert outcome[0] == "ok"


def test_distinct_stacks_gzip_snapshot_imports_the_same(tmp_path, monkeypatch):
    entries = [_entry(4096 * (i // 2 + 1), [{"name": f"fn_{i}_{d}", "filename": f"/src/m{d}.py", "line": i + d}
                                            for d in range(12)], "alloc" if i % 2 == 0 else "free_completed")
               for i in range(2500)]
    path = tmp_path / "distinct.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4)))
    outcome = _both_imports(path, monkeypatch)
    assert outcome[0] == "ok"
    stacks = outcome[1]["stacks"]
    assert stacks["stack_id"].nunique() == 2500 and len(stacks) == 2500 * 12  # every event its own stack
    assert np.array_equal(np.sort(outcome[1]["blocks"]["size"].to_numpy()), np.full(1250, 512))
