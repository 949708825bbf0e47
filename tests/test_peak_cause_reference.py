"""`memlens.analysis.peak_cause` against references written here: hand-built traces whose cause sentence,
groups and sites are worked out in the comments, exact tables of constants, and brute-force site labels and
site groups over small random blocks and stacks (hypothesis).

The reference rules, from the module's docstring: a block's site is its ``location`` when the source gave
one, else the innermost frame (lowest depth) of its stack whose file ends in ``.py`` and is not under
``torch/`` ("file.py:line function"), else "module op" / "op (no Python frame)", else "(alive before
recording[: category])", else "(no stack)".
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from memlens.analysis.peak_cause import (PHASE_WORDS, TOP_SITES, PeakCause, _group_label, _is_torch,  # noqa: E402
                                         _phase_of, block_sites, peak_cause, sites, stack_lines, stack_sites)
from memlens.trace import Trace  # noqa: E402

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MiB = 1 << 20
BLOCK_COLUMNS = ["block_id", "device", "size", "alloc_ns", "free_ns", "category", "op", "module", "stack_id",
                 "allocated_before"]


def _stacks(frames: dict[int, list[tuple[str, str, int]]]) -> pd.DataFrame:
    """{stack_id: [(name, filename, line), innermost first]} as a stacks table (rows in reverse order, so
    that only the depth orders them)."""
    rows = [{"stack_id": sid, "depth": d, "name": n, "filename": f, "line": ln}
            for sid, fr in frames.items() for d, (n, f, ln) in enumerate(fr)]
    return pd.DataFrame(rows[::-1], columns=["stack_id", "depth", "name", "filename", "line"])


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


def test_is_torch():
    assert _is_torch("/usr/lib/python3/site-packages/torch/nn/modules/linear.py")
    assert _is_torch("torch/autograd/graph.py")
    assert _is_torch("C:\\Python\\Lib\\site-packages\\torch\\nn\\functional.py")
    assert not _is_torch("/home/u/mytorch/train.py")        # a directory merely ending in "torch"
    assert not _is_torch("/home/u/torchvision/models.py")
    assert not _is_torch("xtorch/model.py")


# ---- stack sites and stack lines -------------------------------------------------------------------------
def test_stack_sites_innermost_user_frame():
    stacks = _stacks({
        # allocator frames, then torch's Python, then the user's line: train.py:12 step
        3: [("c10::alloc", "", 0), ("linear", "/site-packages/torch/nn/functional.py", 90),
            ("step", "/home/u/proj/train.py", 12), ("main", "/home/u/proj/run.py", 3)],
        # a Windows path keeps only the file name
        5: [("fwd", "C:\\proj\\model.py", 7)],
        # no user frame at all: no label
        8: [("add", "torch/_tensor.py", 40), ("exec", "<frozen runpy>", 0)],
        # not .py: a C++ frame named like a file is skipped
        9: [("x", "/home/u/ext.cpp", 1), ("y", "/home/u/a.py", 2)],
        # a bare file name, no directory
        0: [("main", "run.py", 4)],
    })
    labels = stack_sites(stacks)
    assert labels.to_dict() == {3: "train.py:12 step", 5: "model.py:7 fwd", 9: "a.py:2 y", 0: "run.py:4 main"}
    assert len(stack_sites(None)) == 0 and len(stack_sites(stacks.iloc[:0])) == 0


def test_stack_lines_by_hand():
    stacks = _stacks({1: [
        ("c10::cuda::CUDACachingAllocator::malloc", "", 0),            # a first run of C++ frames: always said
        ("at::_ops::mm::call(at::Tensor const&)", "", 0),               # ... naming the ATen op mm
        ("forward", "/a/b/proj/model/layer.py", 21),
        ("PyObject_Call", "", 0),                                       # interpreter glue: not said
        ("_call_impl", "/x/torch/nn/modules/module.py", 1500),
        ("torch::autograd::Engine::evaluate_function", "", 0),          # the engine: said
        ("backward", "C:\\u\\proj\\train.py", 30),
        ("at::_ops::add_Tensor::call(x)", "", 0),                       # two ATen ops: the last one named
        ("at::_ops::sum::call(y)", "", 0),
        ("train_loop", "run.py", 5),
        ("_start", "", 0),                                              # trailing glue: not said
    ]})
    assert stack_lines(stacks, 1) == [
        "... 2 C++ frames (aten::mm)",
        "forward (proj/model/layer.py:21)",
        "_call_impl (nn/modules/module.py:1500)",
        "... 1 C++ frame (autograd engine)",
        "backward (u/proj/train.py:30)",
        "... 2 C++ frames (aten::sum)",
        "train_loop (run.py:5)",
    ]
    # PyObject_Call and _start are glue between / after Python frames with no op or engine: left out;
    # the first run's label without an op is its last frame's name up to "(" (at most 60 characters)
    long = "v" * 70 + "(args)"
    stacks = _stacks({2: [("first(int)", "", 0), ("second(int)", "", 0), (long, "", 0), ("f", "m.py", 1)]})
    assert stack_lines(stacks, 2) == ["... 3 C++ frames (" + "v" * 60 + ")", "f (m.py:1)"]
    # "at::_ops::NAME::call" must start the name and end at a word boundary: neither names an op here, so
    # the first run is labelled by its last frame
    stacks = _stacks({4: [("x at::_ops::mm::call()", "", 0), ("at::_ops::mm::callable()", "", 0),
                          ("g", "m.py", 2)]})
    assert stack_lines(stacks, 4) == ["... 2 C++ frames (at::_ops::mm::callable)", "g (m.py:2)"]


def test_stack_lines_limits_and_missing():
    frames = {7: [(f"f{i}", f"/r/q/p/m{i}.py", i) for i in range(15)]}   # files shown by their last 3 parts
    stacks = _stacks(frames)
    # 15 Python lines, at most 12: 11 kept and one saying how many more (15 - 11 = 4)
    lines = stack_lines(stacks, 7)
    assert len(lines) == 12 and lines[:2] == ["f0 (q/p/m0.py:0)", "f1 (q/p/m1.py:1)"]
    assert lines[-1] == "... 4 more"
    assert stack_lines(stacks, 7, max_frames=3) == ["f0 (q/p/m0.py:0)", "f1 (q/p/m1.py:1)", "... 13 more"]
    assert stack_lines(stacks, 7, max_frames=15) == [f"f{i} (q/p/m{i}.py:{i})" for i in range(15)]
    assert stack_lines(stacks, np.int64(7), max_frames=15)[0] == "f0 (q/p/m0.py:0)"
    assert stack_lines(None, 7) == [] and stack_lines(stacks, None) == [] and stack_lines(stacks, pd.NA) == []
    assert stack_lines(stacks, 99) == []


# ---- block sites and site groups, by hand ------------------------------------------------------------------
def _blocks_trace(rows: list[dict], stacks: pd.DataFrame | None, location: list[str] | None = None,
                  metadata: dict | None = None, **tables) -> Trace:
    b = pd.DataFrame(rows, columns=BLOCK_COLUMNS)
    if location is not None:
        b["location"] = location
    return Trace.from_tables(b, stacks=stacks, metadata=metadata, **tables)


def _row(bid, size, category="unknown", op="", module="", stack_id=None, before=False, alloc=None, free=None,
         device="cuda:0"):
    return {"block_id": bid, "device": device, "size": size, "alloc_ns": None if before else alloc,
            "free_ns": free, "category": category, "op": op, "module": module, "stack_id": stack_id,
            "allocated_before": before}


def test_block_sites_every_rule():
    stacks = _stacks({1: [("c10::alloc", "", 0), ("step", "/u/train.py", 12)],
                      2: [("add", "/x/torch/_tensor.py", 3)]})       # only torch frames: no site from it
    rows = [_row(0, 1, op="aten::mm", module="blk", stack_id=1),      # stack wins over module / op
            _row(1, 1, op="aten::mm", module="blk", stack_id=2),      # -> "blk aten::mm"
            _row(2, 1, op="aten::add", stack_id=2),                   # -> "aten::add (no Python frame)"
            _row(3, 1, op="aten::add"),                               # no stack id at all
            _row(4, 1, category="parameter", before=True),            # -> "(alive before recording: parameter)"
            _row(5, 1, category="unknown", before=True),              # -> "(alive before recording)"
            _row(6, 1, category="parameter"),                         # nothing known: "(no stack)"
            _row(7, 1, op="aten::mm", module="blk", stack_id=1, before=True)]
    expected = ["train.py:12 step", "blk aten::mm", "aten::add (no Python frame)", "aten::add (no Python frame)",
                "(alive before recording: parameter)", "(alive before recording)", "(no stack)",
                "train.py:12 step"]
    trace = _blocks_trace(rows, stacks)
    assert block_sites(trace).tolist() == expected
    # a source's own location comes first; an empty one falls back to the rules above
    loc = ["given.py:1 f", "", "", "", "", "elsewhere.py:2 g", "", ""]
    trace = _blocks_trace(rows, stacks, location=loc)
    assert block_sites(trace).tolist() == ["given.py:1 f"] + expected[1:5] + ["elsewhere.py:2 g"] + expected[6:]
    # a subset of the rows, in its own order
    assert block_sites(trace, trace.blocks.iloc[[6, 0]]).tolist() == ["(no stack)", "given.py:1 f"]
    # without a stacks table, the stack ids lead nowhere
    assert block_sites(_blocks_trace(rows, None)).tolist()[:2] == ["blk aten::mm", "blk aten::mm"]


def test_sites_arguments_and_empty():
    trace = _blocks_trace([_row(0, 4, op="aten::mm", stack_id=3)], None)
    with pytest.raises(ValueError, match=r"^by must be 'site' or 'stack', got 'line'$"):
        sites(trace, by="line")
    empty = sites(trace, device="cuda:7")
    assert len(empty) == 0 and list(empty.columns) == ["site", "bytes", "blocks", "category", "op", "stack_id"]
    out = sites(trace, by="stack")
    assert out["site"].tolist() == ["aten::mm (no Python frame) [stack 3]"]


def test_sites_break_ties_by_block_count():
    # equal bytes: the site with more blocks first; equal both: the order the blocks came in
    trace = _blocks_trace([_row(0, 4, op="z"), _row(1, 2, op="b"), _row(2, 2, op="b"), _row(3, 4, op="c")], None)
    assert sites(trace)["site"].tolist() == ["b (no Python frame)", "z (no Python frame)", "c (no Python frame)"]
    # the category holding the most bytes of a site; on a tie, the first block's
    trace = _blocks_trace([_row(0, 1, "gradient", op="a"), _row(1, 2, "parameter", op="a"),
                           _row(2, 2, "gradient", op="a"), _row(3, 3, "activation", op="a")], None)
    row = sites(trace).iloc[0]
    assert (row["category"], int(row["bytes"]), int(row["blocks"])) == ("gradient", 8, 4)
    trace = _blocks_trace([_row(0, 2, "input", op="a"), _row(1, 2, "parameter", op="a")], None)
    assert sites(trace).iloc[0]["category"] == "input"


def test_peak_cause_record_defaults_to_no_sites():
    cause = PeakCause(device="cuda:0", allocated_bytes=5, reserved_bytes=None, peak_ns=7, by_category={"input": 5},
                      phase="", pushed={}, cause="x.")
    assert cause.top_sites == []
    assert cause.to_json() == {"allocated_bytes": 5, "reserved_bytes": None, "by_category": {"input": 5},
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
    assert c.to_json() == {"allocated_bytes": 14 * MiB, "reserved_bytes": 20 * MiB, "by_category": c.by_category,
                           "cause": c.cause, "phase": "backward", "peak_ns": 160, "top_sites": c.top_sites}
    # cuda:1: 1 MiB at 20, in the forward pass; all of it by aten::x; no allocator data
    c1 = causes["cuda:1"]
    assert c1.cause == ("The peak of cuda:1 (1.0 MiB) is reached in the forward pass: activations allocated in "
                        "it (1.0 MiB by aten::x).")
    assert (c1.reserved_bytes, c1.phase, c1.peak_ns, c1.allocated_bytes) == (None, "forward", 20, 1 * MiB)
    assert c1.to_json()["reserved_bytes"] is None
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


# ---- brute force over small random blocks and stacks (last: the slowest) -----------------------------
FILES = ["/home/u/train.py", "C:\\proj\\model.py", "/env/site-packages/torch/nn/functional.py",
         "torch/autograd/__init__.py", "", "libc10_cuda.so", "/u/torchvision/ops.py"]


@st.composite
def blocks_and_stacks(draw):
    """Blocks with distinct power-of-two sizes (no two groups of them sum alike: no ties to break), random
    categories / ops / modules / stacks / locations, on two devices; stacks of random frames."""
    n_stacks = draw(st.integers(0, 4))
    frames = {}
    for sid in range(n_stacks):
        frames[sid] = [(draw(st.sampled_from(["f", "g", "step"])), draw(st.sampled_from(FILES)),
                             draw(st.integers(0, 3))) for _ in range(draw(st.integers(1, 4)))]
    n = draw(st.integers(1, 9))
    exps = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True))
    rows, locations = [], []
    for i in range(n):
        rows.append(_row(50 + i, 1 << exps[i], category=draw(st.sampled_from(["unknown", "parameter", "activation"])),
                         op=draw(st.sampled_from(["", "aten::mm", "aten::add"])),
                         module=draw(st.sampled_from(["", "blk"])),
                         stack_id=draw(st.sampled_from([None, 0, 1, 2, 3, 99])),
                         before=draw(st.booleans()), alloc=i,
                         device=draw(st.sampled_from(["cuda:0", "cuda:0", "cpu"]))))
        locations.append(draw(st.sampled_from(["", "", "", "loc.py:1 h"])))
    with_location = draw(st.booleans())
    return rows, (_stacks(frames) if frames or draw(st.booleans()) else None), \
        (locations if with_location else None), frames


def reference_site(row, location, frames):
    if location:
        return location
    for name, filename, line in frames.get(row["stack_id"], []) if row["stack_id"] is not None else []:
        f = filename.replace("\\", "/")
        if f.endswith(".py") and "/torch/" not in f and not f.startswith("torch/"):
            return f"{f.split('/')[-1]}:{line} {name}"
    if row["op"]:
        return f"{row['module']} {row['op']}" if row["module"] else f"{row['op']} (no Python frame)"
    if row["allocated_before"]:
        return ("(alive before recording)" if row["category"] == "unknown"
                else f"(alive before recording: {row['category']})")
    return "(no stack)"


@SETTINGS
@given(blocks_and_stacks(), st.sampled_from([None, "cuda:0", "cpu"]), st.sampled_from(["site", "stack"]))
def test_sites_match_the_brute_force_reference(case, device, by):
    rows, stacks, locations, frames = case
    trace = _blocks_trace(rows, stacks, location=locations)
    labels = [reference_site(r, (locations or [""] * len(rows))[i], frames) for i, r in enumerate(rows)]
    assert block_sites(trace).tolist() == labels
    groups: dict[str, list[dict]] = {}
    for label, r in zip(labels, rows):
        if device is not None and r["device"] != device:
            continue
        key = label if by == "site" or r["stack_id"] is None else f"{label} [stack {r['stack_id']}]"
        groups.setdefault(key, []).append(r)
    out = sites(trace, device=device, by=by)
    assert list(out.columns) == ["site", "bytes", "blocks", "category", "op", "stack_id"]
    expected = []
    for key, members in groups.items():
        by_cat: dict[str, int] = {}
        for r in members:
            by_cat[r["category"]] = by_cat.get(r["category"], 0) + r["size"]
        largest = max(members, key=lambda r: r["size"])
        expected.append((key, sum(r["size"] for r in members), len(members), max(by_cat, key=by_cat.get),
                         largest["op"], -1 if largest["stack_id"] is None else largest["stack_id"]))
    expected.sort(key=lambda e: -e[1])
    got = [(r.site, int(r.bytes), int(r.blocks), r.category, r.op, -1 if pd.isna(r.stack_id) else int(r.stack_id))
           for r in out.itertuples()]
    assert got == expected
