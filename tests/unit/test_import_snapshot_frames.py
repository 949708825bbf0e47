"""The snapshot-pickle walkers' stack frames and memory: the interner reads the usual frame
and every odd one as the rules say (by hand), frame dicts shared across the streaming reader's batches make the
same stacks and repairs as when nothing is freed, a repair counts once per stack as written (both walkers),
the compiled walk keeps no Python object per frame (tracemalloc), dropping an mmap's read pages changes
nothing, and interning ends with done_interning. Whether both walkers decide alike is checked in
tests/integration/test_import_snapshot_walkers.py.
"""
from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest

from _snapshot_walker_cases import FRAME, _canonical, _entry
from memlens.io import native
from memlens.io.snapshot.importer import import_snapshot
from memlens.io.snapshot.frames import StackInterner
from memlens.io.snapshot.stream import stream_snapshot

pytestmark = pytest.mark.skipif(not native.available(), reason="no C++ compiler: only the Python walker exists")


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
        from memlens.io.snapshot.frames import new_stack_interner

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

    from memlens.io.snapshot.frames import new_stack_interner

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
    from memlens.io.snapshot.frames import CompiledStackInterner

    for interner in (StackInterner(), CompiledStackInterner()):
        sid = interner.intern([dict(FRAME)])
        interner.done_interning()
        assert sid == 0 and len(interner.table()) == 1
        with pytest.raises(RuntimeError):
            interner.intern([dict(FRAME, line=13)])
