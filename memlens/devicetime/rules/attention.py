"""Fused (flash) attention, full and causal.

Source: Dao, "FlashAttention-2" (arXiv 2307.08691): one thread block per (batch, head, block of 128
query rows), looping over 128-key blocks; with a causal mask a query block visits only the key blocks at
or before it (on average (blocks + 1) / 2 of them), the diagonal block at full cost. Shah et al.,
"FlashAttention-3" (arXiv 2407.08608): FlashAttention-2 reaches ~35% of the H100's dense peak at best
(long sequences, head dim 128), which is why `attention_efficiency` sits well below `gemm_efficiency`.
"""
from __future__ import annotations

import math

from memlens.devicetime.rules.names import ATTENTION_BSHD, base_name

ATTN_BLOCK = 128


def attention_ns(g, name: str, inputs: list, flops: float, dtype: str, *, backward: bool, causal: bool) -> float:
    """``attention_floor_ns (x2 backward) + waves x key blocks visited x block flops / (per-unit peak x
    attention_efficiency)``; backward blocks do 2.5x the forward work. Without 4-D shapes: the op's
    flops at the attention efficiency."""
    q = inputs[0][1] if inputs else ()
    k = inputs[1][1] if len(inputs) > 1 else q
    if len(q) == 4:
        if base_name(name) in ATTENTION_BSHD:
            b, sq, h, d = q
            skv = k[1] if len(k) == 4 else sq
        else:
            b, h, sq, d = q
            skv = k[2] if len(k) == 4 else sq
        blocks = b * h * math.ceil(sq / ATTN_BLOCK)
        kv_blocks = math.ceil(skv / ATTN_BLOCK)
        if causal:
            kv_blocks = (kv_blocks + 1) / 2.0
        block_flops = 4.0 * ATTN_BLOCK * ATTN_BLOCK * d * (2.5 if backward else 1.0)
        per_unit = g.peak_flops(dtype) * g.attention_efficiency / g.compute_units
        waves = math.ceil(blocks / g.compute_units)
        work = waves * kv_blocks * block_flops / per_unit * 1e9
    else:
        work = flops / (g.peak_flops(dtype) * g.attention_efficiency) * 1e9 * (0.5 if causal else 1.0)
    return g.attention_floor_ns * (2.0 if backward else 1.0) + work
