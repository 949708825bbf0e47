"""Imported profiles say which ops copied over the host link (``transfer``) and which ran on the host only
(``device`` "cpu"), so `memlens.retime` prices the copies at the host link and keeps host ops off the GPU
clock. Hand-made Kineto JSON; expected times computed by hand from the H100 constants."""
from __future__ import annotations

import pytest

import memlens
from memlens.devicetime.gpus import gpu as resolve_gpu
from memlens.io.kineto.importer import kineto_to_trace
from memlens.io.kineto.transfer import direction_code

F32 = 4
# the three spellings of a host-to-device copy in real profiles: CUPTI (2022+ and 2021 the same), ROCm (kind)
H2D = {"cupti": ("Memcpy HtoD (Pageable -> Device)", {}),
       "rocm": ("Memcpy HtoD (Host -> Device)", {"kind": "HtoD"})}


def _op(name, ts, dur, ext, dims, types, concrete):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"External id": ext, "Input Dims": dims, "Input type": types, "Concrete Inputs": concrete}}


def _launch(ts, corr, ext, name):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 1,
            "args": {"correlation": corr, "External id": ext}}


def _gpu(cat, name, ts, dur, corr, **extra):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7, **extra}}


def hand_made(h2d="cupti", gpu_activity=True):
    """x.to("cuda") of f32[1000,1000] (aten::to > aten::_to_copy > aten::copy_, the HtoD memcpy launched by
    copy_), then a mul with a kernel, an add of two host tensors that launches nothing, and a copy_ of
    f32[1000] back to the host (DtoH memcpy) and a DtoD copy_. Times in us."""
    f, n = "float", [1000, 1000]
    ops = [
        _op("aten::to", 10, 100, 1, [n, [], [], [], [], [], [], []], [f, "", "", "", "", "Bool", "Bool", ""],
            ["", "", "", "", "", "False", "False", ""]),
        _op("aten::_to_copy", 12, 95, 2, [n, [], [], [], [], [], []], [f, "", "", "", "", "Bool", ""],
            ["", "", "", "", "", "False", ""]),
        _op("aten::copy_", 15, 90, 3, [n, n, []], [f, f, "Bool"], ["", "", "False"]),
        _op("aten::mul", 200, 20, 4, [n, n], [f, f], ["", ""]),
        _op("aten::add", 300, 20, 5, [[64, 256], [64, 256], []], [f, f, "Scalar"], ["", "", "1"]),
        _op("aten::copy_", 400, 20, 6, [[1000], [1000], []], [f, f, "Bool"], ["", "", "False"]),
        _op("aten::copy_", 500, 20, 7, [[1000], [1000], []], [f, f, "Bool"], ["", "", "False"]),
    ]
    name, extra = H2D[h2d]
    gpu = [_launch(20, 11, 3, "cudaMemcpyAsync"), _gpu("gpu_memcpy", name, 30, 70, 11, **extra),
           _launch(205, 12, 4, "cudaLaunchKernel"), _gpu("kernel", "mul_kernel", 210, 5, 12),
           _launch(405, 13, 6, "cudaMemcpyAsync"), _gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 410, 2, 13),
           _launch(505, 14, 7, "cudaMemcpyAsync"), _gpu("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 510, 2, 14,
                                                        kind="DtoD")]
    memory = [{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 13,
               "args": {"Bytes": F32 * 10**6, "Device Type": 1, "Device Id": 0, "Addr": 4096}}]
    return {"schemaVersion": 1, "traceEvents": ops + (gpu if gpu_activity else []) + memory}


def test_direction_of_a_memcpy_from_its_kind_else_its_name():
    assert direction_code("Memcpy HtoD (Pageable -> Device)", {}) == 1
    assert direction_code("Memcpy DtoH (Device -> Pinned)", {}) == 2
    assert direction_code("Memcpy DtoD (Device -> Device)", {}) == 0
    assert direction_code("Memcpy HtoD (Host -> Device)", {"kind": "HtoD"}) == 1
    assert direction_code("Memcpy DtoH (Device -> Host)", {"kind": "DtoH"}) == 2
    assert direction_code("Memcpy HtoD (Host -> Device)", {"kind": "DtoD"}) == 0      # the kind decides
    assert direction_code("CopyHostToDevice", {}) == 1 and direction_code("CopyDeviceToHost", {}) == 2


@pytest.mark.parametrize("h2d", sorted(H2D))
def test_transfer_and_device_on_the_fact_carrying_op(h2d):
    ops = kineto_to_trace(hand_made(h2d)).ops
    row = {i: r for i, r in zip(ops["op_id"], ops.itertuples())}
    # the HtoD memcpy was launched by copy_ (op 2); the facts and the transfer sit on _to_copy (op 1), the
    # outermost op with a kernel of its own; aten::to is a composite, copy_ inside is covered
    assert row[1].bytes_written == F32 * 10**6 and row[1].transfer == "h2d"
    assert row[0].transfer == "" and row[2].transfer == "" and row[2].bytes_written == 0
    assert row[5].transfer == "d2h" and row[6].transfer == ""          # DtoD is no host-link transfer
    assert row[3].transfer == ""
    # the add of host tensors launched nothing: a host op; every op that launched (or nests one) is not
    assert row[4].device == "cpu"
    assert [row[i].device for i in (0, 1, 2, 3, 5, 6)] == [""] * 6


def test_a_trace_without_gpu_activity_marks_no_op_as_host():
    ops = kineto_to_trace(hand_made(gpu_activity=False)).ops
    assert (ops["device"] == "").all() and (ops["transfer"] == "").all()


def test_retime_prices_the_copies_at_the_host_link_and_host_ops_at_zero():
    g = resolve_gpu("H100")
    # the constants the hand computation below uses (memlens/devicetime/gpus.py, rules/memory.host_copy_ns)
    assert (g.launch_ns, g.pageable_bw, tuple(g.host_bw)) == (1_550.0, 11e9, (50e9, 50e9))
    r = memlens.retime(kineto_to_trace(hand_made()), gpu="H100")
    ops = r.ops.set_index("op_id")
    # h2d: the destination's 4,000,000 bytes at min(pageable 11 GB/s, pinned 50 GB/s) plus one launch:
    # 1550 + 4e6 / 11e9 * 1e9 = 1550 + 363636.36 = 365186.36 ns
    assert ops.loc[1, "op_class"] == "transfer" and ops.loc[1, "device_ns"] == 365_186
    # d2h: 4000 bytes: 1550 + 4000 / 11e9 * 1e9 = 1550 + 363.64 = 1913.64 ns
    assert ops.loc[5, "op_class"] == "transfer" and ops.loc[5, "device_ns"] == 1_914
    # the host op: off the GPU clock; without the device column the same add would cost a kernel
    assert ops.loc[4, "op_class"] == "none" and ops.loc[4, "device_ns"] == 0
    assert memlens.retime(kineto_to_trace(hand_made(gpu_activity=False)), gpu="H100").ops.set_index(
        "op_id").loc[4, "device_ns"] > 0
