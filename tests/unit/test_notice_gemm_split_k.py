"""Split-K GEMM time with its partial-sum bytes, by hand, on a GPU of round constants.

bf16 [128 x 1024] @ [1024 x 128] on 4 compute units at 10 TFLOP/s (2.5 TFLOP/s per unit), 1 TB/s, K step
0.01 ns, every efficiency 1. The output is one 128x128 tile: three units would idle, so the library splits
K over 4 units and then writes and reduces fp32 partial sums: (split + 1) x 4 bytes x m x n. Every
candidate, by hand (ns; tile time = 2 tm tn K / (per-unit peak x tile share)):
  256x128 (1 tile):  split 1: 26843.5456  split 2: 13421.7728 + 196.608  split 4: 6710.8864 + 327.68
  128x128 (1 tile):  split 1: 13421.7728  split 2: 6710.8864 + 196.608   split 4: 3355.4432 + 327.68 <- best
  128x64 (2 tiles, share 0.9): split 1: 7456.5404  split 2: 3728.2702 + 196.608 = 3924.8782 (split 4: 8 > 4)
  64x64 (4 tiles, 0.8): 4194.304;  32x32 (16 tiles, 0.5): 4 waves x 1677.7216;  16x16: 16 waves x 699.05
Best 3683.1232 ns, above the operand bytes (2 x 128 x 1024 x 2 + 128 x 128 x 2 = 557056 B: 557.056 ns).
"""
from __future__ import annotations

import pytest

from memlens.devicetime.gpu import GPU
from memlens.devicetime.rules import gemm

ROUND = GPU(name="round", flops={"bf16": 1e13, "fp32": 1e12}, mem_bw=1e12, launch_ns=1000.0, compute_units=4,
            gemm_floor_ns=2000.0, gemm_k_ns=0.01, attention_floor_ns=3000.0, gemm_efficiency=1.0,
            attention_efficiency=1.0, mem_efficiency=1.0, misaligned_gemm_penalty=2.0, norm_efficiency=0.4,
            softmax_block_efficiency=0.2, pageable_bw=11e9, host_bw=(25e9, 25e9))
M = N = 128
K = 1024
OPERAND_BYTES = 2 * M * K * 2 + M * N * 2


def test_split_k_time_includes_the_fp32_partial_sums_by_hand():
    """Mutants killed: the partial sums counted as ``split`` (not split + 1) writes, or at 2 bytes (bf16)
    instead of 4 (fp32): 3355.4432 + 262.144 or + 163.84; the split allowed only below the unit count
    (``tiles * split >= compute_units``): 128x64 split 2 would win at 3924.8782; split-K dropped: 4194.304."""
    inputs = [("bf16", (M, K)), ("bf16", (K, N))]
    outputs = [("bf16", (M, N))]
    ns = gemm.gemm_ns(ROUND, 2.0 * M * N * K, inputs, outputs, "bfloat16", float(OPERAND_BYTES), tf32=False)
    assert ns == pytest.approx(2000.0 + 3355.4432 + 327.68, rel=1e-12)


def test_split_k_stops_when_k_per_split_falls_below_256():
    """K = 768: split 4 would leave 192 per split and is not tried. The best is 128x64 split 2:
    2 x 128 x 64 x 768 / (2.5e12 x 0.9) / 2 = 2796.2027 ns + 3 x 4 x 128 x 128 B (196.608 ns) = 2992.8107
    (128x128 split 2: 5033.1648 + 196.608; 64x64: 3145.728).
    Mutant killed: the ``k / split < 256`` check removed (128x128 split 4: 2516.5824 + 327.68 = 2844.2624)."""
    k = 768
    inputs = [("bf16", (M, k)), ("bf16", (k, N))]
    ns = gemm.tiled_ns(ROUND, M, N, 1, float(k), "bfloat16", 0.0, tf32=False)
    assert ns == pytest.approx(2 * 128 * 64 * 768 / (2.5e12 * 0.9) * 1e9 / 2 + 196.608, rel=1e-12)
    assert gemm.aligned(inputs, [("bf16", (M, N))])


def test_batched_split_k_reduces_every_batch_entry():
    """Two 128x128 outputs, K = 1024: two tiles per tile size. 128x128 split 2 fills the 4 units:
    6710.8864 ns + 3 x 4 B x 2 x 128 x 128 (393.216 ns) = 7104.1024, against 128x64 unsplit (4 tiles):
    7456.5404, and 64x64 (8 tiles, 2 waves): 8388.608.
    Mutant killed: the partial sums of one batch entry only (``batch`` dropped from the reduce bytes: 6907.4944)."""
    ns = gemm.tiled_ns(ROUND, M, N, 2, float(K), "bfloat16", 0.0, tf32=False)
    assert ns == pytest.approx(6710.8864 + 393.216, rel=1e-12)
