"""Hand-computed cases for the recording's close that mutation testing (issue 27) showed no test pinned:
the allocator join's clock-offset correction, the before-recording fix-up, a CUDA block kept until its
allocator free, allocations only the allocator saw, the recording window; every expected value is worked
out in the comments from the inputs."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from memlens.record.instruments import AllocatorData
from memlens.record.join import MATCH_TOLERANCE_NS, join_allocator
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
    assert notes == ["profiler clock offset corrected by 30000 ns"]
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
    from memlens.record import spill
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
    from memlens.record import compiled_signatures as cs
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
    from memlens.record import compiled_signatures as cs
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
    from memlens.record import compiled_signatures as cs
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
    from memlens.record import spill
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


def _op_records(dstart, dur, sig, nacc):
    from memlens.record.compiled_drain import OP_DTYPE
    ops = np.zeros(len(dstart), dtype=OP_DTYPE)
    ops["dstart"], ops["dur"] = dstart, dur
    ops["sig_nacc"] = (np.asarray(sig, dtype=np.int64) << 8) | np.asarray(nacc, dtype=np.int64)
    return ops


def test_decoded_op_times_with_and_without_escaped_records():
    """The C++ op records hold start deltas; an op whose start, duration, access count or signature does
    not fit its 16 bytes has a wide record (kind 0..3) that overrides it. Worked by hand."""
    from memlens.record.compiled_drain import CTX_DTYPE, WIDE_DTYPE, CompiledDrain
    ops = _op_records([0, 10, 5, 7], [3, 4, 5, 6], [1, 2, 3, 4], [1, 0, 2, 1])
    ctxs = np.array([(0, 4), (2, 8), (2, 12)], dtype=CTX_DTYPE)      # the last change at an op wins
    no_wide = np.zeros(0, dtype=WIDE_DTYPE)
    start, end, sig, nacc, ctx = CompiledDrain._decode_ops(ops, no_wide, ctxs, 1000)
    assert all(a.dtype == np.int64 for a in (start, end, sig, nacc, ctx))
    assert start.tolist() == [1000, 1010, 1015, 1022] and end.tolist() == [1003, 1014, 1020, 1028]
    assert sig.tolist() == [1, 2, 3, 4] and nacc.tolist() == [1, 0, 2, 1] and ctx.tolist() == [4, 4, 12, 12]
    wide = np.array([(2, 0, 5000), (1, 1, 10 ** 10), (3, 2, 300), (0, 3, 70000)], dtype=WIDE_DTYPE)
    start, end, sig, nacc, ctx = CompiledDrain._decode_ops(ops, wide, ctxs, 1000)
    # op 2 starts at its absolute 5000 and op 3 follows it by its own delta (7)
    assert start.tolist() == [1000, 1010, 5000, 5007]
    assert end.tolist() == [1003, 1010 + 10 ** 10, 5005, 5013]
    assert sig.tolist() == [70000, 2, 3, 4] and nacc.tolist() == [1, 0, 2, 300]
    assert all(a.dtype == np.int64 for a in (start, end, sig, nacc, ctx))
    # one wide record only, the first op's absolute start; the context set from op 1 on (op 0 has none)
    one = np.array([(0, 0, 7000)], dtype=WIDE_DTYPE)
    start, end, sig, nacc, ctx = CompiledDrain._decode_ops(ops, one, np.array([(1, 8)], dtype=CTX_DTYPE), 1000)
    assert start.tolist() == [7000, 7010, 7015, 7022] and end.tolist() == [7003, 7014, 7020, 7028]
    assert ctx.tolist() == [0, 8, 8, 8] and ctx.dtype == np.int64
    start, end, sig, nacc, ctx = CompiledDrain._decode_ops(ops, wide, np.zeros(0, dtype=CTX_DTYPE), 1000)
    assert ctx.tolist() == [0, 0, 0, 0] and ctx.dtype == np.int64
    empty = CompiledDrain._decode_ops(_op_records([], [], [], []), wide[:0], ctxs[:0], 1000)
    assert all(len(a) == 0 and a.dtype == np.int64 for a in empty)


def test_backward_ops_take_the_module_of_the_first_forward_op_of_their_node():
    """Forward ops read the autograd counter after their node was made: node s belongs to the first
    forward op reading s + 1; backward ops hold -2 - s. Worked by hand."""
    from memlens.record.build import _backward_modules
    module_idx = np.array([5, 6, 7, 8, 0, 0, 0], dtype=np.int64)
    aseq = np.array([3, 3, 4, 4, -2 - 2, -2 - 3, -2 - 9], dtype=np.int64)   # nodes 2, 3 and an unknown 9
    backward = aseq < 0
    out = _backward_modules(module_idx, aseq, backward)
    # node 2 -> first forward reading 3 is op 0 (module 5); node 3 -> first reading 4 is op 2 (module 7)
    assert out.tolist() == [5, 6, 7, 8, 5, 7, 0]


def test_backward_module_mapping_matches_a_brute_force_reference():
    """Many forward ops share counter values (a sort that is not stable would pick a later one), and the
    one-forward-op / one-backward-op edges."""
    from memlens.record.build import _backward_modules
    rng = np.random.default_rng(7)
    n_fwd, n_bwd = 400, 150
    fwd_seq = rng.integers(0, 40, n_fwd)       # (in op order counters grow; any order keeps the rule)
    module_idx = np.concatenate([rng.integers(1, 1000, n_fwd), np.zeros(n_bwd, np.int64)])
    nodes = rng.integers(-1, 45, n_bwd)
    aseq = np.concatenate([fwd_seq, -2 - nodes])
    expected = module_idx.copy()
    for j, node in enumerate(nodes):                            # the first forward op reading node + 1
        hits = [i for i in range(n_fwd) if fwd_seq[i] == node + 1]
        if hits:
            expected[n_fwd + j] = module_idx[hits[0]]
    assert _backward_modules(module_idx, aseq, aseq < 0).tolist() == expected.tolist()
    one = _backward_modules(np.array([9, 0]), np.array([1, -2]), np.array([False, True]))
    assert one.tolist() == [9, 9]                               # node 0 -> the forward op reading 1


def test_signature_words_decode_to_each_tagged_value():
    """recorder.cpp writes a signature as int64 words: the op-name number, tagged inputs, '|', tagged
    outputs. Built by hand: every tag, a nested list, a double's bits, an unknown tag and a 0-d output."""
    import struct

    from memlens.record.compiled_signatures import decode_signature
    o = ord
    bits = struct.unpack("<q", struct.pack("<d", -2.5))[0]
    words = [1, o("T"), 6, 2, 3, 4, o("T"), 6, -1, o("L"), 2, o("I"), 5, o("N"), o("W"), 7, o("D"), bits,
             o("B"), 1, o("B"), 0, o("X"), o("|"), o("T"), 15, 0, o("I"), -3]
    name, inputs, outputs = decode_signature(struct.pack(f"<{len(words)}q", *words), ["aten::a", "aten::b"])
    assert name == "aten::b"
    assert inputs == [("tensor", 6, (3, 4)), ("tensor", 6, None), [5, None], ("scalar", 7), -2.5, True, False, "?"]
    assert outputs == [("tensor", 15, ()), -3]
    assert type(inputs[0][2][0]) is int and type(inputs[4]) is float and type(inputs[5]) is bool
    assert decode_signature(struct.pack("<q", 0), ["aten::a"]) == ("aten::a", [], [])


@pytest.mark.parametrize("seed", range(6))
def test_sort_based_unique_helpers_equal_numpy_unique(seed):
    """`first_occurrences` replaces `np.unique(return_index=True)` in the close: the same arrays, on
    repeated values, one value, and no values."""
    from memlens.record.columns import first_occurrences
    rng = np.random.default_rng(seed)
    for values in (rng.integers(-5, 5, 300), rng.integers(0, 10 ** 12, 50), np.full(7, 3), np.empty(0, np.int64)):
        values = values.astype(np.int64)
        distinct, first = first_occurrences(values)
        expected_distinct, expected_first = np.unique(values, return_index=True)
        np.testing.assert_array_equal(distinct, expected_distinct)
        np.testing.assert_array_equal(first, expected_first)


def test_factorize_fast_path_equals_pandas():
    """One string device takes a path without pandas; everything else is pandas' own answer."""
    import pandas as pd

    from memlens.record.join import _factorize
    cases = [np.array(["cpu"] * 5, dtype=object), np.array(["cuda:0", "cpu", "cuda:0"], dtype=object),
             np.array([None, "cpu", None], dtype=object), np.array([np.nan, np.nan], dtype=object),
             np.array([3, 3], dtype=object), np.empty(0, dtype=object)]
    for values in cases:
        for sentinel in (True, False):
            codes, uniques = _factorize(values, use_na_sentinel=sentinel)
            expected_codes, expected_uniques = pd.factorize(values, use_na_sentinel=sentinel)
            np.testing.assert_array_equal(codes, expected_codes)
            assert codes.dtype == np.int64
            def spelled(values):
                return [("<missing>" if pd.isna(v) else v) for v in values]
            assert spelled(uniques) == spelled(expected_uniques)
    codes, uniques = _factorize(np.array(["cpu"] * 3, dtype=object), use_na_sentinel=True)
    assert codes.tolist() == [0, 0, 0] and uniques.tolist() == ["cpu"]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 51])
def test_clock_offset_is_the_median_distance_outside_the_ops(n):
    """estimate_offset = int(np.median(distance of each matched allocation outside its op's interval)),
    odd and even counts (the mean of the middle two, truncated toward zero), against numpy's median."""
    from memlens.record.columns import Columns, Nullable
    from memlens.record.join import estimate_offset
    rng = np.random.default_rng(n)
    starts = np.sort(rng.integers(0, 10 ** 9, n))
    ops = Columns(n, {"start_ns": starts, "end_ns": starts + rng.integers(0, 1000, n)})
    op = rng.permutation(n)
    blocks = Columns(n, {"alloc_op_id": Nullable.of(op)})
    alloc_t = starts[op] + rng.integers(-5000, 5001, n)          # before, inside or after each op
    rows = np.arange(n)
    distance = alloc_t - np.clip(alloc_t, starts[op], ops["end_ns"][op])
    assert estimate_offset(blocks, ops, alloc_t, rows) == int(np.median(distance))
    if n == 2:   # two distances, -1 and -2: their mean -1.5 truncates toward zero, to -1
        ops2 = Columns(4, {"start_ns": np.zeros(4, np.int64), "end_ns": np.full(4, 10)})
        blocks2 = Columns(4, {"alloc_op_id": Nullable.of(np.array([0, 1, 2, 3]))})
        assert estimate_offset(blocks2, ops2, np.array([-1, -2, 5, 5]), np.array([0, 1, -1, -1])) == -1


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


def test_one_string_device_is_factorized_without_pandas(monkeypatch):
    """The usual recording has one device: its codes come without a pandas call (the fast path's only
    purpose); two devices, a missing one or a non-string one go to pandas."""
    from memlens.record import join
    calls = []
    real = join.pd.factorize
    monkeypatch.setattr(join.pd, "factorize", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    codes, uniques = join._factorize(np.array(["cuda:0"] * 4, dtype=object), use_na_sentinel=True)
    assert calls == [] and codes.tolist() == [0, 0, 0, 0] and uniques.dtype == object
    assert uniques.tolist() == ["cuda:0"]
    for values in (["cpu", "cuda:0"], [None, None], [1, 1]):
        join._factorize(np.array(values, dtype=object), use_na_sentinel=False)
    assert len(calls) == 3
    codes, cpu = join._device_codes(np.array(["cpu", None, "cuda:0", None, "cpu"], dtype=object))
    # a missing device is a name of its own (pandas keeps it as NaN: "nan", after "cpu" and "cuda:0" in the
    # sorted names), not a -1 sentinel that would alias the last name
    assert codes.tolist() == [0, 2, 1, 2, 0] and cpu.tolist() == [True, False, False, False, True]
    codes, cpu = join._device_codes(np.array(["cpu"] * 3, dtype=object))
    assert codes.tolist() == [0, 0, 0] and codes.dtype == np.int64 and cpu.tolist() == [True] * 3
