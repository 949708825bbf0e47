"""Real CUDA snapshots tell the whole story, item 3: phases and iterations. The training snapshot
gets forward, backward and optimizer-step phases (the step from its annotation, the backward from the first
autograd frames) and one iteration per optimizer step, also when its stacks are Python-only; a forward-only
snapshot gets no iterations from its repeating layers, while repeated model calls are iterations; zero_grad
calls start iterations where there is no optimizer step; and diff aligns on the real iterations. Skipped
without the shared traces.
"""
from __future__ import annotations

import pickle

import pandas as pd

import memlens
from _snapshot_story_refs import TRAINING
from memlens.analysis.iterations import split_iterations
from memlens.io.safe_pickle import load_pickle
from memlens.trace import Trace


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
    from memlens.io.snapshot.story import model_calls, stack_facts
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
