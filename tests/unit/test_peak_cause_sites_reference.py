"""`memlens.analysis.peak_cause`'s allocation sites against references written here: which frame of a stack
names a block's site, how a stack is said in lines, the site of every kind of block, and the site groups
(bytes, blocks, category, op, stack) by hand and by brute force over small random blocks and stacks
(hypothesis). The cause sentence of the peak is checked in tests/unit/test_peak_cause_reference.py.

The reference rules, from the module's docstring: a block's site is its ``location`` when the source gave
one, else the innermost frame (lowest depth) of its stack whose file ends in ``.py`` and is not under
``torch/`` ("file.py:line function"), else "module op" / "op (no Python frame)", else "(alive before
recording[: category])", else "(no stack)".
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from _peak_cause_refs import _blocks_trace, _row, _stacks  # noqa: E402
from memlens.analysis.peak_cause import _is_torch, block_sites, sites, stack_lines, stack_sites  # noqa: E402

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
