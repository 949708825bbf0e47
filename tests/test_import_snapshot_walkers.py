"""Issue 18, item 17: the compiled snapshot-pickle walker (memlens/io/native/stream_walk.cpp) and the Python
one (memlens/io/snapshot_stream.py) make the same decisions and give the same results: on the hostile
inputs of tests/test_hostile_input.py, on hand-made opcode sequences at each check, on seeded random
mutations of real-looking snapshots, and on the shared real snapshots."""
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

sys.path.insert(0, str(Path(__file__).parent))
from test_fuzz_inputs import HOSTILE_BYTES, _snapshot  # noqa: E402

from memlens.errors import InputError  # noqa: E402
from memlens.io import native, snapshot_stream  # noqa: E402
from memlens.io.snapshot import import_snapshot  # noqa: E402
from memlens.io.snapshot_frames import StackInterner  # noqa: E402
from memlens.io.snapshot_stream import EntryColumns, stream_snapshot  # noqa: E402
from memlens.trace import OPTIONAL_TABLES, REQUIRED_TABLES  # noqa: E402

pytestmark = pytest.mark.skipif(not native.available(), reason="no C++ compiler: only the Python walker exists")

FRAME = {"name": "forward", "filename": "/home/u/model.py", "line": 12}


def _entry(addr: int, frames: list, action: str = "alloc") -> dict:
    return {"action": action, "addr": addr, "size": 512, "stream": 0, "time_us": addr, "frames": frames}


def _with(walker: str, monkeypatch, fn):
    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", walker)
    try:
        return ("ok", fn())
    except InputError as exc:
        return ("refused", str(exc))


def _canonical(value):
    """Comparable form of a streamed snapshot (EntryColumns as plain lists)."""
    if isinstance(value, EntryColumns):
        return ("columns", {k: list(v) for k, v in value.ints.items()}, list(value.stack_id),
                {k: list(v) for k, v in value.codes.items()}, value.names)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_canonical(v) for v in value)
    if isinstance(value, float) and value != value:
        return "nan"
    return value


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


def test_interner_reads_usual_and_odd_frames():
    # the usual frame takes a fast path; every odd one must still be read as before (by hand, from the rules in
    # StackInterner._frame: a non-dict is its text, a line that is not a non-negative int64 is 0 and counted)
    interner = StackInterner()
    frames = [{"name": "f", "filename": "a.py", "line": 3}, {"name": "g", "filename": "b.py", "line": 2**64 - 1},
              {"name": "h", "filename": "c.py", "line": "12"}, {"name": 5, "filename": None, "line": None},
              {"filename": "d.py", "line": -1}, "text frame", {"name": "i", "filename": "e.py", "line": True}]
    assert interner.intern(frames) == 0
    table = interner.table()
    assert list(table["name"]) == ["f", "g", "h", "5", "", "text frame", "i"]
    assert list(table["filename"]) == ["a.py", "b.py", "c.py", "None", "d.py", "", "e.py"]
    assert list(table["line"]) == [3, 0, 12, 0, 0, 0, 1]
    assert interner.unknown_lines == 2 and interner.odd_frames == 1


@pytest.mark.parametrize("walker", ["python", "compiled"])
def test_frame_dicts_shared_across_batches_are_read_once_per_stack(walker, tmp_path, monkeypatch):
    # the streaming reader frees frame dicts after each batch of 1,000 entries (replacing them by read frames);
    # a C++ frame shared by all 2,500 entries must still make 6 stacks ({bad, good_i} in 2 orders x 3), each
    # reading the bad line once: 6 repairs, as when nothing is freed
    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", walker)
    bad = {"name": "c10::alloc", "filename": "", "line": 2**64 - 1}
    good = [{"name": f"f{i}", "filename": "a.py", "line": i} for i in range(3)]
    entries = [_entry(4096 * (i + 1), [bad, good[i % 3]] if i % 2 else [good[i % 3], bad]) for i in range(2500)]
    path = tmp_path / "shared_frames.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    trace = import_snapshot(path)
    assert trace.stacks["stack_id"].nunique() == 6 and len(trace.stacks) == 12
    assert trace.metadata["notes"] and any("6 stack frames with a negative" in n for n in trace.metadata["notes"])
    sid = trace.blocks.sort_values("alloc_ns")["stack_id"].to_numpy()
    # entry i has the stack of entry i % 6, in every batch, and entries 0..5 six different ones
    assert len(set(sid[:6])) == 6 and (sid == sid[np.arange(2500) % 6]).all()


@pytest.mark.parametrize("walker", ["python", "compiled"])
def test_repairs_count_once_per_stack_as_written(walker, tmp_path, monkeypatch):
    # two stacks that differ only in their bad line (2**64-1 and -1, both read as line 0) are one stack in
    # `stacks` but two repairs; the same bad stack repeated in 30 entries (new lists of new dicts each time,
    # as torch writes them) is one repair; by hand: 2 + 1 = 3 bad lines, one odd (text) frame
    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", walker)
    good = {"name": "g", "filename": "a.py", "line": 1}
    entries = [_entry(4096, [dict(good), {"name": "c", "filename": "", "line": 2**64 - 1}]),
               _entry(8192, [dict(good), {"name": "c", "filename": "", "line": -1}])]
    entries += [_entry(4096 * (3 + i), [{"name": "d", "filename": "", "line": "x"}, "text frame"]) for i in range(30)]
    path = tmp_path / "repairs.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    trace = import_snapshot(path)
    assert trace.stacks["stack_id"].nunique() == 2
    notes = " ".join(trace.metadata["notes"])
    assert "3 stack frames with a negative" in notes and "1 stack frames or frame lists that were not" in notes


def _distinct_stacks_pickle(entries: int, frames: int) -> bytes:
    return pickle.dumps({"segments": [], "device_traces": [[
        _entry(4096 * (i // 2 + 1), [{"name": f"fn_{i}_{d}", "filename": f"/src/m{d}.py", "line": i + d}
                                     for d in range(frames)], "alloc" if i % 2 == 0 else "free_completed")
        for i in range(entries)]]}, protocol=4)


def test_compiled_walk_keeps_no_python_object_per_frame(monkeypatch):
    # the compiled walker frees each batch's frame dicts and keeps only the memo slots that a GET reads again:
    # its Python heap peak (tracemalloc: Python objects only) is a small fraction of what pickle.loads builds
    # (every frame dict, name, file name and line), here 60,000 frames with distinct names
    import tracemalloc

    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", "compiled")
    data = _distinct_stacks_pickle(3000, 20)
    tracemalloc.start()
    try:
        loaded = pickle.loads(data)
        _, full_peak = tracemalloc.get_traced_memory()
        del loaded
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        from memlens.io.snapshot_frames import new_stack_interner

        interner = new_stack_interner()
        assert stream_snapshot(data, interner) is not None
        _, stream_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # what remains are the distinct names (one str each, needed for the stacks table) and a batch in flight
    assert stream_peak - base < full_peak / 2, (stream_peak - base, full_peak)


def test_dropping_read_pages_of_an_mmap_changes_nothing(tmp_path, monkeypatch):
    # the compiled walker gives back the pages of a read-only mmap every 16 MiB it reads; a file past 32 MiB
    # streams to the same result as the same bytes in memory (where nothing is dropped)
    import mmap

    from memlens.io.snapshot_frames import new_stack_interner

    monkeypatch.setenv("MEMLENS_PICKLE_WALKER", "compiled")
    data = _distinct_stacks_pickle(28000, 30)
    assert len(data) > 32 << 20
    path = tmp_path / "big.pickle"
    path.write_bytes(data)
    in_memory = new_stack_interner()
    from_bytes = _canonical(stream_snapshot(data, in_memory))
    mapped = new_stack_interner()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        from_mmap = _canonical(stream_snapshot(mm, mapped, drop_read_pages=True))
        assert mm[:len(data)] == data  # the mapping still reads the file after its pages were dropped
    assert from_mmap == from_bytes
    pd.testing.assert_frame_equal(mapped.table(), in_memory.table())


def test_interning_ends_with_done_interning():
    from memlens.io.snapshot_frames import CompiledStackInterner

    for interner in (StackInterner(), CompiledStackInterner()):
        sid = interner.intern([dict(FRAME)])
        interner.done_interning()
        assert sid == 0 and len(interner.table()) == 1
        with pytest.raises(RuntimeError):
            interner.intern([dict(FRAME, line=13)])
