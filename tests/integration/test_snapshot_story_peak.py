"""Real CUDA snapshots tell the whole story, items 4 to 7: categories (under 10% unknown at the
training snapshot's peak; AdamW's state and gradients by the parameters), the cause of the peak and its sites
(by line or by whole stack, accounting for every byte), `info --json`'s contract, browsable stacks (Python
first, C++ folded; in the timeline's and the explorer's hovers, and the report), binary byte axes, and the
stack facts' Arrow kernels giving the Python predicates' answers on tricky hand-made frames and on real
stacks. Real-snapshot tests skip without the shared traces.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import memlens
from _snapshot_story_refs import TRAINING
from memlens.analysis.peak_cause import peak_cause, stack_lines
from memlens.cli import main


# ---- 4. categories -----------------------------------------------------------------------------------
def test_training_snapshot_categories_leave_under_10_percent_unknown_at_the_peak(shared):
    from memlens.analysis.peak import peak_breakdown

    trace = memlens.load(shared(TRAINING))
    pb = peak_breakdown(trace)["cuda:0"]
    unknown = int(pb.by_category.loc[pb.by_category["category"] == "unknown", "bytes"].sum())
    assert unknown <= 0.10 * pb.peak_bytes
    b = trace.blocks
    assert (b["category_rule"].astype(str) != "").all()
    params = b[b["category"] == "parameter"]
    assert len(params) > 100
    # AdamW state: the recorded step makes two moments (exp_avg, exp_avg_sq) per parameter, each of the
    # parameter's size
    state = b[(b["category"] == "optimizer_state") & b["alloc_ns"].notna()]
    assert len(state) == 2 * len(params)
    assert state["size"].sum() == 2 * params["size"].sum()
    # every parameter has a same-size gradient and optimizer-state block
    sizes = set(b.loc[b["category"] == "gradient", "size"]) & set(b.loc[b["category"] == "optimizer_state", "size"])
    assert set(params["size"]) <= sizes
    # one gradient per parameter: the gradients the backward pass made weigh what the parameters weigh
    made_in_backward = b[(b["category"] == "gradient") & (b["phase"] == "backward")]
    assert made_in_backward["size"].sum() == params["size"].sum()
    # what the optimizer step released of what predates the recording is the previous step's state
    released = b[b["allocated_before"] & (b["category_rule"].str.contains("released by the optimizer step"))]
    assert len(released) and (released["category"] == "optimizer_state").all()
    # the rule is the one that decided: gradients from AccumulateGrad come from the engine's stacks
    acc = b[b["category_rule"] == "allocated under autograd's AccumulateGrad"]
    assert len(acc) and (acc["phase"] == "backward").all()


# ---- 5. the cause of the peak, 7. info --json ----------------------------------------------------------
def test_peak_cause_sentence_and_sites(shared):
    trace = memlens.load(shared(TRAINING))
    cause = peak_cause(trace)["cuda:0"]
    assert cause.phase == "optimizer_step" and "optimizer step" in cause.cause
    assert cause.allocated_bytes == trace.peak_live_bytes()["cuda:0"]
    assert sum(cause.by_category.values()) == cause.allocated_bytes
    assert any(s["site"].startswith("optimizer.py:") for s in cause.top_sites)
    assert [s["bytes"] for s in cause.top_sites] == sorted((s["bytes"] for s in cause.top_sites), reverse=True)


def test_info_json_contract(shared, capsys):
    assert main(["info", "--json", str(shared(TRAINING))]) == 0
    out = json.loads(capsys.readouterr().out)
    peak = out["peak"]["cuda:0"]
    for key in ("allocated_bytes", "reserved_bytes", "by_category", "cause", "top_sites"):
        assert key in peak, key
    assert peak["reserved_bytes"] >= peak["allocated_bytes"] > 0
    assert all(set(s) >= {"site", "bytes"} for s in peak["top_sites"])
    assert out["iterations"] == 1
    assert [p["name"] for p in out["phases"]] == ["forward", "backward", "optimizer_step"]
    assert all(p["start_ns"] <= p["end_ns"] for p in out["phases"])


# ---- 6. stacks ---------------------------------------------------------------------------------------
def test_stack_lines_python_first_cpp_folded(shared):
    trace = memlens.load(shared(TRAINING))
    sid = int(trace.blocks.loc[trace.blocks["location"].str.startswith("model.py"), "stack_id"].iloc[0])
    lines = stack_lines(trace.stacks, sid, 12)
    assert lines[0].startswith("... ") and "C++ frame" in lines[0]  # the allocator/ATen frames, folded
    py = [ln for ln in lines if not ln.startswith("...")]
    assert py and all(".py:" in ln for ln in py)
    from memlens.viz.timeline import timeline
    fig = timeline(trace, device="cuda:0", max_blocks=200)
    hover = [c[5] for t in fig.data if getattr(t, "customdata", None) is not None for c in t.customdata]
    assert any("stack:" in h and ".py:" in h for h in hover)


def test_explorer_hover_shows_the_stack_of_blocks_thinner_than_a_pixel(shared):
    pytest.importorskip("ipywidgets")
    from memlens.widgets import explore

    trace = memlens.load(shared(TRAINING))
    ex = explore(trace)
    hover = [t for t in ex.view_data.traces if t["name"] == "block details (hover)"]
    assert len(hover) == 1 and len(hover[0]["text"]) > 100  # the device's blocks are all under 2 px tall
    with_stack = [h for h in hover[0]["text"] if "stack:" in h]
    # Python frames where the stack has them (the autograd engine's own allocations have only C++ frames)
    assert sum(".py:" in h for h in with_stack) > 0.5 * len(with_stack)
    # the largest blocks in view come first to get markers: the device's largest block has one
    from memlens.units import format_bytes
    b = trace.blocks[trace.blocks["addr"].notna()]
    largest = b.loc[b["size"].idxmax()]
    assert any(h.startswith(f"block {int(largest['block_id'])}: {format_bytes(largest['size'])}")
               for h in hover[0]["text"])


def test_byte_axes_use_binary_units():
    from memlens.viz.labels import binary_ticks

    vals, text = binary_ticks(0, 7 * 2**30)
    assert text[:3] == ["0 GiB", "2 GiB", "4 GiB"] and vals[1] == 2 * 2**30
    vals, text = binary_ticks(2**20, 9 * 2**20)
    assert all(t.endswith(" MiB") for t in text) and vals == [v * 2**20 for v in (2, 4, 6, 8)]


def test_report_states_phases_cause_and_sites_with_stacks(shared):
    from memlens.reporting import build_report

    built = build_report(shared(TRAINING), sections=["phases", "peak", "timeline"])
    assert built.status() == {"phases": "ok", "peak": "ok", "timeline": "ok"}
    html = built.html()
    assert "Optimizer.step#AdamW.step" in html and "backward" in html
    assert "The peak of cuda:0 (" in html and "in the optimizer step" in html
    assert 'class="memlens-stack" title="' in html and "optimizer.py:" in html


def test_sites_by_line_or_by_whole_stack_account_for_every_byte(shared):
    from memlens.analysis.peak_cause import sites

    trace = memlens.load(shared(TRAINING))
    by_line, by_stack = sites(trace), sites(trace, by="stack")
    total = int(trace.blocks["size"].sum())
    assert by_line["bytes"].sum() == by_stack["bytes"].sum() == total
    assert len(by_stack) >= len(by_line)  # a line reached through different callers splits by stack
    # optimizer.py's step allocates at several lines; each line's bytes are the sum of its stacks' bytes
    lines = by_stack["site"].str.replace(r" \[stack \d+\]$", "", regex=True)
    regrouped = by_stack.groupby(lines)["bytes"].sum()
    assert (regrouped.sort_index() == by_line.set_index("site")["bytes"].sort_index()).all()


# ---- stack facts: Arrow kernels give the Python predicates' answers ----------------------------------
def _python_only(monkeypatch):
    """Make every distinct string take the Python predicate (the reference) instead of Arrow's kernels."""
    from memlens.io.snapshot import stacks as snapshot_stacks

    original = snapshot_stacks._Distinct.__init__

    def init(self, values):
        original(self, values)
        self._other_at = np.arange(len(values))
        self._plain_at = np.arange(0)

    monkeypatch.setattr(snapshot_stacks._Distinct, "__init__", init)


def _tricky_stacks() -> pd.DataFrame:
    # names/files on each side of every rule, plus what Arrow and Python could read differently: a trailing
    # newline (Python's `$` matches before it), non-ASCII case (U+0130 lowers to two characters), a Kelvin
    # sign, backslashes (stack tables hold no lone surrogates: `stack_facts`' `astype(str)` refuses them)
    frames = [
        [("zero_grad", "/x/torch/optim/optimizer.py", 3), ("step", "train.py", 9)],
        [("_call_impl", "/x/torch/nn/modules/module.py", 1), ("forward", "model.py", 12),
         ("_call_impl", "/x/torch/nn/modules/module.py", 1), ("main", "train.py", 40)],
        [("torch::autograd::Engine::evaluate_function", "", 0), ("backward", "/x/torch/_tensor.py", 5)],
        [("init_weights\n", "model.py", 2), ("helper", "C:\\x\\util.py", 3)],
        [("init_weights", "model.py", 2), ("make_OPTIMIZER", "setup.py", 1)],
        [("make_optİmizer", "setup.py", 1), ("build_\u212aoptimizer", "setup.py", 2)],
        [("bad\u00ff", "m\u00ff.py", 1), ("cublasLt_gemm", "", 0), ("AccumulateGrad", "", 0)],
        [("reset_parameters_x", "model.py", 3), ("to", "/x/torch/nn/modules/module.py", 8)],
        [("__init__", "/x/torch/utils/_device.py", 1), ("__init__", "model.py", 4)],
        [("xinit_weights", "torch/optim/sgd.py", 1), ("Optimizer", "a.py", 1)],
    ]
    rows = [(sid, depth, name, filename, line) for sid, stack in enumerate(frames)
            for depth, (name, filename, line) in enumerate(stack)]
    return pd.DataFrame(rows, columns=["stack_id", "depth", "name", "filename", "line"])


@pytest.mark.parametrize("source", ["tricky", TRAINING, "snapshots/decomfl_memory.pickle"])
def test_stack_facts_arrow_kernels_match_python_predicates(source, shared, monkeypatch):
    from memlens.io.snapshot.story import stack_facts

    stacks = _tricky_stacks() if source == "tricky" else memlens.load(shared(source)).stacks
    fast = stack_facts(stacks)
    _python_only(monkeypatch)
    pd.testing.assert_frame_equal(fast, stack_facts(stacks))
    if source == "tricky":  # the rules read by hand off the frames above
        assert list(fast["phase"]) == ["zero_grad", "forward", "backward", "", "", "", "backward", "",
                                       "", "optimizer_step"]
        assert list(fast["setup"]) == ["", "", "", "parameter", "optimizer_state", "optimizer_state", "",
                                       "parameter", "parameter", ""]
        assert list(fast["workspace"]) == [False] * 6 + [True] + [False] * 3
        assert list(fast["accumulate_grad"]) == [False] * 6 + [True] + [False] * 3
