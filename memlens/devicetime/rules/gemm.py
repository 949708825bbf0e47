"""GEMMs and convolutions: output tiles in waves over the compute units.

Sources: NVIDIA, "Matrix Multiplication Background User's Guide" (Deep Learning Performance docs): tile
and wave quantization, and Tensor Core use needing 16-byte aligned leading dimensions (cuBLAS/CUTLASS
instantiate kernels per alignment, ``align8`` ... ``align1``; an ``align1`` kernel loads and stores one
element per instruction, which is what the H100 profiles show for TimeSformer's 3137-wide products:
``cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1``). NVIDIA, "Convolutional Layers User's
Guide": cuDNN's Tensor Core convolutions run NHWC implicit GEMMs, so NCHW tensors are transposed in and
out (``nchwToNhwcKernel``; MIOpen's ``batched_transpose`` on AMD), and the input channels of each filter
tap are padded to the Tensor Core instruction's K (16 for 16-bit types: PTX ``mma.m16n8k16``, CDNA3
``v_mfma_f32_16x16x16_bf16``). FP32 convolutions without Tensor Cores (V100) run NCHW kernels directly
(``volta_scudnn_128x64_relu_*``): no transposes, no alignment penalty. Depthwise convolutions (one
group per channel) are a stencil over the activation: memory bound. Lavin & Gray, "Fast Algorithms for
Convolutional Neural Networks" (CVPR 2016): Winograd F(2x2, 3x3) does 16 multiplies where direct
convolution does 36 (2.25x fewer); cuDNN picks it (``CUDNN_CONVOLUTION_*_ALGO_WINOGRAD*``) for 3x3
stride-1 convolutions on CUDA cores, which is how the V100 fp32 profile's 3x3 layers run above the fp32
peak when counted in direct-convolution flops.

Alignment: NVIDIA's guide (Tensor Core requirements, cuBLAS >= 11) says Tensor Cores are used at every
size but are most efficient when the dimensions are multiples of 8 for FP16/BF16 and of 4 for TF32, i.e.
16 bytes. A kernel for a narrower alignment (``alignN``: N elements per load) issues 16 / (N x itemsize)
times the loads of the 16-byte one, which is what slows it: the penalty grows with the loads per 16 bytes,
from 1 (aligned) to the GPU's `misaligned_gemm_penalty` for 2-byte ``align1`` (8 loads; measured on the
H100 TimeSformer profile's 3137-wide products); so TF32 ``align1`` (4 loads) pays 3/7 of that excess and
BF16 ``align2`` (4 loads) the same (A100-class parts: ``cp.async`` copies 16, 8 or 4 bytes, so the kernel
for each alignment loses in proportion). On Hopper (compute capability 9.x) the fast kernels load through
the Tensor Memory Accelerator, whose tensor maps need 16-byte strides: any misalignment falls back to the
previous generation's kernels (the H100 bert-small profile's 30522-wide product runs
``cutlass_80_tensorop_bf16_s16816gemm_*_align2``, 41 us, as slow per flop as TimeSformer's ``align1``), so
there the whole penalty applies. FP32 and FP64 products on CUDA cores (``simt_sgemm``, no TF32) are bound by
their FMAs, not their loads: no penalty.
"""
from __future__ import annotations

import math

# candidate GEMM tiles and the share of the peak each reaches (operand reuse falls with the tile size)
GEMM_TILES = ((256, 128, 1.0), (128, 128, 1.0), (128, 64, 0.9), (64, 64, 0.8), (32, 32, 0.5), (16, 16, 0.3))
# split-K factors a library may use when the output has too few tiles to fill the device
SPLIT_K = (1, 2, 4, 8, 16)
WINOGRAD_SAVING = 36 / 16     # F(2x2, 3x3): multiplies of a direct 3x3 convolution per Winograd multiply
# K of one Tensor Core / matrix-core instruction by element size (bytes -> elements)
MMA_K = {2: 16, 1: 32, 4: 8}
ITEMSIZE = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "b8": 1,
            "c64": 8, "c128": 16, "f8e4m3": 1, "f8e5m2": 1}


ALIGN_BYTES = 16          # a Tensor Core kernel's widest load; NVIDIA's "multiples of 8 (FP16) / 4 (TF32)"
WORST_LOADS = 8           # loads per 16 bytes of the slowest kernel measured: 2-byte elements, align1


def alignment_bytes(inputs: list, outputs: list) -> int:
    """The widest load (bytes, a power of two up to 16) that every GEMM operand's innermost dimension
    allows: the largest power of two dividing ``width x itemsize``, the smallest over the operands
    (dimensions of size 1, vectors broadcast along a row, do not count)."""
    widest = ALIGN_BYTES
    for d, shape in inputs + outputs:
        if len(shape) >= 1 and shape[-1] > 1:
            row = shape[-1] * ITEMSIZE.get(d, 4)
            widest = min(widest, row & -row)
    return widest


def aligned(inputs: list, outputs: list) -> bool:
    """Innermost dimensions of every GEMM operand are multiples of 16 bytes."""
    return alignment_bytes(inputs, outputs) >= ALIGN_BYTES


def misalignment_penalty(g, dtype: str, tf32: bool, align: int) -> float:
    """Slowdown of a GEMM whose operands allow loads of `align` bytes: ``1 + (misaligned_gemm_penalty - 1)
    x (16 / align - 1) / 7`` on matrix units (7 = the extra loads of 2-byte ``align1``), the whole
    `misaligned_gemm_penalty` on Hopper (compute capability >= 9.0: no TMA kernel), 1 on CUDA cores (fp32
    without TF32, fp64) and when aligned."""
    if align >= ALIGN_BYTES or not tensor_core(g, dtype, tf32):
        return 1.0
    if g.capability is not None and g.capability >= (9, 0):     # no TMA kernel below 16 bytes
        return g.misaligned_gemm_penalty
    loads = ALIGN_BYTES / max(int(align), 1)
    return 1.0 + (g.misaligned_gemm_penalty - 1.0) * min(loads - 1.0, WORST_LOADS - 1.0) / (WORST_LOADS - 1.0)


def tiled_ns(g, m: int, n: int, batch: int, k: float, dtype: str, bytes_moved: float, *, tf32: bool,
             penalty: float = 1.0, k_efficiency: float = 1.0) -> float:
    """Device ns of a (batched) GEMM ``batch x [m x k] @ [k x n]`` without the kernel floor.

    Per candidate tile the library could pick: ``waves x max(K x gemm_k_ns, tile flops / (per-unit peak x
    gemm_efficiency x tile share x k_efficiency))``, with split-K (fp32 partial sums written and reduced)
    when the tiles cannot fill the device; the fastest tile wins, and the whole is never below the bytes at
    the achieved bandwidth. `penalty` multiplies compute and memory alike (narrow loads and stores).
    """
    m, n = max(int(m), 1), max(int(n), 1)
    per_unit = g.peak_flops(dtype, tf32=tf32) * g.gemm_efficiency * k_efficiency / g.compute_units
    best = math.inf
    for tm, tn, eff in GEMM_TILES:
        tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        tile_ns = 2.0 * tm * tn * k / (per_unit * eff) * 1e9 * penalty
        for split in SPLIT_K:
            if split > 1 and (tiles * split > g.compute_units or k / split < 256):
                break
            waves = math.ceil(tiles * split / g.compute_units)
            reduce_ns = 0.0 if split == 1 else \
                (split + 1) * 4.0 * batch * m * n / (g.mem_bw * g.mem_efficiency) * 1e9
            best = min(best, waves * max(k / split * g.gemm_k_ns, tile_ns / split) + reduce_ns)
    mem_ns = bytes_moved / (g.mem_bw * g.mem_efficiency) * 1e9 * penalty
    return max(best, mem_ns)


def gemm_ns(g, flops: float, inputs: list, outputs: list, dtype: str, bytes_moved: float, *, tf32: bool) -> float:
    """mm / addmm / bmm / baddbmm: the floor plus the tiled time; misaligned operands (innermost
    dimension x element size not a multiple of 16 bytes) pay `misalignment_penalty` on compute and
    memory alike (the ``align1``/``align2``/``align4`` kernels). `tf32`: an fp32 product runs at the TF32
    rate."""
    out_shape = outputs[0][1] if outputs else ()
    if len(out_shape) >= 2:
        m, n, batch = out_shape[-2], out_shape[-1], math.prod(out_shape[:-2])
    elif len(out_shape) == 1:
        m, n, batch = 1, out_shape[0], 1
    else:   # results unknown: rows of the first matrix operand, columns of the last
        mats = [s for _, s in inputs if len(s) >= 2]
        m, n, batch = (mats[0][-2], mats[-1][-1], math.prod(mats[0][:-2])) if mats else (1, 1, 1)
    m, n, batch = max(m, 1), max(n, 1), max(batch, 1)
    k = flops / (2.0 * batch * m * n)
    penalty = misalignment_penalty(g, dtype, tf32, alignment_bytes(inputs, outputs))
    return g.gemm_floor_ns + tiled_ns(g, m, n, batch, k, dtype, bytes_moved, tf32=tf32, penalty=penalty)


def tensor_core(g, dtype: str, tf32: bool) -> bool:
    """The dtype runs on matrix units here: a dense peak above the part's fp32 rate (fp32 only with
    `tf32` on a part with a TF32 rate; never fp64)."""
    from memlens.devicetime.gpus import DTYPE_TO_KEY
    key = DTYPE_TO_KEY.get(dtype, "fp32")
    return g.peak_flops(dtype, tf32=tf32) > g.flops.get("fp32", 0) * 1.01 and key != "fp64"


def conv_ns(g, name: str, flops: float, inputs: list, outputs: list, dtype: str, bytes_moved: float,
            *, tf32: bool) -> tuple[int, float]:
    """(kernels, ns) of a convolution (forward or backward) as an implicit GEMM.

    Forward: M = N x output pixels, N = output channels, K = flops / (2 M N). Backward: one implicit GEMM
    per gradient in the results (input grad: M = N x input pixels, N = C_in; weight grad: M = C_out,
    N = C_in x taps, K = N x output pixels, split over K). On matrix units the channels per filter tap
    are padded to the instruction's K and NCHW activations are transposed in and out (two passes over
    input and output bytes at half the streaming rate); depthwise convolutions (weight [C, 1, kh, kw])
    run at the memory rate.
    """
    backward = name.endswith("convolution_backward")
    x = inputs[1][1] if backward and len(inputs) > 1 else inputs[0][1] if inputs else ()
    w = inputs[2][1] if backward and len(inputs) > 2 else inputs[1][1] if len(inputs) > 1 else ()
    y = inputs[0][1] if backward and inputs else outputs[0][1] if outputs else ()
    stream = g.mem_bw * g.mem_efficiency
    if len(x) < 3 or len(w) < 3 or len(y) < 3:
        return 1, g.gemm_floor_ns + tiled_ns(g, 1, 1, 1, flops / 2.0, dtype, bytes_moved, tf32=tf32)
    if w[1] == 1 and x[1] > 1 and w[0] % x[1] == 0:      # depthwise: a stencil, memory bound
        return 1, g.launch_ns + bytes_moved / stream * 1e9
    itemsize = ITEMSIZE.get({"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(dtype, "f32"), 4)
    on_matrix_units = tensor_core(g, dtype, tf32)
    mma_k = MMA_K.get(itemsize, 8)
    channel_eff = w[1] / (math.ceil(w[1] / mma_k) * mma_k) if on_matrix_units else 1.0
    taps, out_pix, in_pix = math.prod(w[2:]), math.prod(y[2:]), math.prod(x[2:])
    if not on_matrix_units and tuple(w[2:]) == (3, 3) and tuple(x[2:]) == tuple(y[2:]):
        flops /= WINOGRAD_SAVING      # 3x3, stride 1 (same size out): Winograd on CUDA cores
    gemms = []
    if not backward:
        gemms.append((y[0] * out_pix, w[0], 1))
    else:
        shapes = {tuple(s) for _, s in outputs}
        want_input = tuple(x) in shapes or not outputs
        want_weight = tuple(w) in shapes or not outputs
        if want_input:
            gemms.append((x[0] * in_pix, x[1], 1))
        if want_weight:
            gemms.append((w[0], w[1] * taps, 1))
        gemms = gemms or [(y[0] * out_pix, w[0], 1)]
    per = flops / len(gemms)
    ns = 0.0
    for m, n, batch in gemms:
        k = per / (2.0 * m * n)
        ns += g.gemm_floor_ns + tiled_ns(g, m, n, batch, k, dtype, bytes_moved / len(gemms), tf32=tf32,
                                         k_efficiency=channel_eff)
    kernels = len(gemms)
    if on_matrix_units:   # NCHW <-> NHWC transposes of the activations around the NHWC kernels
        act_bytes = (math.prod(x) + math.prod(y)) * itemsize
        ns += 2 * g.launch_ns + 2.0 * act_bytes / (0.5 * stream) * 1e9
        kernels += 2
    return kernels, ns
