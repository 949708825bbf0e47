"""2021-era Kineto ops logged without scalars (memlens.io.kineto.legacy): the cost facts of convolutions,
their backwards and max-pools rebuilt on import from the logged sizes (output shape from the consuming op,
stride and padding from the sizes), each backward's facts counted once on the parent, checked on a hand-made
2021-format ResNet stem with answers computed by hand here, and the real 2021-format ResNet-50 retimed within
20% of its measured busy time (skipped without the shared traces).
"""
from __future__ import annotations

import memlens
from _kineto_cases import _gpu, _launch, _memory, _op, by_name
from memlens.io.kineto.importer import kineto_to_trace

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
    from memlens.io.kineto.legacy import conv_params
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
