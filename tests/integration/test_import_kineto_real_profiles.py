"""Imported real Kineto profiles against their raw JSON events, recomputed here independently of
memlens: the measured device clock equals the union of the launched kernel/memcpy/memset intervals on every
profile (both eras, both vendors) and the top-level ops hold every attributed activity once; every GEMM carries
its flops once and the profile retimes; the streamed reader builds the same ops; and the benchmarks'
kernel_summary reads the 2021 format. Skipped without the shared traces.
"""
from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest

import memlens

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
    from memlens.io.kineto.stream import import_kineto_streamed
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
