"""Iteration splitting, period detection, per-iteration stats and stability on constructed traces."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memlens.analysis.iterations import allocation_sequence, split_iterations
from memlens.analysis.period import detect_period, exact_match_rate, iteration_starts, template_match
from memlens.analysis.stability import iteration_stability, iteration_stats
from memlens.trace import Trace

LAYERS = 4
PARAM_SIZES = [4096 * (i + 1) for i in range(LAYERS)]
ACT_SIZES = [1000 * (i + 1) for i in range(LAYERS)]


def training_trace(n_iter: int = 6, extra_alloc_in: int | None = None, with_accesses: bool = True,
                   dynamic_shapes: bool = False):
    """A small training loop: parameters allocated before the loop; per iteration a forward that keeps an
    activation per layer and a short temporary, a backward that creates gradients and frees activations, an
    optimizer step (state created in the first step only) and zero_grad freeing gradients.

    With `dynamic_shapes`, activation and temporary sizes change every step (a new sequence length).
    Returns (trace, expected iteration start times, allocated bytes per iteration).
    """
    blocks, accesses = [], []
    bid = 0

    def alloc(t, size, op, category, free=None):
        nonlocal bid
        bid += 1
        blocks.append({"block_id": bid, "device": "cuda:0", "size": size, "alloc_ns": t, "free_ns": free,
                       "op": op, "category": category})
        return bid

    def touch(block, t):
        accesses.append({"block_id": block, "t_ns": t, "op_id": len(accesses), "is_write": False})

    params = [alloc(0, s, "aten::empty", "parameter") for s in PARAM_SIZES]
    state_made = False
    t = 100
    starts, alloc_bytes = [], []
    for it in range(n_iter):
        starts.append(t + 10)
        before = sum(b["size"] for b in blocks)
        acts = []
        for layer in range(LAYERS):
            t += 10
            scale = (it + 1) if dynamic_shapes else 1
            acts.append(alloc(t, ACT_SIZES[layer] * scale, "aten::mm", "activation"))
            touch(params[layer], t)
            touch(acts[-1], t)
            temp = alloc(t + 1, 64 * scale, "aten::add", "temporary", free=t + 3)
            touch(temp, t + 2)
        if extra_alloc_in == it:
            t += 10
            alloc(t, 77, "aten::cat", "temporary", free=t + 1)
        grads = []
        for layer in reversed(range(LAYERS)):
            t += 10
            grads.append(alloc(t, PARAM_SIZES[layer], "aten::mm_backward", "gradient"))
            touch(acts[layer], t)
            blocks[acts[layer] - 1]["free_ns"] = t + 5
        if not state_made:
            for layer in range(LAYERS):
                t += 10
                alloc(t, PARAM_SIZES[layer], "aten::zeros_like", "optimizer_state")
            state_made = True
        for layer in range(LAYERS):
            t += 10
            touch(params[layer], t)
            touch(grads[LAYERS - 1 - layer], t)
        t += 10
        for g in grads:
            blocks[g - 1]["free_ns"] = t
        alloc_bytes.append(sum(b["size"] for b in blocks) - before)
        t += 50
    trace = Trace.from_tables(pd.DataFrame(blocks), pd.DataFrame(accesses) if with_accesses else None)
    return trace, starts, alloc_bytes


def test_detects_iterations_of_training_loop():
    trace, starts, _ = training_trace()
    its = split_iterations(trace)
    assert its["source"].unique().tolist() == ["detected"]
    assert its["start_ns"].tolist() == starts
    assert its["end_ns"].tolist()[:-1] == starts[1:]
    assert its["end_ns"].iloc[-1] == trace.time_span_ns()[1]
    # 4 activations + 4 temporaries + 4 gradients, plus 4 optimizer states in the first step
    assert its["allocations"].tolist() == [16] + [12] * 5
    assert its.attrs["period_allocations"] == 12


def test_detection_falls_back_to_ops_when_sizes_change_every_step():
    # every step allocates new sizes: (op, size) never repeats, the op sequence does
    trace, starts, _ = training_trace(n_iter=12, dynamic_shapes=True)
    its = split_iterations(trace)
    assert its.attrs["keyed_by"] == "op"
    assert its["start_ns"].tolist() == starts
    fixed, _, _ = training_trace(n_iter=6)
    assert split_iterations(fixed).attrs["keyed_by"] == "op and size"


def test_detection_works_without_accesses():
    trace, starts, _ = training_trace(with_accesses=False)
    assert not trace.has_accesses
    its = split_iterations(trace)
    assert its["start_ns"].tolist() == starts and (its["source"] == "detected").all()


def test_markers_and_optimizer_ops_take_precedence():
    trace, _, _ = training_trace(n_iter=3)
    ops = pd.DataFrame({"op_id": [0, 1, 2, 3], "name": ["a", "b", "c", "d"], "start_ns": [5, 40, 300, 700],
                        "end_ns": [6, 41, 301, 701], "iteration": [0, 0, 1, 2]})
    marked = Trace.from_tables(trace.blocks, trace.accesses, ops)
    its = split_iterations(marked)
    assert its["source"].unique().tolist() == ["marker"]
    # nothing is allocated after the last marker (t=700): that empty final iteration is dropped
    assert its["start_ns"].tolist() == [5, 300]
    assert its["end_ns"].tolist() == [300, marked.time_span_ns()[1]]
    ops.loc[3, ["start_ns", "end_ns"]] = [500, 501]
    kept = split_iterations(Trace.from_tables(trace.blocks, trace.accesses, ops))
    assert kept["start_ns"].tolist() == [5, 300, 500]
    by_optimizer = Trace.from_tables(trace.blocks, trace.accesses, ops,
                                     metadata={"iteration_source": "optimizer.step"})
    assert split_iterations(by_optimizer)["source"].unique().tolist() == ["optimizer"]
    by_detection = Trace.from_tables(trace.blocks, trace.accesses, ops, metadata={"iteration_source": "detected"})
    assert split_iterations(by_detection)["source"].unique().tolist() == ["detected"]
    opt = pd.DataFrame({"op_id": [0, 1, 2, 3, 4], "start_ns": [10, 200, 205, 500, 900],
                        "end_ns": [20, 260, 250, 560, 910],
                        "name": ["aten::mm", "Optimizer.step#SGD.step", "aten::add_", "Optimizer.step#SGD.step",
                                 "aten::mm"]})
    optimized = Trace.from_tables(trace.blocks, trace.accesses, opt)
    its = split_iterations(optimized)
    assert its["source"].unique().tolist() == ["optimizer"]
    lo, hi = optimized.time_span_ns()
    assert its["start_ns"].tolist() == [lo, 260, 560]  # the work after the last step is a partial third
    assert split_iterations(optimized, method="detected")["source"].iloc[0] == "detected"
    with pytest.raises(ValueError):
        split_iterations(trace, method="psychic")


def test_no_repetition_gives_one_iteration():
    rng = np.random.default_rng(3)
    n = 400
    blocks = pd.DataFrame({"block_id": np.arange(n), "device": "cpu", "size": rng.integers(1, 10**6, n),
                           "alloc_ns": np.arange(n) * 10, "free_ns": np.arange(n) * 10 + 5})
    its = split_iterations(Trace.from_tables(blocks))
    assert len(its) == 1 and its["source"].iloc[0] == "none"
    assert (its["start_ns"].iloc[0], its["end_ns"].iloc[0]) == (0, (n - 1) * 10 + 5)


def test_period_detection_statistics():
    rng = np.random.default_rng(0)
    pattern = rng.integers(0, 30, 57)
    seq = np.concatenate([rng.integers(0, 30, 13), np.tile(pattern, 20), pattern[:20]])
    found = detect_period(seq)
    assert found.period == 57 and found.z_score > 5
    assert found.match == pytest.approx(exact_match_rate(seq, 57))
    # a layer-repeated forward (sub-period 5) inside a 40-symbol step: the step is the period
    layer = [1, 2, 3, 4, 5]
    step = layer * 4 + list(range(10, 30))
    assert detect_period(np.tile(step, 8)).period == 40
    assert detect_period(np.zeros(100, dtype=np.int64)) is None  # one symbol: no information
    assert detect_period(rng.integers(0, 50, 2000)) is None
    assert detect_period(np.array([1, 2, 3])) is None
    starts = iteration_starts(np.tile(step, 8), anchors=[40], period=40)
    assert starts.tolist() == list(range(0, 320, 40))


def test_allocation_sequence_live_before():
    trace, _, _ = training_trace(n_iter=2)
    seq = allocation_sequence(trace)
    assert len(seq) == len(trace.blocks)
    # parameters first: nothing live before the first, the sum of earlier ones before the others
    assert seq["live_before"].tolist()[:LAYERS] == [0, 4096, 4096 * 3, 4096 * 6]
    assert (seq["live_before"] >= 0).all()


def test_iteration_stats_hand_computed():
    trace, starts, alloc_bytes = training_trace(n_iter=4)
    stats = iteration_stats(trace)
    assert stats["allocated_bytes"].tolist() == alloc_bytes
    assert stats["allocations"].tolist() == [16, 12, 12, 12]
    params = sum(PARAM_SIZES)
    # the peak of a steady step: parameters + optimizer state + all activations + all gradients + one temporary
    # is never reached; activations are freed while gradients are made: compute it from the curve directly
    assert stats["peak_live_bytes"].iloc[1] == _brute_force_peak(trace, starts[1], starts[2])
    assert stats["peak_live_bytes"].iloc[1] >= 2 * params + sum(ACT_SIZES)
    assert stats["accesses"].tolist()[1:] == [4 * 2 + 4 + 4 + 8] * 3
    assert (stats["duration_ns"] > 0).all()


def _brute_force_peak(trace, start, end):
    b = trace.blocks
    points = sorted(set(b["alloc_ns"].dropna().astype(int)) | set(b["free_ns"].dropna().astype(int)))
    best = 0
    for t in [start - 1] + [p for p in points if start <= p < end]:
        alive = (b["alloc_ns"].fillna(0) <= t) & (b["free_ns"].isna() | (b["free_ns"] > t))
        best = max(best, int(b.loc[alive, "size"].sum()))
    return best


def test_stability_identical_steps_and_perturbed_step():
    trace, _, _ = training_trace(n_iter=6)
    stab = iteration_stability(trace)
    assert stab["iterations"] == 6 and stab["source"] == "detected"
    pairs = stab["pairs"].set_index("iteration")
    # steps 1..4 are identical; step 0 also creates 4 optimizer states (bytes-weighted: 51,216 of 92,176)
    steady = sum(ACT_SIZES) + 4 * 64 + sum(PARAM_SIZES)
    assert steady == 51_216
    assert pairs.loc[1, "blocks"] == pytest.approx(steady / (steady + sum(PARAM_SIZES)))
    assert pairs.loc[2:4, "blocks"].tolist() == [1.0, 1.0, 1.0]
    # allocated bytes 92,176 then 51,216; durations [110, 330) = 220 ns then [330, 510) = 180 ns
    assert pairs.loc[1, "bytes"] == pytest.approx(51_216 / 92_176)
    assert pairs.loc[1, "duration"] == pytest.approx(180 / 220)
    assert pairs.loc[2, "ati"] == pytest.approx(1.0) and pairs.loc[2, "peak"] == 1.0
    # the median ignores the warm-up pair and the last step (cut short by the end of the recording)
    assert stab["score"] == 1.0
    assert stab["min_score"] == pytest.approx(pairs.loc[1, ["blocks", "bytes", "peak", "duration", "ati"]].mean())
    assert stab["min_score"] < 0.9
    perturbed, perturbed_starts, _ = training_trace(n_iter=5, extra_alloc_in=3)
    assert split_iterations(perturbed)["start_ns"].tolist() == perturbed_starts
    p = iteration_stability(perturbed)["pairs"].set_index("iteration")
    assert p.loc[3, "blocks"] == pytest.approx(steady / (steady + 77))
    assert p.loc[4, "blocks"] == pytest.approx(steady / (steady + 77))
    single = iteration_stability(trace, split_iterations(trace).iloc[:1])
    assert single["score"] is None


def test_ati_by_iteration_uses_detected_split():
    from memlens.analysis.ati import access_intervals, ati_by

    trace, starts, _ = training_trace(n_iter=4)
    iv = access_intervals(trace)
    by_it = ati_by(trace, "iteration", iv).set_index("iteration")
    # the ATIs (access->access rows) land in the iteration where they start
    ati = iv[iv["kind"] == "access_to_access"]
    expected = np.searchsorted(np.array(starts), ati["start_ns"].to_numpy(), side="right") - 1
    counts = pd.Series(expected).value_counts().sort_index()
    assert by_it["count"].to_dict() == counts.to_dict()
    assert set(by_it.index) >= {0, 1, 2}
