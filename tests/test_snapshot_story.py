"""Real CUDA snapshots tell the whole story (issue 17): reading every era, reserved memory, phases,
iterations, categories, the cause of the peak, `info --json`, browsable stacks, and the one-way layers."""
from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import memlens
from memlens.analysis.iterations import split_iterations
from memlens.analysis.peak_cause import peak_cause, stack_lines
from memlens.cli import main
from memlens.io.safe_pickle import load_pickle
from memlens.reserved import reserved_curve
from memlens.trace import Trace

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ("cs336_wedsonlin_medium_128_training", "cs336_wedsonlin_medium_128_inference", "decomfl_memory",
             "flexgen_opt1.3b_2023format", "verl_segments_only")
TRAINING = "snapshots/cs336_wedsonlin_medium_128_training.pickle"


# ---- 2. robust reading -------------------------------------------------------------------------------
def test_frame_line_of_2_64_minus_1_and_negative_lines_load(shared, tmp_path, capsys):
    raw = load_pickle(shared("snapshots/cs336_wedsonlin_medium_128_inference.pickle"))
    entries = raw["device_traces"][0]
    for i, line in ((5, 2**64 - 1), (6, -1)):  # C++ writes an unknown line as unsigned -1
        entries[i]["frames"] = [dict(f) for f in entries[i]["frames"]]
        entries[i]["frames"][0]["line"] = line
    path = tmp_path / "bad_line.pickle"
    path.write_bytes(pickle.dumps(raw))
    trace = memlens.load(path)
    assert len(trace.blocks) == 1503 and trace.stacks["line"].min() >= 0
    assert any("2 stack frames with a negative, out-of-range" in n for n in trace.metadata["notes"])
    assert main(["info", str(path)]) == 0
    assert "peak live: cuda:0" in capsys.readouterr().out


def test_missing_fields_are_read_and_noted():
    snap = {"segments": [{"device": 0}, {"address": 4096, "blocks": [{"size": 512, "state": "active_allocated",
                                                                      "requested_size": 100}, {"state": "inactive"}]}],
            "device_traces": [[{"action": "alloc", "addr": 4096, "size": 100, "time_us": 5},
                               {"addr": 1, "size": 2, "time_us": 6}]]}
    trace = memlens.io.snapshot.snapshot_to_trace(snap)
    notes = " ".join(trace.metadata["notes"])
    for what in ("segments without an address", "segments without a device", "without total_size",
                 "segment blocks without a size", "trace entries without an action"):
        assert what in notes, what
    assert trace.segments["total_size"].tolist() == [512]  # the blocks tile the segment
    assert (trace.events["action"] == "(no action)").sum() == 1
    newer = memlens.io.snapshot.snapshot_to_trace({**snap, "from_a_future_torch": {"x": 1}})
    assert newer.metadata["other_keys"] == ["from_a_future_torch"]
    assert any("from_a_future_torch" in n for n in newer.metadata["notes"])
    assert (trace.events["action"] == "(no action)").sum() == 1


def test_debug_prints_the_traceback_of_input_errors(tmp_path, capsys):
    bad = tmp_path / "x.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": "x", "size": 1}]]}))
    assert main(["info", str(bad)]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert main(["--debug", "info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("memlens: error:")


# ---- 1. reserved memory ------------------------------------------------------------------------------
def _warm_trace():
    """40 MiB reserved before recording; recording sees +20 MiB then -40 MiB of segments; 30 MiB final."""
    blocks = pd.DataFrame({"block_id": [0, 1], "device": ["cuda:0"] * 2, "size": [30 << 20, 15 << 20],
                           "alloc_ns": [pd.NA, 10], "free_ns": [pd.NA, 20], "alloc_seq": [-1, 1],
                           "free_seq": [pd.NA, 2], "allocated_before": [True, False]})
    events = pd.DataFrame({"seq": [0, 1, 2, 3], "t_ns": [5, 10, 20, 30], "device": ["cuda:0"] * 4,
                           "action": ["segment_alloc", "alloc", "free_completed", "segment_free"],
                           "addr": [1 << 30, 1 << 30, 1 << 30, 2 << 30], "size": [20 << 20, 15 << 20, 15 << 20, 20 << 20],
                           "stream": [0] * 4, "block_id": [pd.NA, 1, 1, pd.NA]})
    segments = pd.DataFrame({"device": ["cuda:0"], "addr": [3 << 30], "total_size": [40 << 20],
                             "allocated_size": [30 << 20], "active_size": [30 << 20],
                             "requested_size": [30 << 20], "stream": [0], "pool": ["large"]})
    return Trace.from_tables(blocks, events=events, segments=segments)


def test_reserved_curve_counts_memory_reserved_before_recording():
    trace = _warm_trace()
    curve = reserved_curve(trace, "cuda:0")
    # final 40 MiB, net of the events 0: 40 MiB at the start (a curve from 0 would dip to -20 MiB)
    assert curve.initial == 40 << 20 and curve.peak == 60 << 20 and curve.final == 40 << 20
    assert curve.reserved.min() >= 0 and curve.raised_by == 0
    live = trace.live_bytes("cuda:0")
    assert (curve.at(live["seq"].to_numpy()) >= live["live"].to_numpy()).all()


def test_reserved_never_below_live_even_when_the_file_contradicts_it():
    trace = _warm_trace()
    trace.segments = trace.segments.assign(total_size=[1 << 20])  # a final state too small for the live block
    curve = reserved_curve(trace, "cuda:0")
    live = trace.live_bytes("cuda:0")
    assert (curve.at(live["seq"].to_numpy()) >= live["live"].to_numpy()).all()
    assert curve.raised_by > 0


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_reserved_agrees_everywhere_and_is_at_least_allocated(shared, name):
    from memlens.analysis.fragmentation import fragmentation
    from memlens.commands.info import story
    from memlens.simulate import simulate

    trace = memlens.load(shared(f"snapshots/{name}.pickle"))
    sim = simulate(trace)
    frag = fragmentation(trace)
    told = story(trace)
    for dev in trace.devices:
        curve = reserved_curve(trace, dev)
        live = trace.live_bytes(dev)
        assert (curve.at(live["seq"].to_numpy()) >= live["live"].to_numpy()).all()
        assert curve.peak >= trace.peak_live_bytes()[dev]
        assert sim.devices[dev].recorded["peak_reserved"] == curve.peak
        assert sim.devices[dev].recorded["initial_reserved"] == curve.initial
        assert frag[dev]["peak_reserved_bytes"] == curve.peak
        assert told["peak"][dev]["reserved_bytes"] == curve.peak
        # the final level is what the file's segments hold
        raw = load_pickle(shared(f"snapshots/{name}.pickle"))
        assert curve.final == sum(s["total_size"] for s in raw["segments"] if f"cuda:{s.get('device', 0)}" == dev)


# ---- 3. phases and iterations ------------------------------------------------------------------------
def test_training_snapshot_phases_and_one_iteration_per_optimizer_step(shared):
    trace = memlens.load(shared(TRAINING))
    raw = load_pickle(shared(TRAINING))
    steps = [a for a in raw["external_annotations"] if a["name"].startswith("Optimizer.step#")]
    n_steps = sum(a["stage"] == "START" for a in steps)
    its = split_iterations(trace)
    assert len(its) == n_steps == 1 and its["source"].iloc[0] == "optimizer"
    phases = trace.metadata["phases"]
    names = [p["name"] for p in phases]
    assert names == ["forward", "backward", "optimizer_step"]
    step = phases[-1]
    t0 = trace.metadata["t0_unix_ns"]
    assert step["source"] == "annotation"
    assert step["start_ns"] == steps[0]["time_us"] * 1000 - t0
    # the backward pass starts at the first event with autograd frames: the engine's, or loss.backward()
    st = trace.stacks
    autograd = st["name"].str.contains("torch::autograd::Engine::", regex=False) | (
        (st["name"] == "backward") & st["filename"].str.replace("\\", "/").str.contains("torch/(?:_tensor|autograd)"))
    engine = st[autograd]["stack_id"]
    first_bwd = trace.events.loc[trace.events["stack_id"].isin(set(engine)), "t_ns"].min()
    assert phases[1]["start_ns"] == first_bwd


def test_forward_only_snapshot_has_no_iterations_from_its_layers(shared):
    trace = memlens.load(shared("snapshots/cs336_wedsonlin_medium_128_inference.pickle"))
    assert [p["name"] for p in trace.metadata["phases"]] == ["forward"]
    assert len(trace.metadata["model_calls"]) == 1
    assert split_iterations(trace)["source"].tolist() == ["none"]
    # the layers do repeat (that is what used to be called 24+ iterations)
    assert len(split_iterations(trace, method="detected")) >= 20


def test_repeated_model_calls_are_iterations(shared):
    trace = memlens.load(shared("snapshots/cs336_wedsonlin_medium_128_inference.pickle"))
    # two forward calls back to back: the second copy of the events shifted after the first
    b = trace.blocks
    span = int(trace.time_span_ns()[1]) + 1000
    seen = b[b["alloc_ns"].notna()].copy()
    seen["block_id"] += int(b["block_id"].max()) + 1
    for c in ("alloc_ns", "free_ns"):
        seen[c] = seen[c] + span
    for c in ("alloc_seq", "free_seq"):
        seen[c] = seen[c] + 10**7
    both = Trace.from_tables(pd.concat([b, seen], ignore_index=True), stacks=trace.stacks)
    from memlens.io.snapshot_story import model_calls, stack_facts
    calls = model_calls(both, stack_facts(both.stacks))
    assert len(calls) == 2 and calls[1] >= span
    both.metadata.update(phases=[{"name": "forward", "start_ns": 0, "end_ns": 2 * span}], phases_from_frames=True,
                         model_calls=calls)
    its = split_iterations(both)
    assert its["source"].iloc[0] == "model calls" and len(its) == 2


def test_diff_aligns_on_real_iterations(shared):
    trace = memlens.load(shared(TRAINING))
    d = memlens.diff(trace, trace)
    assert d.iterations["count_a"] == d.iterations["count_b"] == 1
    assert d.iterations["source_a"] == "optimizer"


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


# ---- 9. layers ---------------------------------------------------------------------------------------
LOWER = {"record": ("memlens.analysis", "memlens.viz", "memlens.report", "memlens.widgets", "memlens.diff",
                    "memlens.simulate", "memlens.plan", "memlens.swap", "memlens.whatif", "memlens.commands"),
         "io": ("memlens.analysis", "memlens.viz", "memlens.report", "memlens.widgets", "memlens.diff",
                "memlens.simulate", "memlens.plan", "memlens.swap", "memlens.whatif", "memlens.commands"),
         "analysis": ("memlens.viz", "memlens.report", "memlens.widgets", "memlens.commands"),
         "simulate": ("memlens.viz", "memlens.report", "memlens.widgets", "memlens.commands")}


@pytest.mark.parametrize("package", sorted(LOWER))
def test_flow_stays_one_way(package):
    files = list((ROOT / "memlens" / package).glob("*.py"))
    if package == "analysis":
        files.append(ROOT / "memlens" / "diff.py")
    bad = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [f"{f.name}: {n}" for n in names if n.startswith(LOWER[package])]
    assert not bad


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
    from memlens.report import build_report

    built = build_report(shared(TRAINING), sections=["phases", "peak", "timeline"])
    assert built.status() == {"phases": "ok", "peak": "ok", "timeline": "ok"}
    html = built.html()
    assert "Optimizer.step#AdamW.step" in html and "backward" in html
    assert "The peak of cuda:0 (" in html and "in the optimizer step" in html
    assert 'class="memlens-stack" title="' in html and "optimizer.py:" in html


def test_python_only_stacks_still_tell_phases_and_categories(shared, tmp_path):
    """`_record_memory_history(stacks="python")`: no C++ frames, and the autograd engine's thread records no
    frames at all; the backward pass is still found (loss.backward() on the main thread) and carried over
    the engine's stack-less events."""
    from memlens.analysis.peak import peak_breakdown

    raw = load_pickle(shared(TRAINING))

    def python_frames(frames):
        return [f for f in frames or () if str(f.get("filename", "")).endswith(".py")]
    for e in raw["device_traces"][0]:
        e["frames"] = python_frames(e.get("frames"))
    for seg in raw["segments"]:
        for blk in seg.get("blocks") or ():
            blk["frames"] = python_frames(blk.get("frames"))
    path = tmp_path / "python_stacks.pickle"
    path.write_bytes(pickle.dumps(raw))
    trace = memlens.load(path)
    assert not trace.stacks["filename"].str.endswith(".py").eq(False).any()
    assert [p["name"] for p in trace.metadata["phases"]] == ["forward", "backward", "optimizer_step"]
    assert len(split_iterations(trace)) == 1
    pb = peak_breakdown(trace)["cuda:0"]
    unknown = int(pb.by_category.loc[pb.by_category["category"] == "unknown", "bytes"].sum())
    assert unknown <= 0.10 * pb.peak_bytes


def test_zero_grad_calls_start_iterations_without_optimizer_steps(shared):
    # DeComFL: zeroth-order training, no backward pass, no optimizer step; SGD.zero_grad is annotated per step
    trace = memlens.load(shared("snapshots/decomfl_memory.pickle"))
    raw = load_pickle(shared("snapshots/decomfl_memory.pickle"))
    zero = [a for a in raw["external_annotations"] if a["name"].startswith("Optimizer.zero_grad#")
            and a["stage"] == "START"]
    its = split_iterations(trace)
    assert its["source"].iloc[0] == "zero_grad" and len(its) == len(zero) == 2
    t0 = trace.metadata["t0_unix_ns"]
    assert its["start_ns"].tolist() == [a["time_us"] * 1000 - t0 for a in zero]


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
    from memlens.io import snapshot_stacks

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
    from memlens.io.snapshot_story import stack_facts

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
