"""`memlens.analysis.peak_cause`'s cause of the peak against references written here: hand-built traces
whose cause sentence, peak, phase or iteration, categories, pushed bytes and top sites are worked out in the
comments, the phase holding a moment, the PeakCause record, and exact tables of constants (phase words,
category labels). The allocation sites themselves are checked in tests/unit/test_peak_cause_sites_reference.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from _peak_cause_refs import _blocks_trace, _row, _stacks
from memlens.analysis.peak_cause import PHASE_WORDS, TOP_SITES, PeakCause, _group_label, _phase_of, peak_cause

MiB = 1 << 20


# ---- tables of constants -----------------------------------------------------------------------------
def test_constants_exact():
    assert TOP_SITES == 10
    assert PHASE_WORDS == {"forward": "the forward pass", "backward": "the backward pass",
                           "optimizer_step": "the optimizer step", "zero_grad": "zero_grad"}


def test_group_labels_exact():
    expected = {"optimizer_state": "optimizer state", "temporary": "temporaries", "activation": "activations",
                "gradient": "gradients", "parameter": "parameters", "workspace": "workspaces",
                "input": "inputs", "unknown": "blocks the source does not describe",
                "kv_cache_pages": "kv cache pages"}   # not in the table: underscores read as spaces
    for category, label in expected.items():
        assert _group_label(category, "") == label
    assert _group_label("gradient", "aten::mm") == "gradients created by aten::mm"


def test_peak_cause_record_defaults_to_no_sites():
    cause = PeakCause(device="cuda:0", allocated_bytes=5, reserved_bytes=None, peak_ns=7, by_category={"input": 5},
                      phase="", pushed={}, cause="x.")
    assert cause.top_sites == []
    assert cause.to_dict() == {"allocated_bytes": 5, "reserved_bytes": None, "by_category": {"input": 5},
                               "cause": "x.", "phase": "", "peak_ns": 7, "top_sites": []}
    # each record its own list
    other = PeakCause(device="cuda:1", allocated_bytes=0, reserved_bytes=None, peak_ns=0, by_category={},
                      phase="", pushed={}, cause="")
    other.top_sites.append({"site": "s", "bytes": 1})
    assert cause.top_sites == []


# ---- the phase of a moment ---------------------------------------------------------------------------------
def test_phase_of_takes_the_latest_starting_phase_holding_the_moment():
    phases = [{"name": "forward", "start_ns": 0, "end_ns": 100}, {"name": "backward", "start_ns": 100, "end_ns": 200},
              {"name": "optimizer_step", "start_ns": 200, "end_ns": 300},
              {"name": "data_loading", "start_ns": 250, "end_ns": 400}]      # not a phase word: ignored
    trace = SimpleNamespace(metadata={"phases": phases})
    assert _phase_of(trace, 0)["name"] == "forward"
    assert _phase_of(trace, 100)["name"] == "backward"     # both hold 100: the one that starts there
    assert _phase_of(trace, 150)["name"] == "backward"
    assert _phase_of(trace, 200)["name"] == "optimizer_step"
    assert _phase_of(trace, 300)["name"] == "optimizer_step"
    assert _phase_of(trace, 301) is None and _phase_of(trace, -1) is None
    assert _phase_of(SimpleNamespace(metadata={}), 5) is None
    assert _phase_of(SimpleNamespace(metadata={"phases": None}), 5) is None


# ---- the cause of the peak, by hand -----------------------------------------------------------------------
def _phased_trace():
    """cuda:0: 8 MiB of parameters alive before recording; 3 MiB of activations at 50 (forward, layer1's
    aten::mm, freed at 250); 2 MiB of gradients at 100 (the backward's first instant, aten::mm, with a stack
    into train.py), 1 MiB of gradients at 160 (aten::add). cuda:1: 1 MiB of activations at 20.
    Final segments of cuda:0: 20 MiB."""
    stacks = _stacks({4: [("c10::alloc", "", 0), ("backward_step", "/u/train.py", 12)]})
    rows = [_row(0, 8 * MiB, "parameter", before=True),
            _row(1, 3 * MiB, "activation", op="aten::mm", module="layer1", alloc=50, free=250),
            _row(2, 2 * MiB, "gradient", op="aten::mm", stack_id=4, alloc=100),
            _row(3, 1 * MiB, "gradient", op="aten::add", alloc=160),
            _row(4, 1 * MiB, "activation", op="aten::x", alloc=20, device="cuda:1")]
    phases = [{"name": "forward", "start_ns": 0, "end_ns": 100}, {"name": "backward", "start_ns": 100, "end_ns": 200},
              {"name": "optimizer_step", "start_ns": 200, "end_ns": 300}]
    segments = pd.DataFrame({"device": ["cuda:0"], "addr": [4096], "total_size": [20 * MiB], "allocated_size": 0,
                             "active_size": 0, "requested_size": 0, "stream": 0, "pool": "large"})
    return _blocks_trace(rows, stacks, metadata={"phases": phases}, segments=segments)


def test_peak_cause_in_a_phase_by_hand():
    causes = peak_cause(_phased_trace())
    assert list(causes) == ["cuda:0", "cuda:1"]
    c = causes["cuda:0"]
    # live: 8 (before) -> 11 (t 50) -> 13 (t 100) -> 14 (t 160) -> 11 (t 250): the peak is 14 MiB at 160, in
    # the backward pass [100, 200]; what it added (allocated at or after 100): gradients 2 + 1 = 3 MiB, of
    # which aten::mm made 2 MiB; on top of parameters 8 MiB and activations 3 MiB
    assert isinstance(c, PeakCause)
    assert (c.device, c.allocated_bytes, c.reserved_bytes, c.peak_ns, c.phase) == (
        "cuda:0", 14 * MiB, 20 * MiB, 160, "backward")
    assert c.by_category == {"parameter": 8 * MiB, "activation": 3 * MiB, "gradient": 3 * MiB}
    assert c.pushed == {"category": "gradient", "op": "aten::mm", "bytes": 3 * MiB, "op_bytes": 2 * MiB}
    assert c.cause == ("The peak of cuda:0 (14.0 MiB) is reached in the backward pass: gradients allocated in "
                       "it (3.0 MiB, 2.0 MiB of it by aten::mm) on top of parameters (8.0 MiB), activations "
                       "(3.0 MiB). The allocator had reserved 20.0 MiB at most.")
    assert c.top_sites == [{"site": "(alive before recording: parameter)", "bytes": 8 * MiB},
                           {"site": "layer1 aten::mm", "bytes": 3 * MiB},
                           {"site": "train.py:12 backward_step", "bytes": 2 * MiB},
                           {"site": "aten::add (no Python frame)", "bytes": 1 * MiB}]
    assert c.to_dict() == {"allocated_bytes": 14 * MiB, "reserved_bytes": 20 * MiB, "by_category": c.by_category,
                           "cause": c.cause, "phase": "backward", "peak_ns": 160, "top_sites": c.top_sites}
    # cuda:1: 1 MiB at 20, in the forward pass; all of it by aten::x; no allocator data
    c1 = causes["cuda:1"]
    assert c1.cause == ("The peak of cuda:1 (1.0 MiB) is reached in the forward pass: activations allocated in "
                        "it (1.0 MiB by aten::x).")
    assert (c1.reserved_bytes, c1.phase, c1.peak_ns, c1.allocated_bytes) == (None, "forward", 20, 1 * MiB)
    assert c1.to_dict()["reserved_bytes"] is None
    # at most top_sites sites, the largest first
    assert peak_cause(_phased_trace(), top_sites=2)["cuda:0"].top_sites == c.top_sites[:2]


def test_peak_cause_in_a_marked_iteration_by_hand():
    # iteration 0 from the op at 0, iteration 1 from the op at 100 (memlens.step() marks on the ops)
    ops = pd.DataFrame({"op_id": [0, 1], "name": ["aten::a", "aten::b"], "start_ns": [0, 100], "end_ns": [10, 110],
                        "iteration": [0, 1]})
    rows = [_row(0, 1 * MiB, "activation", op="aten::a", alloc=5, free=50),
            _row(1, 2 * MiB, "activation", op="aten::relu", alloc=105),
            _row(2, 3 * MiB // 2, "temporary", op="aten::cat", alloc=106, free=107)]
    trace = _blocks_trace(rows, None, ops=ops)
    c = peak_cause(trace)["cuda:0"]
    # live: 1 -> 0 (t 50) -> 2 (t 105) -> 3.5 MiB (t 106) -> 2: the peak at 106 ns in iteration 1 [100, ...];
    # added there: activations 2 MiB (all by aten::relu) and temporaries 1.5 MiB
    assert (c.allocated_bytes, c.peak_ns, c.phase, c.reserved_bytes) == (7 * MiB // 2, 106, "", None)
    assert c.pushed == {"category": "activation", "op": "aten::relu", "bytes": 2 * MiB, "op_bytes": 2 * MiB}
    assert c.cause == ("The peak of cuda:0 (3.5 MiB) is reached in iteration 1 (at 106 ns): activations allocated "
                       "in it (2.0 MiB by aten::relu) on top of temporaries (1.5 MiB).")


def test_peak_cause_at_an_iteration_start_is_in_the_iteration_it_starts():
    # the peak's allocation stamped at the very instant iteration 1 starts (100 ns) belongs to iteration 1
    # (iterations are [start, next start)), not to iteration 0, which ended there
    ops = pd.DataFrame({"op_id": [0, 1], "name": ["aten::a", "aten::b"], "start_ns": [0, 100], "end_ns": [10, 110],
                        "iteration": [0, 1]})
    rows = [_row(0, 1 * MiB, "activation", op="aten::a", alloc=5),
            _row(1, 2 * MiB, "gradient", op="aten::b", alloc=100, free=120)]
    c = peak_cause(_blocks_trace(rows, None, ops=ops))["cuda:0"]
    assert c.peak_ns == 100
    assert c.cause == ("The peak of cuda:0 (3.0 MiB) is reached in iteration 1 (at 100 ns): gradients allocated "
                       "in it (2.0 MiB by aten::b) on top of activations (1.0 MiB).")


def _marked_ops(*starts):
    """One op per iteration marker (memlens.step()), starting at `starts`."""
    return pd.DataFrame({"op_id": range(len(starts)), "name": "aten::a", "start_ns": list(starts),
                         "end_ns": [s + 10 for s in starts], "iteration": range(len(starts))})


def test_peak_cause_in_the_iteration_that_holds_it_not_a_later_one():
    # iterations 0 [0, 100) and 1 [100, ...]; 5 MiB at 5 (freed at 50) is the peak, in iteration 0; 1 MiB at
    # 105 keeps iteration 1 (an iteration without allocations would be dropped)
    rows = [_row(0, 5 * MiB, "activation", op="aten::a", alloc=5, free=50), _row(1, 1 * MiB, "input", alloc=105)]
    c = peak_cause(_blocks_trace(rows, None, ops=_marked_ops(0, 100)))["cuda:0"]
    assert c.cause == ("The peak of cuda:0 (5.0 MiB) is reached in iteration 0 (at 5 ns): activations allocated "
                       "in it (5.0 MiB by aten::a).")


def test_peak_cause_at_the_last_instant_of_the_last_iteration():
    # the peak (1 + 2 MiB) comes with the trace's last stamp, 150 ns: the last iteration [100, 150] holds it
    rows = [_row(0, 1 * MiB, "input", alloc=5), _row(1, 2 * MiB, "activation", op="aten::b", alloc=150)]
    c = peak_cause(_blocks_trace(rows, None, ops=_marked_ops(0, 100)))["cuda:0"]
    assert c.cause == ("The peak of cuda:0 (3.0 MiB) is reached in iteration 1 (at 150 ns): activations allocated "
                       "in it (2.0 MiB by aten::b) on top of inputs (1.0 MiB).")


def test_peak_cause_with_phases_ignores_iterations():
    # the trace names its phases (a snapshot's annotations or frames): the peak at 150 ns lies in none of
    # them, so it is placed in time only, with what was allocated during the recording -- the iterations
    # the ops mark are not used (with phases, they would be the phases' own repeats, e.g. a layer loop)
    rows = [_row(0, 1 * MiB, "input", before=True), _row(1, 2 * MiB, "activation", op="aten::b", alloc=150)]
    phases = [{"name": "forward", "start_ns": 0, "end_ns": 90}]
    c = peak_cause(_blocks_trace(rows, None, ops=_marked_ops(0, 100), metadata={"phases": phases}))["cuda:0"]
    assert c.phase == ""
    assert c.cause == ("The peak of cuda:0 (3.0 MiB) is reached at 150 ns: activations allocated during the "
                       "recording (2.0 MiB by aten::b) on top of inputs (1.0 MiB).")


def test_peak_cause_without_phases_or_iterations_by_hand():
    # no ops: no iterations; what counts is what was allocated during the recording. 4 MiB of unknown
    # blocks alive before it, 1 MiB unknown (no op) at 1500 ns: the peak, 5 MiB at 1.5 us
    rows = [_row(0, 4 * MiB, "unknown", before=True), _row(1, 1 * MiB, "unknown", alloc=1500)]
    c = peak_cause(_blocks_trace(rows, None))["cuda:0"]
    assert c.pushed == {"category": "unknown", "op": "", "bytes": 1 * MiB, "op_bytes": 1 * MiB}
    assert c.cause == ("The peak of cuda:0 (5.0 MiB) is reached at 1.5 us: blocks the source does not describe "
                       "allocated during the recording (1.0 MiB) on top of 4.0 MiB already live.")


def test_peak_cause_lists_four_others_and_sums_the_rest():
    # 10 MiB of activations made during the recording (aten::a 6 + aten::b 4); alive before: parameters 5,
    # gradients 4, optimizer state 3, inputs 2, workspaces 1, temporaries 0.5 MiB: four named, 1.5 MiB more
    rows = [_row(0, 6 * MiB, "activation", op="aten::a", alloc=2000),
            _row(1, 4 * MiB, "activation", op="aten::b", alloc=2100)]
    for i, (cat, size) in enumerate([("parameter", 5 * MiB), ("gradient", 4 * MiB), ("optimizer_state", 3 * MiB),
                                     ("input", 2 * MiB), ("workspace", 1 * MiB), ("temporary", MiB // 2)]):
        rows.append(_row(10 + i, size, cat, before=True))
    c = peak_cause(_blocks_trace(rows, None))["cuda:0"]
    assert c.allocated_bytes == 51 * MiB // 2 and c.peak_ns == 2100
    assert c.cause == ("The peak of cuda:0 (25.5 MiB) is reached at 2.1 us: activations allocated during the "
                       "recording (10.0 MiB, 6.0 MiB of it by aten::a) on top of parameters (5.0 MiB), gradients "
                       "(4.0 MiB), optimizer state (3.0 MiB), inputs (2.0 MiB) and 1.5 MiB more.")
    assert len(c.top_sites) == 8 and c.top_sites[0] == {"site": "aten::a (no Python frame)", "bytes": 6 * MiB}


def test_peak_cause_with_five_others_names_four_and_one_more():
    # as above without the temporaries: five others, the fifth (workspaces, 1 MiB) is the "more"
    rows = [_row(0, 6 * MiB, "activation", op="aten::a", alloc=2000),
            _row(1, 4 * MiB, "activation", op="aten::b", alloc=2100)]
    for i, (cat, size) in enumerate([("parameter", 5 * MiB), ("gradient", 4 * MiB), ("optimizer_state", 3 * MiB),
                                     ("input", 2 * MiB), ("workspace", 1 * MiB)]):
        rows.append(_row(10 + i, size, cat, before=True))
    c = peak_cause(_blocks_trace(rows, None))["cuda:0"]
    assert c.cause == ("The peak of cuda:0 (25.0 MiB) is reached at 2.1 us: activations allocated during the "
                       "recording (10.0 MiB, 6.0 MiB of it by aten::a) on top of parameters (5.0 MiB), gradients "
                       "(4.0 MiB), optimizer state (3.0 MiB), inputs (2.0 MiB) and 1.0 MiB more.")


def test_peak_cause_orders_the_rest_by_bytes_and_names_exactly_four():
    # 6 MiB of gradients made during the recording by aten::g, on 4 MiB of gradients, 5 MiB of parameters,
    # 3 MiB of optimizer state and 2 MiB of inputs from before it: the gradients left (4 MiB) come after the
    # parameters (5 MiB) although there are more gradients in all (10 MiB); four others, none "more"
    rows = [_row(0, 6 * MiB, "gradient", op="aten::g", alloc=2000), _row(1, 4 * MiB, "gradient", before=True),
            _row(2, 5 * MiB, "parameter", before=True), _row(3, 3 * MiB, "optimizer_state", before=True),
            _row(4, 2 * MiB, "input", before=True)]
    c = peak_cause(_blocks_trace(rows, None))["cuda:0"]
    assert c.by_category == {"gradient": 10 * MiB, "parameter": 5 * MiB, "optimizer_state": 3 * MiB, "input": 2 * MiB}
    assert c.cause == ("The peak of cuda:0 (20.0 MiB) is reached at 2.0 us: gradients allocated during the "
                       "recording (6.0 MiB by aten::g) on top of parameters (5.0 MiB), gradients (4.0 MiB), "
                       "optimizer state (3.0 MiB), inputs (2.0 MiB).")


def test_peak_cause_names_a_single_byte_on_top():
    # 2 MiB of activations at 20 ns on one byte of input from before the recording: 2 MiB + 1 B is "2.0 MiB"
    rows = [_row(0, 2 * MiB, "activation", op="aten::b", alloc=20), _row(1, 1, "input", before=True)]
    c = peak_cause(_blocks_trace(rows, None))["cuda:0"]
    assert c.cause == ("The peak of cuda:0 (2.0 MiB) is reached at 20 ns: activations allocated during the "
                       "recording (2.0 MiB by aten::b) on top of inputs (1 B).")


def test_peak_cause_when_everything_predates_the_recording():
    # a final state only: every live block was allocated before recording; five categories, four named
    rows = [_row(i, size, cat, before=True) for i, (cat, size) in enumerate(
        [("parameter", 8 * MiB), ("optimizer_state", 4 * MiB), ("gradient", 2 * MiB), ("activation", 1 * MiB),
         ("input", MiB // 2)])]
    # one stamp, so the trace has a time: 0 (a 0-byte block: one of any size allocated and freed at the same
    # instant is live at that instant, and would be the peak's top)
    rows.append(_row(9, 0, "gradient", alloc=0, free=0))
    c = peak_cause(_blocks_trace(rows, None))["cuda:0"]
    assert c.pushed == {} and c.allocated_bytes == 31 * MiB // 2
    assert c.cause == ("The peak of cuda:0 (15.5 MiB) is reached at 0 ns: everything live then was allocated "
                       "before recording began (parameters 8.0 MiB, optimizer state 4.0 MiB, gradients 2.0 MiB, "
                       "activations 1.0 MiB).")
