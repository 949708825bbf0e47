"""Optimizer state when the snapshot knows no parameter (no model construction, no gradient, nothing alive
before recording): the fallback that takes a size made by optimizer code at two or more places.

The snapshot starts at the user's optimizer step (its `step` frame in a file that says nothing), so only the
second fact can tell state from the rest: exp_avg and exp_avg_sq are made at two lines with one size.
"""
from __future__ import annotations

import pickle

import memlens
from test_snapshot_optimizer import _frames

EXP, OTHER = 8192, 2048


def _step(line):
    return _frames(("step", "lab/fancy_update.py", line), ("main", "lab/train.py", 40))


def _snapshot() -> dict:
    """Events 1 us apart, in allocation order (expected category by hand):
    exp_avg EXP at line 11 (state), exp_avg_sq EXP at line 12 (state: EXP made at two places and kept);
    OTHER at line 11 kept (not state: of the kept OTHER blocks, all come from line 11, one place);
    OTHER at line 12 freed within the step (temporary: it does not make line 12 a place of OTHER state);
    OTHER at line 11 again, kept (not state: two blocks, still one place);
    512 bytes at line 15 freed within the step (temporary: its free completes, stackless, after the step's
    last event); then the loop's own 4096-byte batch."""
    ev, t = [], [0]

    def add(action, addr, size, frames):
        for a in ([action, "free_completed"] if action == "free_requested" else [action]):
            t[0] += 1
            ev.append({"action": a, "addr": addr, "size": size, "stream": 0, "time_us": t[0],
                       "frames": frames if a != "free_completed" else []})

    add("segment_alloc", 0x100000, 1 << 20, [])
    add("alloc", 0x100000, EXP, _step(11))
    add("alloc", 0x102000, EXP, _step(12))
    add("alloc", 0x104000, OTHER, _step(11))
    add("alloc", 0x105000, OTHER, _step(12))
    add("alloc", 0x106000, OTHER, _step(11))
    add("alloc", 0x107000, 512, _step(15))
    add("free_requested", 0x105000, OTHER, _step(18))
    add("free_requested", 0x107000, 512, _step(18))
    add("alloc", 0x108000, 4096, _frames(("main", "lab/train.py", 25)))
    return {"segments": [], "device_traces": [ev]}


def test_without_parameters_a_size_made_at_two_places_is_optimizer_state(tmp_path):
    """Mutants killed: the fallback replaced by a ``raise`` or by no state at all (exp_avg/exp_avg_sq
    unknown); ``places >= 2`` -> ``>= 1`` (the OTHER blocks would be state); ``nunique`` -> ``count`` (two
    OTHER blocks from one line would be state); places counted over every block optimizer code made instead
    of those that outlive its run (the freed OTHER at line 12 would make OTHER a two-place size); a run of
    optimizer code ended at its last stacked event, before the stackless completion of the free it requested
    (the 512-byte block would be unknown: the bug this test found)."""
    path = tmp_path / "no_parameters.pickle"
    path.write_bytes(pickle.dumps(_snapshot()))
    b = memlens.load(path).blocks.sort_values("alloc_ns", kind="stable")
    got = b["category"].tolist()
    assert b["size"].tolist() == [EXP, EXP, OTHER, OTHER, OTHER, 512, 4096]
    assert got[:2] == ["optimizer_state", "optimizer_state"]
    assert b["category_rule"].iloc[:2].str.startswith("made by an optimizer's code").all()
    assert got[3] == "temporary" and got[5] == "temporary"
    assert got[2] != "optimizer_state" and got[4] != "optimizer_state" and got[6] != "optimizer_state"
