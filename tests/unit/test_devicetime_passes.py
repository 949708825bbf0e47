"""Memory-bound rules whose kernels move more than the logged arguments show, or launch more than one kernel:
layer norm backward (five passes; one launch more on ROCm), MSE loss (a temporary written and reduced),
MIOpen's spatial batch norm (three launches each way), PyTorch's own batch norm (one block per channel). Each price is computed by hand here from the toy GPU's
round constants."""
from __future__ import annotations

from dataclasses import replace

import pytest

from memlens.devicetime import costmodel as cm
from memlens.devicetime.gpus import GPU

# 1 TB/s, 1 us launch floor, streaming at the full rate, row-wise kernels at 0.4 of it
TOY = GPU(name="toy", vendor="nvidia", flops={"bf16": 1e15, "fp32": 1e14}, mem_bw=1e12, launch_ns=1000.0,
          mem_efficiency=1.0, norm_efficiency=0.4)
AMD = replace(TOY, vendor="amd")


def _model(g, name, read, written, shapes, dtype="float32"):
    return cm.model_op(g, name, 0, read, written, dtype, shapes)


def test_layer_norm_backward_reads_dy_and_x_twice():
    # dy, x: f32[64,1024] = 262,144 bytes each; mean, rstd f32[64,1]; weight, bias f32[1024]
    act = 64 * 1024 * 4
    shapes = "f32[64,1024],f32[64,1024],f32[64,1],f32[64,1],f32[1024],f32[1024]->f32[64,1024],f32[1024],f32[1024]"
    read, written = 2 * act + 2 * 256 + 2 * 4096, act + 2 * 4096
    cls, kernels, ns = _model(TOY, "aten::native_layer_norm_backward", read, written, shapes)
    # 2 kernels + 1 finishing floor; five passes over the activation at 0.4 TB/s
    assert (cls, kernels) == ("normalization", 2) and ns == pytest.approx(3000 + 5 * act / 0.4e12 * 1e9)
    # ROCm: partial gamma/beta sums, then their reduction: one floor more
    assert _model(AMD, "aten::native_layer_norm_backward", read, written, shapes)[2] == \
        pytest.approx(4000 + 5 * act / 0.4e12 * 1e9)


def test_mse_loss_writes_and_reduces_a_temporary():
    n_bytes = 4096 * 4
    mean = _model(TOY, "aten::mse_loss", 2 * n_bytes, 4, "f32[4096],f32[4096]->f32[]")
    # elementwise (x - y)^2: read 2N, write N; reduction: read N, then its finishing step; 3 floors
    assert mean == ("reduction", 2, pytest.approx(3000 + (2 * n_bytes + 4 + 2 * n_bytes) / 1e12 * 1e9))
    # reduction="none": the elementwise kernel alone
    none = _model(TOY, "aten::mse_loss", 2 * n_bytes, n_bytes, "f32[4096],f32[4096]->f32[4096]")
    assert none == ("reduction", 1, pytest.approx(1000 + 3 * n_bytes / 1e12 * 1e9))


def test_miopen_spatial_batch_norm_launches_three_kernels_each_way():
    act = 2 * 4 * 8 * 8 * 4                    # 2048 bytes
    fwd = "f32[2,4,8,8],f32[4],f32[4],f32[4],f32[4]->f32[2,4,8,8]"
    # MeanVariance, FinalMeanVariance, Norm + the finishing floor; 3 passes at norm_efficiency
    assert _model(AMD, "aten::miopen_batch_norm", 2112, 2048, fwd)[2] == pytest.approx(4000 + 3 * act / 0.4e12 * 1e9)
    bwd = "f32[2,4,8,8],f32[2,4,8,8],f32[4],f32[4],f32[4]->f32[2,4,8,8]"
    assert _model(AMD, "aten::miopen_batch_norm_backward", 4144, 2048, bwd)[2] == \
        pytest.approx(4000 + 5 * act / 0.4e12 * 1e9)
    # PyTorch's own kernels on ROCm: 3 launches; 4 channels on 100 units: the statistics pass at 4% of the rate,
    # the normalizing pass reads and writes the activation (2 x 2048 bytes > the 2112 bytes left of `moved`)
    assert _model(AMD, "aten::native_batch_norm", 2112, 2048, fwd)[2] == \
        pytest.approx(4000 + act / (0.4e12 * 4 / 100) * 1e9 + 2 * act / 0.4e12 * 1e9)


def test_native_batch_norm_reduces_with_one_block_per_channel():
    # 2 channels on a 4-unit toy: the reductions stream at 2/4 of the rate (1 TB/s streaming on NVIDIA)
    toy = replace(TOY, compute_units=4)
    act = 8 * 2 * 16 * 16 * 4                  # f32[8,2,16,16]: 16,384 bytes
    fwd = "f32[8,2,16,16],f32[2],f32[2],f32[2],f32[2]->f32[8,2,16,16],f32[2],f32[2]"
    read, written = act + 4 * 8, act + 2 * 8
    ns = _model(toy, "aten::native_batch_norm", read, written, fwd)[2]
    # statistics (one read at 0.5 TB/s), then update + normalize (read and write the activation at 1 TB/s:
    # 2 x act > the act + 48 bytes left of `moved`); 3 kernels + 1 floor
    assert ns == pytest.approx(4000 + act / 0.5e12 * 1e9 + 2 * act / 1e12 * 1e9)
    bwd = "f32[8,2,16,16],f32[8,2,16,16],f32[2],f32[2],f32[2],f32[2],f32[2]->f32[8,2,16,16],f32[2],f32[2]"
    ns = _model(toy, "aten::native_batch_norm_backward", 2 * act + 40, act + 16, bwd)[2]
    # one kernel over the C-block grid: five passes at 0.5 TB/s; MULTI_KERNEL's 2 launches + 1 floor
    assert ns == pytest.approx(3000 + 5 * act / 0.5e12 * 1e9)
    # as many channels as units: the whole rate
    wide = "f32[8,4,16,16],f32[4],f32[4],f32[4],f32[4]->f32[8,4,16,16],f32[4],f32[4]"
    act4 = 2 * act
    ns = _model(toy, "aten::native_batch_norm", act4 + 64, act4 + 32, wide)[2]
    assert ns == pytest.approx(4000 + act4 / 1e12 * 1e9 + 2 * act4 / 1e12 * 1e9)
