"""Hand-computed cases for the recording's close that mutation testing showed no test pinned:
the allocator join's clock-offset correction, the before-recording fix-up, a CUDA block kept until its
allocator free, allocations only the allocator saw, the recording window; every expected value is worked
out in the comments from the inputs."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from memlens.recording.instruments import AllocatorData
from memlens.recording.join import MATCH_TOLERANCE_NS, join_allocator
from test_record_cuda_paths import _dispatch_blocks

US = 1000   # ns per us


def _ops(intervals, names, modules, stack_ids=None):
    n = len(intervals)
    df = pd.DataFrame({"op_id": np.arange(n), "name": names, "start_ns": [a for a, _ in intervals],
                       "end_ns": [b for _, b in intervals], "module": modules})
    if stack_ids is not None:
        df["stack_id"] = pd.array(stack_ids, dtype="Int64")
    return df


def _blocks(rows, stack=False):
    """The dispatch blocks of `rows` (as test_record_cuda_paths builds them), with stack ids if `stack`."""
    df = _dispatch_blocks(rows)
    if stack:
        df["stack_id"] = pd.array([7] * len(df), dtype="Int64")
    return df


def _events(rows):
    """(t_ns, device, addr, delta) rows -> the profiler's event table (unix ns; the tests pass offset 0)."""
    return pd.DataFrame(rows, columns=["t_unix_ns", "device", "addr", "delta"])


def _no_accesses():
    return pd.DataFrame({"block_id": np.empty(0, np.int64), "t_ns": np.empty(0, np.int64),
                         "op_id": np.empty(0, np.int64), "is_write": np.empty(0, bool)})


def test_a_clock_offset_is_estimated_from_the_matched_blocks_and_removed():
    """The allocator's clock runs 50 us late. Ops: 0 [1000, 2000] us, 1 [3000, 4000], 2 [5000, 6000]. Blocks
    (CPU) made by ops 0, 1, 2 truly allocated at 1500, 3990, 5980 us, seen at their op's end (2000, 4000,
    6000); the allocator says 1550, 4040, 6030, and frees at 2500 us an address it never saw allocated (a
    fourth allocator block, with no alloc time: neither matched nor added). Before correction: B0's
    [1550, 3550] contains 2000; B1 and B2 are nearest within 200 us. Distances outside the op: 0, 40, 30 us
    -> median 30 us, removed: 1520, 4010, 6000. Rematched, then clamped into the op: 1520, 4000 (op 1 ends
    at 4000), 6000. B2's free, unknown to the dispatch mode, is the allocator's 7050 - 30 = 7020 us; B0
    keeps its own free (3500)."""
    ops = _ops([(1000 * US, 2000 * US), (3000 * US, 4000 * US), (5000 * US, 6000 * US)],
               ["aten::mm", "aten::add", "aten::relu"], ["m.a", "m.b", "m.c"])
    blocks = _blocks([(0, "cpu", 100, 64, 1000 * US, 3500 * US, 0, False, "activation", "r"),
                      (1, "cpu", 200, 32, 3000 * US, 5500 * US, 1, False, "activation", "r"),
                      (2, "cpu", 300, 16, 5000 * US, None, 2, False, "activation", "r")])
    ev = _events([(1550 * US, "cpu", 100, 64), (3550 * US, "cpu", 100, -64),
                  (4040 * US, "cpu", 200, 32), (5550 * US, "cpu", 200, -32),
                  (6030 * US, "cpu", 300, 16), (7050 * US, "cpu", 300, -16), (2500 * US, "cpu", 900, -8)])
    notes = []
    out, stats = join_allocator(blocks, _no_accesses(), ops, AllocatorData(events=ev), 0, notes)
    out = out.to_frame()
    assert stats["profiler"] == {"allocator_blocks": 4, "matched": 3, "allocator_only": 0, "dispatch_only": 0,
                                 "clock_offset_ns": 30 * US}
    assert notes == ["profiler clock offset corrected by 30.0 us"]
    assert out["alloc_ns"].tolist() == [1520 * US, 4000 * US, 6000 * US]
    assert out["free_ns"].tolist() == [3500 * US, 5500 * US, 7020 * US]
    assert out["source"].tolist() == ["dispatch+profiler"] * 3
    assert out["allocator_size"].tolist() == [64, 32, 16]


def test_an_offset_of_a_microsecond_or_less_is_left_alone():
    """One block, allocated 1 us after its op's end (1000 ns outside: not more than 1000, no correction);
    its alloc time is clamped to the op's end, 2000 us."""
    ops = _ops([(1000 * US, 2000 * US)], ["aten::mm"], ["m"])
    blocks = _blocks([(0, "cpu", 100, 64, 1000 * US, None, 0, False, "activation", "r")])
    ev = _events([(2001 * US, "cpu", 100, 64)])
    notes = []
    out, stats = join_allocator(blocks, _no_accesses(), ops, AllocatorData(events=ev), 0, notes)
    assert stats["profiler"]["clock_offset_ns"] == 0 and stats["profiler"]["matched"] == 1 and notes == []
    frame = out.to_frame()
    assert frame["alloc_ns"].tolist() == [2000 * US] and frame["free_ns"].isna().all()


def test_before_recording_blocks_the_allocator_saw_made_and_allocator_only_rows():
    """Ops: 0 aten::mm [1000, 2000] us, 1 aten::add [3000, 4000], 2 aten::relu [5000, 6000] (stacks 11, 12, 13).
    C0 (cuda:0, 1000 bytes) was first seen as an input of op 1 at 3200 us, flagged allocated before the
    recording, its tensor dead at 3500 us. The allocator made it at 2500 us (1024 bytes: CUDA rounds up) and
    freed it at 3800 us (a record_stream use): matched (2500 <= 3200 <= 3800), alloc 2500 us, free 3800 us
    (later than the tensor's), no longer "before", its unknown category's rule says the allocator saw it made.
    Allocator only (CPU, 8 bytes each):
      0x2000 at 2800 us (between ops 0 and 1), freed 3100 us inside op 1: an argument op 1's binding
             converted -> op 1, alloc clamped to 3000, free 3100, temporary, stack 12;
      0x3000 at 1500 us inside op 0, freed at 5000 us: op 0, alloc 1500, free 5000, unknown, stack 11;
      0x4000 at 4500 us, between ops, never freed: no op, stays unknown, no stack;
      0x7000 at 1500 us inside op 0, freed at 3500 us inside op 1: op 0 (not moved to op 1), unknown;
      0x8000 at 2600 us between ops 0 and 1, freed at 5500 us (after op 1's end + 200 us): no op, unknown;
      0x9000 at 2700 us between ops 0 and 1, freed at exactly 3000 us (op 1's start): op 1, alloc and free
             3000 us, temporary, stack 12.
    Dispatch only (no allocator event at their address): D1 (made by op 0 at 1100 us) keeps its alloc time;
    D2 (before the recording, unknown) stays before, its rule unchanged."""
    ops = _ops([(1000 * US, 2000 * US), (3000 * US, 4000 * US), (5000 * US, 6000 * US)],
               ["aten::mm", "aten::add", "aten::relu"], ["m.a", "m.b", "m.c"], stack_ids=[11, 12, 13])
    blocks = _blocks([(5, "cuda:0", 0x1000, 1000, None, 3500 * US, None, True, "unknown", "input"),
                      (3, "cpu", 0x5000, 16, 1100 * US, 1900 * US, 0, False, "activation", "r"),
                      (4, "cpu", 0x6000, 16, None, None, None, True, "unknown", "input")], stack=True)
    accesses = pd.DataFrame({"block_id": [5, 5], "t_ns": [3300 * US, 3200 * US], "op_id": [1, 1],
                             "is_write": [False, False]})
    ev = _events([(2500 * US, "cuda:0", 0x1000, 1024), (3800 * US, "cuda:0", 0x1000, -1024),
                  (2800 * US, "cpu", 0x2000, 8), (3100 * US, "cpu", 0x2000, -8),
                  (1500 * US, "cpu", 0x3000, 8), (5000 * US, "cpu", 0x3000, -8),
                  (4500 * US, "cpu", 0x4000, 8), (1500 * US, "cpu", 0x7000, 8), (3500 * US, "cpu", 0x7000, -8),
                  (2600 * US, "cpu", 0x8000, 8), (5500 * US, "cpu", 0x8000, -8),
                  (2700 * US, "cpu", 0x9000, 8), (3000 * US, "cpu", 0x9000, -8)])
    notes = []
    out, stats = join_allocator(blocks, accesses, ops, AllocatorData(events=ev), 0, notes)
    assert stats["profiler"] == {"allocator_blocks": 7, "matched": 1, "allocator_only": 6, "dispatch_only": 2,
                                 "clock_offset_ns": 0}
    assert notes == []
    df = out.to_frame()
    c0 = df.iloc[0]
    assert (c0["alloc_ns"], c0["free_ns"], c0["allocator_size"], c0["size"]) == (2500 * US, 3800 * US, 1024, 1000)
    assert not c0["allocated_before"] and c0["category"] == "unknown" and c0["stack_id"] == 7
    assert c0["category_rule"] == "first seen as an input; the allocator saw it made"
    assert c0["source"] == "dispatch+profiler"
    d1, d2 = df.iloc[1], df.iloc[2]
    assert (d1["alloc_ns"], d1["free_ns"], d1["source"], d1["category_rule"]) == (1100 * US, 1900 * US, "dispatch", "r")
    assert pd.isna(d1["allocator_size"]) and not d1["allocated_before"]
    assert d2["allocated_before"] and d2["category_rule"] == "input" and pd.isna(d2["alloc_ns"])
    for col, dtype in blocks.dtypes.items():                      # the blocks' dtypes, allocator rows added
        assert df[col].dtype == dtype, col
    rest = df.iloc[3:].set_index("addr")
    assert sorted(rest["block_id"].tolist()) == [6, 7, 8, 9, 10, 11]   # after the largest block id, 5
    assert list(rest.columns) == [c for c in df.columns if c != "addr"]
    expect = {  # addr: (op, module, alloc_op_id, alloc_ns, free_ns, category, stack_id)
        0x2000: ("aten::add", "m.b", 1, 3000 * US, 3100 * US, "temporary", 12),
        0x3000: ("aten::mm", "m.a", 0, 1500 * US, 5000 * US, "unknown", 11),
        0x4000: ("", "", None, 4500 * US, None, "unknown", None),
        0x7000: ("aten::mm", "m.a", 0, 1500 * US, 3500 * US, "unknown", 11),
        0x8000: ("", "", None, 2600 * US, 5500 * US, "unknown", None),
        0x9000: ("aten::add", "m.b", 1, 3000 * US, 3000 * US, "temporary", 12)}
    for addr, (op, module, op_id, a_ns, f_ns, category, stack_id) in expect.items():
        row = rest.loc[addr]
        assert (row["op"], row["module"], row["category"]) == (op, module, category), hex(addr)
        for col, want in (("alloc_op_id", op_id), ("alloc_ns", a_ns), ("free_ns", f_ns), ("stack_id", stack_id)):
            assert (pd.isna(row[col]) if want is None else row[col] == want), (hex(addr), col)
        assert row["size"] == 8 and row["allocator_size"] == 8 and row["device"] == "cpu"
        assert row["source"] == "profiler" and row["stream"] == 0
        assert not row["allocated_before"] and not row["free_without_alloc"]
        assert row["category_rule"] == ("seen only by the allocator, freed inside the op that made it"
                                        if category == "temporary" else "seen only by the allocator")
    assert str(rest["alloc_ns"].dtype) == "Int64" and str(rest["stack_id"].dtype) == "Int64"


def test_events_outside_the_recording_window_are_left_out():
    """Window [0, 10000] us with 200 us of tolerance: allocations at -200 us and 10200 us are in, at
    -200.001 and 10200.001 us out (2 left out, 2 allocator-only blocks)."""
    tol = MATCH_TOLERANCE_NS
    assert tol == 200 * US
    window = 10_000 * US
    ops = _ops([(0, window)], ["aten::mm"], ["m"])
    blocks = _blocks([(0, "cpu", 1, 8, 0, None, 0, False, "activation", "r")])
    ev = _events([(-tol, "cpu", 10, 8), (-tol - 1, "cpu", 20, 8), (window + tol, "cpu", 30, 8),
                  (window + tol + 1, "cpu", 40, 8)])
    notes = []
    out, stats = join_allocator(blocks, _no_accesses(), ops, AllocatorData(events=ev), 0, notes, window_ns=window)
    assert notes == ["profiler: 2 allocator events outside the recording left out"]
    assert stats["profiler"]["allocator_blocks"] == 2
    assert sorted(out.to_frame()["addr"].tolist()[1:]) == [10, 30]
    # every event outside: nothing paired, the blocks unchanged (dtypes too)
    notes = []
    out, stats = join_allocator(blocks, _no_accesses(), ops, AllocatorData(events=ev.iloc[[1, 3]]), 0, notes,
                                window_ns=window)
    assert notes == ["profiler: 2 allocator events outside the recording left out"]
    assert stats["profiler"] == {"allocator_blocks": 0, "matched": 0, "allocator_only": 0, "dispatch_only": 1,
                                 "clock_offset_ns": 0}
    frame = out.to_frame()
    assert len(frame) == 1 and frame["source"].tolist() == ["dispatch"]
    for col, dtype in blocks.dtypes.items():
        assert frame[col].dtype == dtype, col


def test_allocations_of_a_recording_without_ops_belong_to_no_op():
    """No ops: an allocation at 5 us, freed at 9 us, is added with no op, unknown, its own times."""
    ops = pd.DataFrame({"op_id": np.empty(0, np.int64), "name": np.empty(0, object),
                        "start_ns": np.empty(0, np.int64), "end_ns": np.empty(0, np.int64),
                        "module": np.empty(0, object)})
    blocks = _blocks([(0, "cpu", 1, 8, None, None, None, True, "unknown", "input")])
    ev = _events([(5 * US, "cpu", 64, 8), (9 * US, "cpu", 64, -8)])
    out, stats = join_allocator(blocks, _no_accesses(), ops, AllocatorData(events=ev), 0, [])
    assert stats["profiler"]["allocator_only"] == 1
    row = out.to_frame().iloc[1]
    assert (row["op"], row["module"], row["category"], row["alloc_ns"], row["free_ns"]) == ("", "", "unknown",
                                                                                             5 * US, 9 * US)
    assert pd.isna(row["alloc_op_id"]) and row["block_id"] == 1


def test_profiler_cuda_events_give_way_to_the_snapshot():
    """With a CUDA snapshot, the profiler's CUDA events are dropped (the snapshot has them) and its CPU
    events kept: the profiler stream pairs 1 CPU allocation, not the 2 CUDA ones."""
    from test_record_cuda_paths import constructed_snapshot
    snap = constructed_snapshot(0)
    ops = _ops([(0, 100 * US)], ["aten::mm"], ["m"])
    blocks = _blocks([(0, "cpu", 1, 8, 0, None, 0, False, "activation", "r")])
    ev = _events([(10 * US, "cuda:0", 0x10, 512), (11 * US, "cpu", 0x20, 8), (12 * US, "cuda:1", 0x30, 512)])
    out, stats = join_allocator(blocks, _no_accesses(), ops, AllocatorData(events=ev, snapshot=snap), 0, [])
    assert stats["profiler"]["allocator_blocks"] == 1
    assert stats["cuda_snapshot"]["allocator_blocks"] == 2       # A and W of the constructed snapshot


# ---- event order, spill directory, cost-facts cache -------------------------------------------------------
def test_event_order_ties_between_blocks_and_missing_times():
    """Blocks (id: alloc, free): 0: [0, 30), 1: [20, 40), 2: [10, 20), 3: alloc missing, freed at 0,
    4: alloc 5, free missing (value 5), 5: alloc 7, free missing (value 0).
    Events: 3's alloc (missing: first, 0); @0 3's free (a free before an alloc at one time, 1) then 0's alloc
    (2) - 3 is not zero-length, its alloc is missing; @5 4's alloc (3); @7 5's alloc (4); @10 2's alloc (5);
    @20 2's free (6) before 1's alloc (7) although block 1 < 2; @30 0's free (8); @40 1's free (9); then the
    missing frees by block id: 4 (10), 5 (11) - 4 is not zero-length, its free is missing."""
    from memlens.trace import event_order
    alloc_seq, free_seq = event_order(np.arange(6), np.array([0, 20, 10, 0, 5, 7]),
                                      np.array([False, False, False, True, False, False]),
                                      np.array([30, 40, 20, 0, 5, 0]),
                                      np.array([False, False, False, False, True, True]))
    assert alloc_seq.tolist() == [2, 7, 5, 0, 3, 4]
    assert free_seq.tolist() == [8, 9, 6, 1, 10, 11]
    assert alloc_seq.dtype == np.int64 and free_seq.dtype == np.int64


def test_spill_directory_is_removed_only_by_the_process_that_made_it(tmp_path):
    from memlens.recording import spill
    prefix = spill.spill_prefix()
    assert os.path.basename(os.path.dirname(prefix)).startswith("memlens-spill-")
    assert os.path.basename(prefix).startswith("rec")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "rec0.t0").write_bytes(b"x")
    spill._remove_directory(os.getpid() + 1, str(mine))       # a forked child's exit: the parent's stays
    assert (mine / "rec0.t0").exists()
    spill._remove_directory(os.getpid(), str(mine))
    assert not mine.exists()
    spill._remove_directory(os.getpid(), str(mine))           # already gone: no error
    # a name that cannot be removed as a file (a directory) is left, the others go
    d = tmp_path / "spill"
    d.mkdir()
    (d / "rec3.t0").mkdir()
    (d / "rec3.mem").write_bytes(b"x")
    spill.remove_spill_files(str(d / "rec3"))
    assert sorted(os.listdir(d)) == ["rec3.t0"]


def _addcdiv(shape2):
    t = ("tensor", 6, (4, 8))                               # float32 [4, 8]
    return ("aten::addcdiv_", [t, t, ("tensor", 6, shape2), 0.5], [t])


def test_facts_cache_keys_on_inputs_and_is_reused_within_a_call(monkeypatch):
    """Two addcdiv_ signatures that differ only in the second tensor's shape ([4, 8] vs a broadcast [8]) have
    other facts (bytes read 3 * 128 vs 2 * 128 + 32); a signature met twice is decoded once."""
    from memlens.opfacts.costs import op_costs
    from memlens.recording import compiled_signatures as cs
    monkeypatch.setattr(cs, "_FACTS_BY_SIGNATURE", {})
    monkeypatch.setattr(cs, "_FACTS_BY_SHAPES", {})
    decoded = [_addcdiv((4, 8)), _addcdiv((8,))]
    raws = [np.int64(0).tobytes() + b"a", np.int64(0).tobytes() + b"b"]
    calls = []

    def decode(i):
        calls.append(i)
        return decoded[i]
    facts = cs.signature_facts([raws[0], raws[1], raws[0], raws[1]], ["aten::addcdiv_"], decode)
    assert calls == [0, 1]
    assert facts[0].bytes_read == 3 * 4 * 8 * 4 and facts[1].bytes_read == 2 * 4 * 8 * 4 + 8 * 4
    assert facts[2] == facts[0] and facts[3] == facts[1]
    assert facts[1] == op_costs(*cs.compiled_record(*decoded[1]))
    # a later recording with the same signatures decodes nothing
    assert cs.signature_facts(raws, ["aten::addcdiv_"], decode) == facts[:2] and calls == [0, 1]


def test_facts_caches_restart_past_their_limit(monkeypatch):
    """With a limit of 2: caches holding 2 entries are kept, holding 3 are emptied before the call adds its own."""
    from memlens.recording import compiled_signatures as cs
    for held, kept in ((2, True), (3, False)):
        by_sig = {("old", bytes([i])): None for i in range(held)}
        by_shape = {("old", i): None for i in range(held)}
        monkeypatch.setattr(cs, "_FACTS_BY_SIGNATURE", by_sig)
        monkeypatch.setattr(cs, "_FACTS_BY_SHAPES", by_shape)
        monkeypatch.setattr(cs, "_FACTS_CACHE_LIMIT", 2)
        cs.signature_facts([np.int64(0).tobytes() + b"a"], ["aten::addcdiv_"], lambda i: _addcdiv((4, 8)))
        assert (("old", b"\x00") in by_sig) == kept and (("old", 0) in by_shape) == kept
        assert len(by_sig) == held + 1 if kept else len(by_sig) == 1
        assert len(by_shape) == held + 1 if kept else len(by_shape) == 1


def test_shapes_only_is_computed_once_per_op(monkeypatch):
    """addcdiv_ has no flop formula (its facts read tensors only), addmm has one, mkldnn_convolution one
    through its alias (convolution_overrideable), an unknown op resolves to
    nothing (not shapes-only); each answer is kept, and a kept answer is used as it is."""
    from memlens.recording import compiled_signatures as cs
    monkeypatch.setattr(cs, "_SHAPES_ONLY", {"aten::mm": True})          # a kept answer, deliberately wrong
    assert cs._shapes_only("aten::addcdiv_") is True
    assert cs._shapes_only("aten::addmm") is False
    assert cs._shapes_only("aten::mkldnn_convolution") is False          # a formula through its alias
    assert cs._shapes_only("aten::no_such_op_here") is False
    assert cs._shapes_only("aten::mm") is True
    assert cs._SHAPES_ONLY == {"aten::mm": True, "aten::addcdiv_": True, "aten::addmm": False,
                               "aten::mkldnn_convolution": False, "aten::no_such_op_here": False}


def test_one_spill_directory_per_process(monkeypatch):
    """Made at the first recording (its removal registered for this process), reused by the next, made again
    when it was removed or when it was another process's (a forked child's view of its parent's)."""
    import shutil
    from memlens.recording import spill
    registered = []
    monkeypatch.setattr(spill.atexit, "register", lambda func, *args: registered.append((func, args)))
    monkeypatch.setattr(spill, "_directory", None)
    first = os.path.dirname(spill.spill_prefix())
    assert registered == [(spill._remove_directory, (os.getpid(), first))]
    assert os.path.dirname(spill.spill_prefix()) == first and len(registered) == 1
    shutil.rmtree(first)
    second = os.path.dirname(spill.spill_prefix())
    assert second != first and os.path.isdir(second) and registered[-1][1] == (os.getpid(), second)
    monkeypatch.setattr(spill, "_directory", (os.getpid() + 1, second))
    third = os.path.dirname(spill.spill_prefix())
    assert third not in (first, second) and os.path.isdir(third) and len(registered) == 3
    for path in (second, third):
        shutil.rmtree(path)


@pytest.mark.parametrize("case", [test_a_clock_offset_is_estimated_from_the_matched_blocks_and_removed,
                                  test_before_recording_blocks_the_allocator_saw_made_and_allocator_only_rows,
                                  test_events_outside_the_recording_window_are_left_out,
                                  test_allocations_of_a_recording_without_ops_belong_to_no_op,
                                  test_profiler_cuda_events_give_way_to_the_snapshot])
def test_the_join_raises_no_numpy_warning_into_user_code(case):
    """The join meets missing times (frees without allocs, blocks never freed) as NaN; none may reach a cast
    or a comparison that warns (a warning at a recording's exit lands in the user's cell)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        case()
