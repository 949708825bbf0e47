"""Imported profiles keep their facts and their kernels, on hand-made Kineto JSON
with answers computed by hand here: kernels, memcpys and memsets attributed to the ops that launched them in
both eras and for both vendors' launch calls, the measured device clock built from them, cost facts from the
logged shapes (counted once down a chain of ops), op nesting, the streamed reader and kineto_frames agreeing,
clear refusals without shapes or kernels, and one clock contract on every trace. The builders are in
tests/_kineto_cases.py; the real profiles are checked in tests/integration/test_import_kineto_real_profiles.py and the
2021-era rebuilt facts in tests/unit/test_import_kineto_legacy_facts.py."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import memlens
from _kineto_cases import BF16, _memory, _op, by_name, hand_made
from memlens.io.kineto.importer import kineto_to_trace
from memlens.trace.schema import CLOCK_KEYS


@pytest.mark.parametrize("era,launch", [(2022, "cudaLaunchKernel"), (2021, "cudaLaunchKernel"),
                                        (2022, "hipExtModuleLaunchKernel")])
def test_hand_made_kernels_per_op_and_the_measured_clock(era, launch):
    trace = kineto_to_trace(hand_made(era, launch))
    ops = by_name(trace)
    # own activity, with nested ops summed into their parents (us -> ns)
    assert ops.loc["aten::addmm", "kernel_busy_ns"] == 30_000 and ops.loc["aten::addmm", "kernels"] == 1
    assert ops.loc["aten::linear", "kernel_busy_ns"] == 30_000             # addmm's kernel, nested
    assert ops.loc["aten::add", "kernel_busy_ns"] == 4_000 + 6_000 + 2_000 and ops.loc["aten::add", "kernels"] == 3
    assert ops.loc["aten::t", "kernels"] == 0 and ops.loc["aten::relu_", "kernels"] == 0
    t0 = 10  # the trace's t = 0: its first [memory] instant or op, in us (the early kernel ran before it)
    assert ops.loc["aten::add", "kernel_start_ns"] == (240 - t0) * 1000
    assert ops.loc["aten::add", "kernel_end_ns"] == (257 - t0) * 1000
    assert ops.loc["aten::linear", "parent_op_id"] is pd.NA
    assert ops.loc["aten::addmm", "parent_op_id"] == ops.loc["aten::linear", "op_id"]
    assert ops.loc["aten::transpose", "parent_op_id"] == ops.loc["aten::t", "op_id"]
    act = trace.metadata["gpu_activity"]
    assert act["activities"] == 5 and act["attributed"] == 4 and act["launched_before_profiling"] == 1
    # busy time is the union: the memset's 1 us under the memcpy counts once (summed: 30 + 4 + 6 + 2 = 42)
    assert act["attributed_busy_ns"] == 30_000 + 4_000 + 7_000 and act["busy_ns"] == 41_000 + 5_000
    assert act["attributed_sum_ns"] == 42_000
    assert any("launched before profiling began" in n for n in trace.metadata["notes"])

    clocked = memlens.onto_kernel_clock(trace)
    c = clocked.metadata["clock"]
    assert c["kind"] == "cuda" and c["gpu"] == "Hand GPU" and c["from"] == "host"
    # the top-level ops' inclusive times summed (the clock contract): the memset's 1 us under the memcpy
    # counts in both (the union above is 41 us)
    assert c["device_busy_ns"] == 42_000 and c["kernels"] == 4
    out = by_name(clocked)
    assert out.loc["aten::addmm", "device_ns"] == 30_000 and out.loc["aten::linear", "device_ns"] == 30_000
    assert out.loc["aten::add", "device_ns"] == 12_000 and out.loc["aten::relu_", "device_ns"] == 0
    # the clock starts at the first attributed activity; ops span their kernels there
    assert out.loc["aten::addmm", "start_ns"] == 0 and out.loc["aten::addmm", "end_ns"] == 30_000
    assert out.loc["aten::add", "start_ns"] == 200_000 and out.loc["aten::add", "end_ns"] == 217_000
    assert out.loc["aten::relu_", "start_ns"] == out.loc["aten::relu_", "end_ns"] == 217_000
    assert set(c) >= set(CLOCK_KEYS)


@pytest.mark.parametrize("era", [2022, 2021])
def test_hand_made_cost_facts_by_hand(era):
    trace = kineto_to_trace(hand_made(era))
    ops = by_name(trace)
    m, k, n = 64, 128, 256
    # addmm carries the facts (linear is a composite of t and addmm; t and transpose are views)
    assert ops.loc["aten::addmm", "flops"] == 2 * m * k * n
    assert ops.loc["aten::addmm", "bytes_read"] == (n + m * k + k * n) * BF16
    assert ops.loc["aten::addmm", "bytes_written"] == m * n * BF16
    assert ops.loc["aten::addmm", "dtype"] == "bfloat16"
    assert ops.loc["aten::addmm", "shapes"] == "bf16[256],bf16[64,128],bf16[128,256]->bf16[64,256]"
    for composite_or_view in ("aten::linear", "aten::t", "aten::transpose"):
        assert ops.loc[composite_or_view, ["flops", "bytes_read", "bytes_written"]].sum() == 0
    assert ops.loc["aten::linear", "shapes"].startswith("bf16[64,128],bf16[256,128],bf16[256]")
    assert ops.loc["aten::add", "bytes_read"] == 2 * m * n * BF16 and ops.loc["aten::add", "bytes_written"] == m * n * BF16
    assert ops.loc["aten::relu_", "bytes_read"] == m * n * BF16 and ops.loc["aten::relu_", "bytes_written"] == m * n * BF16
    # t (a view: zero facts, as the recorder logs it), addmm, add, relu_; not linear (a composite) nor
    # transpose (inside t)
    assert trace.metadata["op_facts"]["ops_carrying_facts"] == 4
    # the same facts as the recorder's own function gives for the same call
    from memlens.opfacts.costs import op_costs
    # (beta and alpha are keyword-only in the schema: the profiler logs them in order, the recorder by name)
    ref = op_costs("aten::addmm", (((n,), "bfloat16"), ((m, k), "bfloat16"), ((k, n), "bfloat16")),
                   {"beta": 1, "alpha": 1}, out=((m, n), "bfloat16"))
    assert tuple(ref) == tuple(ops.loc["aten::addmm", ["flops", "bytes_read", "bytes_written", "dtype", "shapes"]])


def test_an_external_id_decides_over_the_enclosing_op():
    doc = hand_made()
    # the add's kernel is launched at 210 us, inside add, but the launch names relu_'s External id
    next(e for e in doc["traceEvents"] if e.get("args", {}).get("correlation") == 12
         and e["cat"] == "cuda_runtime")["args"]["External id"] = 6
    ops = by_name(kineto_to_trace(doc))
    assert ops.loc["aten::relu_", "kernel_busy_ns"] == 4_000 and ops.loc["aten::add", "kernel_busy_ns"] == 8_000


def test_nesting_of_ops():
    from memlens.io.kineto.attrib import nesting
    # thread 0: A [0,10] > B [1,2]; C [3,12] only overlaps A; D [11,13] only overlaps C; E [20,30] > F [20,30]
    # (same span: the first is the parent) > G [25,25] (zero length); thread 1: H [1,5] (alone on its thread)
    start = np.array([0, 1, 3, 11, 20, 20, 25, 1]) * 1000      # ns
    end = np.array([10, 2, 12, 13, 30, 30, 25, 5]) * 1000
    parent, depth = nesting(np.array([0, 0, 0, 0, 0, 0, 0, 1]), start, end)
    assert parent.tolist() == [-1, 0, -1, -1, -1, 4, 5, -1]
    assert depth.tolist() == [0, 1, 1, 1, 0, 1, 2, 0]


def test_union_of_intervals():
    from memlens.io.kineto.kernels import union_ns
    s, e = np.array([20, 0, 2, 8, -5]), np.array([25, 10, 5, 12, -3])
    assert union_ns(s, e) == 12 + 5 + 2 and union_ns(s[:0], e[:0]) == 0


def test_facts_are_counted_once_down_a_chain_of_ops():
    """to (a composite) > _to_copy (its own kernel: the recorder's op) > empty_strided, copy_ (inside it):
    the bytes of the conversion are counted once, on _to_copy."""
    f32 = "float"
    ops = [_op("aten::to", 10, 50, 1, [[1000], [], [], [], [], []], [f32, "Scalar", "Scalar", "Scalar", "Scalar", ""],
               ["", "15", "0", "False", "False", ""]),
           _op("aten::_to_copy", 11, 45, 2, [[1000], [], [], [], [], [], []],
               [f32, "Scalar", "", "", "", "Scalar", ""], ["", "15", "", "", "", "False", ""]),
           _op("aten::empty_strided", 12, 3, 3, [[], [], [], [], [], []], ["ScalarList", "ScalarList", "Scalar", "",
                                                                           "Scalar", ""],
               ["[1000]", "[1]", "15", "", "cuda:0", ""]),
           _op("aten::copy_", 20, 30, 4, [[1000], [1000], []], ["c10::BFloat16", f32, "Scalar"], ["", "", "False"])]
    trace = kineto_to_trace({"traceEvents": ops + [_memory(12, 2000, 4096)]})
    t = by_name(trace)
    assert t.loc["aten::_to_copy", "bytes_read"] == 4000 and t.loc["aten::_to_copy", "bytes_written"] == 2000
    assert trace.ops["bytes_read"].sum() == 4000 and trace.ops["bytes_written"].sum() == 2000
    assert t.loc["aten::copy_", "shapes"] == "bf16[1000],f32[1000]->bf16[1000]"


def test_retime_works_on_an_imported_profile():
    trace = kineto_to_trace(hand_made())
    r = memlens.retime(trace, gpu="H100")
    ops = by_name(r)
    assert r.metadata["clock"]["kind"] == "modeled" and set(r.metadata["clock"]) >= set(CLOCK_KEYS)
    assert ops.loc["aten::addmm", "op_class"] == "gemm" and ops.loc["aten::addmm", "device_ns"] > 0
    assert ops.loc["aten::linear", "device_self_ns"] == 0 and ops.loc["aten::t", "device_ns"] == 0
    # nested ops: linear's inclusive time is addmm's; the busy time counts addmm once
    assert ops.loc["aten::linear", "device_ns"] == ops.loc["aten::addmm", "device_ns"]
    assert r.metadata["clock"]["device_busy_ns"] == ops["device_self_ns"].sum()


def test_a_trace_without_shapes_is_refused_with_the_reason():
    doc = hand_made()
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op":
            e["args"] = {"External id": e["args"]["External id"]}
    trace = kineto_to_trace(doc)
    assert trace.metadata["op_facts"]["ops_with_shapes"] == 0
    assert any("record_shapes=True" in n for n in trace.metadata["notes"])
    with pytest.raises(memlens.InputError, match="record_shapes=True"):
        memlens.retime(trace)
    assert memlens.onto_kernel_clock(trace).metadata["clock"]["device_busy_ns"] == 42_000


def test_a_trace_without_kernels_is_refused_by_the_kernel_clock():
    doc = hand_made()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]
    with pytest.raises(memlens.InputError, match="no GPU kernel times"):
        memlens.onto_kernel_clock(kineto_to_trace(doc))


def test_the_streamed_reader_builds_the_same_ops(tmp_path):
    from memlens.io.kineto.stream import import_kineto_streamed
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(hand_made()))
    whole, streamed = memlens.load(path), import_kineto_streamed(path)
    pd.testing.assert_frame_equal(whole.ops, streamed.ops)
    assert whole.metadata["gpu_activity"] == streamed.metadata["gpu_activity"]


@pytest.mark.parametrize("era", [2022, 2021])
def test_kineto_frames_reads_every_era(era):
    """`memlens.gpu_activity.kineto_frames` (the benchmarks' per-kernel view) on the hand-made profile: the
    2021 spellings (Operator, Runtime, Kernel / Memcpy / Memset, 'external id') give the same frames."""
    from memlens.gpu_activity import attribute_activity, kineto_frames
    ops, launches, acts = kineto_frames(hand_made(era))
    assert len(ops) == 6 and len(launches) == 4 and len(acts) == 5
    assert sorted(acts["category"]) == ["gpu_memcpy", "gpu_memset", "kernel", "kernel", "kernel"]
    assert launches["external_id"].tolist() == [4, 5, 5, 5]
    att = attribute_activity(ops, launches, acts)
    names = ops["name"].to_numpy()
    assert [names[o] if o >= 0 else None for o in att["op"]] == ["aten::addmm", "aten::add", "aten::add",
                                                                  "aten::add", None]
    assert (acts["end_ns"] - acts["start_ns"]).tolist() == [30_000, 4_000, 6_000, 2_000, 5_000]


# ---- one clock contract -------------------------------------------------------------------------------
def test_every_trace_carries_the_same_clock_dict(tmp_path):
    bare = memlens.Trace.from_tables(pd.DataFrame({"block_id": [0], "device": ["cpu"], "size": [8],
                                                   "alloc_ns": [0], "free_ns": [10]}))
    assert bare.metadata["clock"] == dict.fromkeys(CLOCK_KEYS) | {"kind": "host"}
    imported = kineto_to_trace(hand_made())
    assert imported.metadata["clock"] == dict.fromkeys(CLOCK_KEYS) | {"kind": "host", "source_units": "ts_us"}
    # a trace saved before the contract held the clock as a string: it loads as the dict
    saved = imported.save(tmp_path / "old.memlens")
    manifest = json.loads((saved / "manifest.json").read_text())
    manifest["metadata"]["clock"] = "ts_us"
    (saved / "manifest.json").write_text(json.dumps(manifest))
    again = memlens.load(saved)
    assert again.metadata["clock"] == imported.metadata["clock"]
    manifest["metadata"].pop("clock")
    (saved / "manifest.json").write_text(json.dumps(manifest))
    assert memlens.load(saved).metadata["clock"] == bare.metadata["clock"]


def test_a_cpu_recording_has_the_clock_and_retiming_drops_the_cpu_caveat():
    import torch
    from memlens.analysis.findings import findings
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(32, 64)
    with memlens.record(model, allocator="none") as rec:
        for _ in range(2):
            model(x).sum().backward()
            memlens.step()
    trace = rec.trace
    assert trace.metadata["clock"]["kind"] == "host" and set(trace.metadata["clock"]) == set(CLOCK_KEYS)
    caveat = "These times come from a CPU run"
    assert any(caveat in s for s in findings(trace))
    retimed = memlens.retime(trace, gpu="H100")
    assert retimed.metadata["clock"]["kind"] == "modeled" and retimed.metadata["clock"]["from"] == "host"
    assert not any(caveat in s for s in findings(retimed))
