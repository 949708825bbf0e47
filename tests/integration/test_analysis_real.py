"""The Pinpointing observations, checked (or reported honestly) on real recordings.

Data: sample_traces/*.memlens (CPU training/inference recorded by memlens), a fresh recording of a tiny
model made here with memlens.record, and real CUDA snapshots from ../shared/traces (no accesses).
The observations (Li et al., ISPASS 2021): accesses repeat every iteration; ATIs are concentrated near 0;
a host-device bandwidth filter removes most intervals; the large long-idle outliers are activations and
optimizer state. On CPU recordings ops are ~100x slower than on a GPU, so the bandwidth filter removes far
fewer intervals; the tests pin what we measured rather than pretend the GPU finding holds there.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import memlens
from memlens.analysis.ati import access_intervals, ati_stats
from memlens.analysis.findings import findings
from memlens.analysis.iterations import split_iterations
from memlens.analysis.outliers import bandwidth_filter, filter_summary, outliers
from memlens.analysis.peak import peak_breakdown
from memlens.analysis.stability import iteration_stability

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
SAMPLE_NAMES = ("transformer_train_adamw", "mlp_train_sgd_stacks", "cnn_inference")
LONG_LIVED = {"activation", "optimizer_state", "parameter", "gradient", "input", "buffer"}


def load_sample(name: str):
    path = SAMPLES / f"{name}.memlens"
    if not path.exists():
        pytest.skip(f"{path} is absent (regenerate with sample_traces/generate.py)")
    return memlens.load(path)


@pytest.fixture(scope="module")
def fresh_recording():
    """A tiny MLP trained with Adam for 5 steps, recorded now, with a memlens.step() marker per step."""
    torch = pytest.importorskip("torch")
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
    with memlens.record(model) as rec:
        for _ in range(5):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            memlens.step()
    return rec.trace


def _traces(fresh):
    return [(name, load_sample(name)) for name in SAMPLE_NAMES] + [("fresh_mlp_adam", fresh)]


def test_intervals_tile_every_lifetime(fresh_recording):
    for name, trace in _traces(fresh_recording):
        iv = access_intervals(trace)
        assert iv.attrs["accesses_outside_lifetime"] == 0, name
        assert (iv["length_ns"] >= 0).all(), name
        lo, hi = trace.time_span_ns()
        b = trace.blocks.set_index("block_id")
        bounded = (b["free_ns"].fillna(hi).astype(np.int64) - b["alloc_ns"].fillna(lo).astype(np.int64))
        per_block = iv.groupby("block_id")["length_ns"].sum()
        # the intervals and the ops' own run times (their edges clipped to the lifetime: the op that made a
        # block began before its alloc) tile each lifetime (ops are not idle time)
        events = trace.accesses.drop_duplicates(["block_id", "op_id"])
        ops = trace.ops.set_index("op_id")
        t = events["t_ns"].to_numpy(np.int64)
        op_start = np.minimum(events["op_id"].map(ops["start_ns"]).fillna(events["t_ns"]).to_numpy(np.int64), t)
        op_end = np.maximum(events["op_id"].map(ops["end_ns"]).fillna(events["t_ns"]).to_numpy(np.int64), t)
        life_lo = events["block_id"].map(b["alloc_ns"].fillna(lo)).to_numpy(np.int64)
        life_hi = events["block_id"].map(b["free_ns"].fillna(hi)).to_numpy(np.int64)
        busy = np.clip(op_end, life_lo, life_hi) - np.clip(op_start, life_lo, life_hi)
        busy = pd.Series(busy).groupby(events["block_id"].to_numpy()).sum().reindex(per_block.index, fill_value=0)
        if iv.attrs["overlapping_ops"] == 0:
            assert (per_block + busy == bounded.loc[per_block.index]).all(), name
        assert (per_block <= bounded.loc[per_block.index]).all(), name
        # one interval per block plus one per (block, op) that accessed it
        assert len(iv) == len(trace.blocks) + len(events), name


def test_iterations_repeat_and_detection_agrees_with_markers(fresh_recording):
    for name, trace in _traces(fresh_recording):
        marked = split_iterations(trace)
        assert marked["source"].iloc[0] in ("marker", "optimizer"), name
        detected = split_iterations(trace, method="detected")
        assert detected["source"].iloc[0] == "detected", name
        allocs = np.sort(trace.blocks["alloc_ns"].dropna().to_numpy(dtype=np.int64))
        # after the warm-up step, each detected start is the first allocation after a marker
        for m, d in zip(marked["start_ns"].to_numpy()[1:], detected["start_ns"].to_numpy()[1:]):
            assert d >= m and ((allocs >= m) & (allocs < d)).sum() == 0, (name, m, d)
        stab = iteration_stability(trace, marked)
        # the paper's observation: the same blocks, sizes and peak every iteration (a few allocator-only
        # scalars of 4-8 bytes vary in number between steps on CPU, hence "nearly")
        assert stab["components"]["blocks"] > 0.99, (name, stab["components"])
        assert stab["components"]["bytes"] > 0.99 and stab["components"]["peak"] > 0.99, name


def test_ati_concentrated_near_zero(fresh_recording):
    for name, trace in _traces(fresh_recording):
        iv = access_intervals(trace)
        s = ati_stats(iv)
        # a heavy right tail: the median is far below the mean, and 70%+ of intervals are shorter than it
        assert s["p50_ns"] < 0.5 * s["mean_ns"], name
        assert (iv["length_ns"] < s["mean_ns"]).mean() > 0.7, name


def test_bandwidth_filter_on_cpu_recordings_is_reported_honestly(fresh_recording):
    for name, trace in _traces(fresh_recording):
        iv = access_intervals(trace)
        filtered = {bw: filter_summary(bandwidth_filter(iv, bw))["filtered_out_fraction"]
                    for bw in ("zhang", "pcie4", "nvlink_c2c", "inf")}
        # slower links filter out more; the infinite-bandwidth bound filters nothing
        assert filtered["zhang"] >= filtered["pcie4"] >= filtered["nvlink_c2c"] >= filtered["inf"] == 0.0, name
        # the filtered share, recomputed independently from the PCIe 4.0 x16 model: 25 GB/s each way + 10 us
        ati = iv[iv["kind"] == "access_to_access"]  # the filter sees the ATIs only, not the lifetime edges
        round_trip = 2 * (ati["size"].to_numpy() / 25e9 * 1e9 + 10_000)
        assert filtered["pcie4"] == pytest.approx(float(np.mean(ati["length_ns"].to_numpy() < round_trip))), name
        # on CPU timescales (ops ~100x slower than on a GPU) the filter removes far fewer intervals than the
        # paper's GPU runs (we measured 7-50% at PCIe 4.0 here, run to run); the findings say why
        assert any("CPU run" in s for s in findings(trace)), name


def test_large_idle_outliers_are_long_lived_tensors(fresh_recording):
    for name, trace in _traces(fresh_recording):
        top = outliers(trace, "pcie4", top=10)
        # CPU timings are noisy (a temporary can land in the tail of the list on a busy machine), so the
        # check is on the head of the ranking and on bytes
        long_lived = top["category"].isin(LONG_LIVED).to_numpy()
        assert long_lived[:5].all(), (name, top["category"].tolist())
        assert top.loc[long_lived, "size"].sum() >= 0.75 * top["size"].sum(), (name, top["category"].tolist())
        if trace.blocks["category"].eq("optimizer_state").any():  # training: state kept across the step
            # tensors kept across the step or saved for backward; the batch is one of them (the first
            # layer's weight gradient reads it again in backward), never a temporary or a workspace
            head = top["category"].head(5)
            assert head.isin({"activation", "optimizer_state", "parameter", "gradient", "input"}).all(), name
            assert head.isin({"activation", "optimizer_state", "parameter", "gradient"}).sum() >= 4, name


def test_peak_breakdown_on_recordings(fresh_recording):
    for name, trace in _traces(fresh_recording):
        p = peak_breakdown(trace)["cpu"]
        assert p.peak_bytes == trace.peak_live_bytes()["cpu"] == p.by_category["bytes"].sum(), name
        assert not p.notes, name
    transformer = peak_breakdown(load_sample("transformer_train_adamw"))["cpu"]
    assert transformer.by_category["category"].iloc[0] == "activation"


def test_cuda_snapshots_get_lifetime_analyses(shared):
    trace = memlens.load(shared("snapshots/cs336_wedsonlin_medium_128_inference.pickle"))
    # one forward pass of a layered model: the stacks show one model call, so it has no iterations; the
    # layers' repeating pattern (53 allocations per layer) is found only when asked for
    assert split_iterations(trace)["source"].tolist() == ["none"]
    its = split_iterations(trace, method="detected")
    assert its["source"].iloc[0] == "detected" and len(its) >= 20
    assert its.attrs["period_allocations"] == 53
    stab = iteration_stability(trace, its)
    assert stab["components"]["blocks"] == 1.0 and stab["score"] > 0.95
    text = " ".join(findings(trace))
    assert "cannot be computed" in text
    assert "reserved" in text  # fragmentation from the snapshot's segments
    with pytest.raises(memlens.errors.NeedsAccessesError):
        outliers(trace)
