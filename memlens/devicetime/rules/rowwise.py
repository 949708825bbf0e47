"""Normalizations, softmax and reductions: a reduction over each row (or channel), then a dependent pass.

Sources: PyTorch's CUDA kernels. Softmax (aten/src/ATen/native/cuda/SoftMax.cu,
PersistentSoftmax.cuh): rows of at most 1024 elements go to the warp-per-row "persistent" softmax;
longer rows to ``cunn_SoftMaxForward``, one thread block per row with two block-wide reductions (max,
then sum of exponentials) before the write, which leaves the memory system idle between passes: on the
H100 and MI300X TimeSformer profiles it reaches 0.20 of HBM bandwidth on both parts
(`softmax_block_efficiency`), against ~0.4 (H100) / ~0.25 (MI300X) for the row-wise layer norm
(`norm_efficiency`: ``vectorized_layer_norm_kernel``, a Welford reduction per row, then the normalized
write). Batch norm in training (Normalization.cuh: ``batch_norm_collect_statistics`` then
``batch_norm_transform_input``; cuDNN's ``bn_fw_tr_1C11`` / ``bn_bw_1C11`` do the same passes) streams the
activation three times forward (read for statistics, read to normalize, write) and five times backward
(x and dy for the reductions, x and dy again, dx written) at the streaming rate; in eval mode it is one
elementwise pass (read, write). MIOpen's batch norm kernels reach the row-wise efficiency, not the
streaming one (AMD's parts use `norm_efficiency` for them too), and MIOpen's spatial training kernels for
large activations split each pass: forward ``MIOpenBatchNormFwdTrainSpatialMeanVariance``,
``...FinalMeanVariance``, ``...Norm`` (3 launches), backward with the saved statistics
``MIOpenBatchNormBwdSpatialDScaleDBias``, ``...FinalDScaleDBias``, ``...DX`` (3 launches).

PyTorch's own batch norm kernels for a contiguous (NCHW) activation reduce with one thread block per channel
(``batch_norm_collect_statistics_kernel``, ``batch_norm_backward_kernel``: a grid of C blocks), so with fewer
channels than compute units the reduction streams at C / units of the rate (ResNet's 64-channel layers on the
304-CU MI300X: 0.21); the forward launches the statistics, their update and inversion, and the normalizing
pass (three kernels), the backward one kernel over that same grid.

Layer norm backward (aten/src/ATen/native/cuda/layer_norm_kernel.cu) reads dy and x twice: once for the input
gradient (``layer_norm_grad_input_kernel``; on ROCm ``cuComputeGradInput``) and once for the weight and bias
gradients (``GammaBetaBackwardCUDAKernel``; on ROCm ``cuComputePartGradGammaBeta`` then
``cuComputeGradGammaBeta``, one launch more): five passes over the activation (dy, x, dy, x, dx), where the
logged bytes count three. MSE loss with a mean or sum (aten/src/ATen/native/Loss.cpp) writes the squared
differences to a temporary (one elementwise kernel) and reduces it (a reduction and its finishing step): the
temporary is written and read back, bytes the logged arguments do not show.
"""
from __future__ import annotations

import math

from memlens.devicetime.rules.gemm import ITEMSIZE
from memlens.devicetime.rules.names import BATCH_NORM, SOFTMAX

SOFTMAX_WARP_MAX = 1024     # PyTorch's persistent (warp-per-row) softmax handles rows up to this length
MIOPEN_BATCH_NORM_KERNELS = 3
LAYER_NORM_BACKWARD_PASSES = 5          # dy, x (input grad), dy, x (gamma/beta grads), dx written
LAYER_NORM_BACKWARD = frozenset({"aten::native_layer_norm_backward"})
MIOPEN_BATCH_NORM = frozenset({"aten::miopen_batch_norm", "aten::miopen_batch_norm_backward"})
# PyTorch's own kernels (Normalization.cuh), which ROCm runs for bf16 too
NATIVE_BATCH_NORM = frozenset({"aten::native_batch_norm", "aten::_native_batch_norm_legit",
                               "aten::_batch_norm_with_update", "aten::native_batch_norm_backward",
                               "aten::batch_norm_backward"})
NATIVE_BATCH_NORM_KERNELS = 3       # statistics, their update and inversion, the normalizing pass


def _largest_bytes(tensors: list) -> float:
    return max((ITEMSIZE.get(d, 4) * math.prod(s) for d, s in tensors), default=0.0)


def rowwise_ns(g, n: str, kernels: int, inputs: list, outputs: list, moved: float, strided: bool = False) -> float:
    """Device ns of a normalization or softmax op `n` (base name) moving `moved` bytes; `strided`: the input
    is not contiguous (channels-last batch norm runs other kernels, with no per-channel grid)."""
    floors = (kernels + 1) * g.launch_ns
    if n in SOFTMAX:
        row = inputs[0][1][-1] if inputs and inputs[0][1] else 1
        eff = g.softmax_block_efficiency if row > SOFTMAX_WARP_MAX else g.norm_efficiency
        return floors + moved / (g.mem_bw * eff) * 1e9
    if n in BATCH_NORM:
        passes = 5 if "backward" in n else 3
        eff = g.mem_efficiency if g.vendor != "amd" else g.norm_efficiency
        act = _largest_bytes(inputs)
        rate = g.mem_bw * eff
        if n in NATIVE_BATCH_NORM and not strided and inputs and len(inputs[0][1]) >= 3:
            # one thread block per channel for the reductions: C blocks fill C of the compute units
            reducing = rate * min(1.0, inputs[0][1][1] / g.compute_units)
            if "backward" in n:     # one kernel: reductions and the input gradient, grid of C blocks
                return floors + max(passes * act, moved) / reducing * 1e9
            floors = (NATIVE_BATCH_NORM_KERNELS + 1) * g.launch_ns
            return floors + (act / reducing + max(2 * act, moved - act) / rate) * 1e9
        if n in MIOPEN_BATCH_NORM:      # 3 launches each way
            floors = (MIOPEN_BATCH_NORM_KERNELS + 1) * g.launch_ns
        return floors + max(passes * act, moved) / rate * 1e9
    if n in LAYER_NORM_BACKWARD:
        if g.vendor == "amd":       # ROCm's partial gamma/beta sums then their reduction
            floors += g.launch_ns
        return floors + max(LAYER_NORM_BACKWARD_PASSES * _largest_bytes(inputs), moved) / \
            (g.mem_bw * g.norm_efficiency) * 1e9
    if n == "aten::_native_batch_norm_legit_no_training":
        return g.launch_ns * 2 + moved / (g.mem_bw * g.mem_efficiency) * 1e9
    return floors + moved / (g.mem_bw * g.norm_efficiency) * 1e9


def reduction_ns(g, kernels: int, moved: float) -> float:
    """A reduction kernel then its dependent finishing step: two floors plus the bytes streamed once."""
    return (kernels + 1) * g.launch_ns + moved / (g.mem_bw * g.mem_efficiency) * 1e9


def mse_loss_ns(g, inputs: list, outputs: list, moved: float) -> tuple[int, float]:
    """(kernels, ns) of ``mse_loss``: the squared differences as one elementwise kernel writing a temporary
    of the input's size; with a reduced (scalar) result, a reduction reads it back (two more floors).
    Without a reduction the result is that elementwise output."""
    temp = _largest_bytes(inputs[:1])
    reduced = bool(inputs and outputs) and math.prod(outputs[0][1]) == 1 < math.prod(inputs[0][1])
    if not reduced:
        return 1, g.launch_ns + moved / (g.mem_bw * g.mem_efficiency) * 1e9
    return 2, g.launch_ns + reduction_ns(g, 1, moved + 2.0 * temp)
