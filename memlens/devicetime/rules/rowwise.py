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
streaming one (AMD's parts use `norm_efficiency` for them too).
"""
from __future__ import annotations

import math

from memlens.devicetime.rules.gemm import ITEMSIZE
from memlens.devicetime.rules.names import BATCH_NORM, SOFTMAX

SOFTMAX_WARP_MAX = 1024     # PyTorch's persistent (warp-per-row) softmax handles rows up to this length


def _largest_bytes(tensors: list) -> float:
    return max((ITEMSIZE.get(d, 4) * math.prod(s) for d, s in tensors), default=0.0)


def rowwise_ns(g, n: str, kernels: int, inputs: list, outputs: list, moved: float) -> float:
    """Device ns of a normalization or softmax op `n` (base name) moving `moved` bytes."""
    floors = (kernels + 1) * g.launch_ns
    if n in SOFTMAX:
        row = inputs[0][1][-1] if inputs and inputs[0][1] else 1
        eff = g.softmax_block_efficiency if row > SOFTMAX_WARP_MAX else g.norm_efficiency
        return floors + moved / (g.mem_bw * eff) * 1e9
    if n in BATCH_NORM:
        passes = 5 if "backward" in n else 3
        eff = g.mem_efficiency if g.vendor != "amd" else g.norm_efficiency
        return floors + max(passes * _largest_bytes(inputs), moved) / (g.mem_bw * eff) * 1e9
    if n == "aten::_native_batch_norm_legit_no_training":
        return g.launch_ns * 2 + moved / (g.mem_bw * g.mem_efficiency) * 1e9
    return floors + moved / (g.mem_bw * g.norm_efficiency) * 1e9


def reduction_ns(g, kernels: int, moved: float) -> float:
    """A reduction kernel then its dependent finishing step: two floors plus the bytes streamed once."""
    return (kernels + 1) * g.launch_ns + moved / (g.mem_bw * g.mem_efficiency) * 1e9
