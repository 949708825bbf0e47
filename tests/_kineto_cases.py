"""Shared by the Kineto import tests (tests/integration/test_import_kineto_facts.py, tests/unit/test_import_kineto_legacy_facts.py):
builders of hand-made Kineto JSON events (ops, launches, GPU activities, [memory] instants) in the 2022 and
2021 spellings, the hand-made profile whose answers those tests compute by hand, and the ops table by name."""
from __future__ import annotations

BF16 = 2


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
