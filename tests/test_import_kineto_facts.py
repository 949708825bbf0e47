"""Imported profiles keep their facts and their kernels (issue 24 items 2, 3, 5): cost facts from the logged
shapes, the measured device clock from the profile's own GPU events in every era and for both vendors, and
one clock contract on every trace. Values are checked against hand-made Kineto JSON (answers computed by
hand here) and against the real profiles' raw JSON events (recomputed here, independently of memlens)."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest

import memlens
from memlens.io.kineto import kineto_to_trace
from memlens.schema import CLOCK_KEYS

BF16 = 2


# ---- a hand-made profile ------------------------------------------------------------------------------
def _op(name, ts, dur, ext, dims, types, concrete=None, tid=1, era=2022):
    args = {"External id": ext, "Input Dims": dims, "Input type": types}
    if era >= 2022:
        args["Concrete Inputs"] = concrete or [""] * len(dims)
        args["Input Strides"] = [[*_contiguous(d)] if t.startswith("c10") else [] for d, t in zip(dims, types)]
    return {"ph": "X", "cat": "cpu_op" if era >= 2022 else "Operator", "name": name, "pid": 1,
            "tid": tid if era >= 2022 else str(tid), "ts": ts, "dur": dur, "args": args}


def _contiguous(dims):
    out, step = [], 1
    for d in reversed(dims):
        out.insert(0, step)
        step *= d
    return out


def _launch(ts, corr, ext, era=2022, name="cudaLaunchKernel"):
    key = "External id" if era >= 2022 else "external id"
    return {"ph": "X", "cat": "cuda_runtime" if era >= 2022 else "Runtime", "name": name, "pid": 1,
            "tid": 1 if era >= 2022 else "1", "ts": ts, "dur": 1, "args": {"correlation": corr, key: ext}}


def _gpu(cat, name, ts, dur, corr, era=2022):
    cats = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset"}
    return {"ph": "X", "cat": cat if era >= 2022 else cats[cat], "name": name, "pid": 0,
            "tid": 7 if era >= 2022 else "stream 7", "ts": ts, "dur": dur, "args": {"correlation": corr,
                                                                                      "stream": 7}}


def _memory(ts, nbytes, addr):
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Bytes": nbytes, "Device Type": 1, "Device Id": 0, "Addr": addr}}


def hand_made(era=2022, launch="cudaLaunchKernel"):
    """linear(x[64,128], W[256,128], b[256]) = t(W) + addmm(b, x, W^T) on thread 1, then add(y, y) that
    launches a kernel, a memcpy and a memset, then relu_ that launches nothing; one kernel ran from a launch
    made before profiling began (correlation 99, no runtime call in the trace); the memset (another stream's,
    say) overlaps the memcpy by 1 us. Times in us."""
    bf = "c10::BFloat16"
    ops = [
        _op("aten::linear", 10, 100, 1, [[64, 128], [256, 128], [256]], [bf, bf, bf], era=era),
        _op("aten::t", 12, 5, 2, [[256, 128]], [bf], era=era),
        _op("aten::transpose", 13, 2, 3, [[256, 128], [], []], [bf, "Scalar", "Scalar"], ["", "0", "1"], era=era),
        _op("aten::addmm", 20, 80, 4, [[256], [64, 128], [128, 256], [], []], [bf, bf, bf, "Scalar", "Scalar"],
            ["", "", "", "1", "1"], era=era),
        _op("aten::add", 200, 50, 5, [[64, 256], [64, 256], []], [bf, bf, "Scalar"], ["", "", "1"], era=era),
        _op("aten::relu_", 300, 10, 6, [[64, 256]], [bf], era=era),
    ]
    runtime = [_launch(30, 11, 4, era, launch), _launch(210, 12, 5, era, launch),
               _launch(220, 13, 5, era, "cudaMemcpyAsync"), _launch(230, 14, 5, era, "cudaMemsetAsync")]
    gpu = [_gpu("kernel", "gemm_kernel", 40, 30, 11, era), _gpu("kernel", "add_kernel", 240, 4, 12, era),
           _gpu("gpu_memcpy", "Memcpy DtoD", 250, 6, 13, era), _gpu("gpu_memset", "Memset", 255, 2, 14, era),
           _gpu("kernel", "early_kernel", 1, 5, 99, era)]
    memory = [_memory(21, 64 * 256 * BF16, 4096), _memory(201, 64 * 256 * BF16, 8192)]
    if era < 2022:
        for m in memory:
            del m["args"]["Addr"]
    return {"schemaVersion": 1, "deviceProperties": [{"name": "Hand GPU"}],
            "traceEvents": ops + runtime + gpu + memory}


def by_name(trace):
    return trace.ops.set_index("name")


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
    assert c["device_busy_ns"] == 41_000 and c["kernels"] == 4
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
    from memlens.io.kineto_attrib import nesting
    # thread 0: A [0,10] > B [1,2]; C [3,12] only overlaps A; D [11,13] only overlaps C; E [20,30] > F [20,30]
    # (same span: the first is the parent) > G [25,25] (zero length); thread 1: H [1,5] (alone on its thread)
    start = np.array([0, 1, 3, 11, 20, 20, 25, 1]) * 1000      # ns
    end = np.array([10, 2, 12, 13, 30, 30, 25, 5]) * 1000
    parent, depth = nesting(np.array([0, 0, 0, 0, 0, 0, 0, 1]), start, end)
    assert parent.tolist() == [-1, 0, -1, -1, -1, 4, 5, -1]
    assert depth.tolist() == [0, 1, 1, 1, 0, 1, 2, 0]


def test_union_of_intervals():
    from memlens.io.kineto_kernels import union_ns
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
    assert ops.loc["aten::linear", "device_ns"] == 0 and ops.loc["aten::t", "device_ns"] == 0
    assert r.metadata["clock"]["device_busy_ns"] == ops["device_ns"].sum()


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
    assert memlens.onto_kernel_clock(trace).metadata["clock"]["device_busy_ns"] == 41_000


def test_a_trace_without_kernels_is_refused_by_the_kernel_clock():
    doc = hand_made()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]
    with pytest.raises(memlens.InputError, match="no GPU kernel times"):
        memlens.onto_kernel_clock(kineto_to_trace(doc))


def test_the_streamed_reader_builds_the_same_ops(tmp_path):
    from memlens.io.kineto_stream import import_kineto_streamed
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(hand_made()))
    whole, streamed = memlens.load(path), import_kineto_streamed(path)
    pd.testing.assert_frame_equal(whole.ops, streamed.ops)
    assert whole.metadata["gpu_activity"] == streamed.metadata["gpu_activity"]


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


# ---- the real profiles --------------------------------------------------------------------------------
PROFILES = ["kineto/hta_df_index_resolver.json.gz", "kineto/kineto_resnet50_2021format.pt.trace.json.gz",
            "kineto/tracelens_h100_bert_small.json.gz", "kineto/tracelens_h100_qwen_0.5b_chat.json.gz",
            "kineto/tracelens_h100_timesformer_base.json.gz", "kineto/tracelens_mi300_bert_small.json.gz",
            "kineto/tracelens_mi300_qwen_0.5b_chat.json.gz", "kineto/tracelens_mi300_timesformer_base.json.gz"]
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


def raw_gpu(path) -> dict:
    """From the raw JSON, without memlens: the union (ns) of the kernel/memcpy/memset intervals whose launch
    (a runtime call with the same correlation) is in the trace, and how many have none."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    runtime = {e["args"]["correlation"] for e in events if e.get("ph") == "X" and
               str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver", "runtime")
               and "correlation" in e.get("args", {})}
    acts = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() in _GPU_CATS]
    launched = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in acts
                if e["args"].get("correlation") in runtime]
    busy, run_start, run_end = 0.0, None, None
    for s, e in sorted(launched):
        if run_end is None or s > run_end:
            busy += 0 if run_end is None else run_end - run_start
            run_start, run_end = s, e
        else:
            run_end = max(run_end, e)
    busy += 0 if run_end is None else run_end - run_start
    gemm_flops = 0
    for e in events:
        a = e.get("args") or {}
        if e.get("ph") == "X" and e.get("name") in ("aten::mm", "aten::bmm", "aten::addmm") and a.get("Input Dims"):
            d = a["Input Dims"][1:] if e["name"] == "aten::addmm" else a["Input Dims"]
            gemm_flops += 2 * int(np.prod(d[0])) * d[1][-1]
    return {"busy_ns": busy * 1000, "activities": len(acts), "unlaunched": len(acts) - len(launched),
            "gemm_flops": gemm_flops}


@pytest.mark.parametrize("rel", PROFILES)
def test_real_profile_measured_clock_equals_its_kernels_busy_time(shared, rel):
    path = shared(rel)
    raw = raw_gpu(path)
    trace = memlens.load(path)
    act = trace.metadata["gpu_activity"]
    assert act["activities"] == raw["activities"] and act["launched_before_profiling"] == raw["unlaunched"]
    assert act["launched_outside_ops"] == 0
    clocked = memlens.onto_kernel_clock(trace)
    busy = clocked.metadata["clock"]["device_busy_ns"]
    assert busy == pytest.approx(raw["busy_ns"], rel=0.02)
    assert clocked.metadata["clock"]["kernels"] == raw["activities"] - raw["unlaunched"]
    # nested ops are summed into their top-level op: the top-level ops hold every attributed activity once
    top = trace.ops[trace.ops["parent_op_id"].isna()]
    assert top["kernels"].sum() == raw["activities"] - raw["unlaunched"]


@pytest.mark.parametrize("rel", [p for p in PROFILES if "hta_" not in p])
def test_real_profile_facts_and_retime(shared, rel):
    path = shared(rel)
    raw = raw_gpu(path)
    trace = memlens.load(path)
    ops = trace.ops
    gemm = ops["name"].isin(["aten::mm", "aten::bmm", "aten::addmm"])
    # every GEMM carries its flops (2 M N K, from the logged dims), counted once over the table
    assert ops.loc[gemm, "flops"].sum() == raw["gemm_flops"] > 0
    assert (ops.loc[gemm, "bytes_read"] > 0).all()
    gpu = "MI300X" if "mi300" in rel else "V100" if "2021" in rel else "H100"
    r = memlens.retime(trace, gpu=gpu)
    assert r.metadata["clock"]["kind"] == "modeled" and r.metadata["clock"]["device_busy_ns"] > 0


def test_real_profile_streamed_reader_same_ops(shared):
    from memlens.io.kineto_stream import import_kineto_streamed
    path = shared("kineto/tracelens_mi300_bert_small.json.gz")
    whole, streamed = memlens.load(path), import_kineto_streamed(path)
    pd.testing.assert_frame_equal(whole.ops, streamed.ops)
    assert whole.metadata["gpu_activity"] == streamed.metadata["gpu_activity"]


def test_kernel_summary_reads_the_2021_format(shared):
    """The benchmarks' per-kernel view (`memlens.gpu_activity.kernel_summary`) attributes the 2021 format's
    capitalised Kernel / Memcpy / Memset events too (it found 0 before)."""
    from memlens.gpu_activity import kernel_summary
    path = shared("kineto/kineto_resnet50_2021format.pt.trace.json.gz")
    raw = raw_gpu(path)
    k = kernel_summary(path)
    assert len(k) == raw["activities"] and (k["op"] >= 0).sum() == raw["activities"] - raw["unlaunched"]
    assert (k["end_ns"] - k["start_ns"]).sum() / 1e3 == pytest.approx(
        sum(float(e["dur"]) for e in _raw_events(path) if str(e.get("cat", "")).lower() in _GPU_CATS
            and e.get("ph") == "X"), rel=1e-9)


def _raw_events(path) -> list:
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


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


# ---- 2021-era ops logged without scalars (memlens.io.kineto_legacy) ----------------------------------------
ACT, W3 = [8, 64, 56, 56], [64, 64, 3, 3]
CONV_FLOPS = 2 * 8 * 64 * 64 * 3 * 3 * 56 * 56        # 2 N K C R S P Q
F32, I64 = 4, 8


def legacy_made(grad_input=True):
    """A 2021-format ResNet stem, times in us on thread 1: max_pool2d_with_indices(8x64x112x112) whose result
    the next op takes as its input (8x64x56x56), conv2d's aten::convolution > aten::cudnn_convolution(8x64x56x56,
    64x64x3x3) whose result relu_ takes (8x64x56x56: stride 1, padding 1), then cudnn_convolution_backward
    (input, grad_output, weight) with its _input (unless `grad_input` is False) and _weight children, and the
    pool's backward. No Concrete Inputs: stride, padding and window are not logged."""
    gl, big = "GenericList", [8, 64, 112, 112]
    conv_types = ["float", "float", gl, gl, gl, "Int", "Bool", "Bool", "Bool"]
    child_types = [gl, "float", "float", gl, gl, gl, "Int", "Bool", "Bool", "Bool"]
    ops = [
        _op("aten::max_pool2d_with_indices", 10, 10, 1, [big, [], [], [], [], []], ["float", gl, gl, gl, gl, "Bool"],
            era=2021),
        _op("aten::convolution", 30, 40, 2, [ACT, W3, [], [], [], [], [], [], []],
            ["float", "float", "", gl, gl, gl, "Bool", gl, "Int"], era=2021),
        _op("aten::cudnn_convolution", 32, 30, 3, [ACT, W3, *[[]] * 7], conv_types, era=2021),
        _op("aten::relu_", 80, 5, 4, [ACT], ["float"], era=2021),
        _op("aten::cudnn_convolution_backward", 100, 50, 5, [ACT, ACT, W3, *[[]] * 8], ["float"] * 3 + [gl] * 3
            + ["Int", "Bool", "Bool", "Bool", gl], era=2021),
        _op("aten::cudnn_convolution_backward_weight", 125, 20, 7, [[], ACT, ACT, *[[]] * 7], child_types, era=2021),
        _op("aten::max_pool2d_with_indices_backward", 160, 10, 8, [ACT, big, [], [], [], [], [], ACT],
            ["float", "float", gl, gl, gl, gl, "Bool", "long int"], era=2021),
    ]
    if grad_input:
        ops.append(_op("aten::cudnn_convolution_backward_input", 102, 20, 6, [[], ACT, W3, *[[]] * 7],
                       child_types, era=2021))
    exts = [1, 3, 4, 7, 8] + ([6] if grad_input else [])
    runtime = [_launch(ts, 10 + e, e, 2021) for ts, e in zip([11, 33, 81, 126, 161, 103], exts)]
    gpu = [_gpu("kernel", f"k{e}", 200 + 10 * k, 5, 10 + e, 2021) for k, e in enumerate(exts)]
    memory = [_memory(11, ACT[0] * 64 * 56 * 56 * F32, 0), _memory(33, ACT[0] * 64 * 56 * 56 * F32, 0)]
    for m in memory:
        del m["args"]["Addr"]
    return {"schemaVersion": 1, "deviceProperties": [{"name": "Hand GPU"}], "traceEvents": ops + runtime + gpu + memory}


def test_2021_convolution_and_pool_facts_rebuilt_by_hand():
    ops = by_name(kineto_to_trace(legacy_made()))
    act, w = 8 * 64 * 56 * 56 * F32, 64 * 64 * 3 * 3 * F32
    # forward: on cudnn_convolution (aten::convolution around it has a kernel but no result: it yields)
    conv = ops.loc["aten::cudnn_convolution"]
    assert conv["flops"] == CONV_FLOPS and conv["bytes_read"] == act + w and conv["bytes_written"] == act
    assert conv["shapes"] == "f32[8,64,56,56],f32[64,64,3,3]->f32[8,64,56,56]"
    assert ops.loc["aten::convolution", ["flops", "bytes_read", "bytes_written"]].tolist() == [0, 0, 0]
    # backward: input grad and weight grad, each 2 N K C R S P Q, once, on the parent; the children carry 0
    back = ops.loc["aten::cudnn_convolution_backward"]
    assert back["flops"] == 2 * CONV_FLOPS
    assert back["bytes_read"] == 2 * act + w and back["bytes_written"] == act + w
    for child in ("aten::cudnn_convolution_backward_input", "aten::cudnn_convolution_backward_weight"):
        assert ops.loc[child, ["flops", "bytes_read", "bytes_written"]].tolist() == [0, 0, 0]
    # max-pool: values and int64 indices of the consumer's shape; its backward writes the input's grad
    pool = ops.loc["aten::max_pool2d_with_indices"]
    assert pool["bytes_read"] == 8 * 64 * 112 * 112 * F32 and pool["bytes_written"] == 8 * 64 * 56 * 56 * (F32 + I64)
    pool_back = ops.loc["aten::max_pool2d_with_indices_backward"]
    assert pool_back["bytes_written"] == 8 * 64 * 112 * 112 * F32
    assert pool_back["bytes_read"] == 8 * 64 * 56 * 56 * (F32 + I64) + 8 * 64 * 112 * 112 * F32


def test_2021_convolution_backward_without_input_grad():
    """The first layer's backward computes the weight grad only (no _input child): half the flops."""
    trace = kineto_to_trace(legacy_made(grad_input=False))
    ops = by_name(trace)
    assert ops.loc["aten::cudnn_convolution_backward", "flops"] == CONV_FLOPS
    assert ops.loc["aten::cudnn_convolution_backward", "bytes_written"] == 64 * 64 * 3 * 3 * F32
    assert trace.metadata["op_facts"]["facts_rebuilt_2021"] == 5


def test_2021_legacy_stride_and_padding_from_sizes():
    from memlens.io.kineto_legacy import conv_params
    assert conv_params((8, 64, 56, 56), (64, 64, 3, 3), (8, 64, 56, 56)) == ([1, 1], [1, 1])
    assert conv_params((32, 3, 224, 224), (64, 3, 7, 7), (32, 64, 112, 112)) == ([2, 2], [3, 3])
    assert conv_params((32, 256, 56, 56), (128, 256, 1, 1), (32, 128, 56, 56)) == ([1, 1], [0, 0])
    assert conv_params((32, 512, 28, 28), (1024, 512, 1, 1), (32, 1024, 14, 14)) == ([2, 2], [0, 0])


def test_real_2021_resnet50_retimed_near_its_measured_busy_time(shared):
    """The 2021-format ResNet-50's convolutions and pools carry facts on import (0.35 of the measured busy
    time before: the backward convolutions, 45% of it, had none); each backward's facts are counted once."""
    trace = memlens.load(shared("kineto/kineto_resnet50_2021format.pt.trace.json.gz"))
    ops = trace.ops
    children = ops["name"].str.startswith("aten::cudnn_convolution_backward_")
    assert (ops.loc[children, ["flops", "bytes_read", "bytes_written"]] == 0).all().all()
    fwd = ops.loc[ops["name"] == "aten::cudnn_convolution", "flops"]
    back = ops.loc[ops["name"] == "aten::cudnn_convolution_backward", "flops"]
    assert (fwd > 0).all() and (back > 0).all() and 1.9 < back.sum() / fwd.sum() <= 2
    modeled = memlens.retime(trace, gpu="V100").metadata["clock"]["device_busy_ns"]
    measured = memlens.onto_kernel_clock(trace).metadata["clock"]["device_busy_ns"]
    assert 0.8 <= modeled / measured <= 1.2
