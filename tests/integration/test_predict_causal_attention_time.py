"""A causal `scaled_dot_product_attention` under `memlens.predict` is priced as causal: the recorder keeps
the kernel's causal flag (an ops-table ``causal`` column), so the cost model counts the key blocks a causal
flash kernel visits, (blocks + 1) / 2 per query block, instead of all of them. Durations by hand."""
from __future__ import annotations

import math

import pytest

from _predict_cases import run_child

CALL = """
import torch.nn.functional as F
def attend(causal):
    with memlens.predict(gpu="H100") as p:
        q, k, v = (torch.randn(1, 8, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()
    o = p.trace.ops
    o = o[o.name.str.contains("flash_attention")]
    return {"names": o.name.tolist(), "ns": (o.end_ns - o.start_ns).tolist(),
            "causal": o["causal"].tolist() if "causal" in o.columns else None}
result = {"causal": attend(True), "full": attend(False)}
"""


def by_hand(kv_blocks: float, backward: bool) -> float:
    """H100 SXM: 989.4 TFLOP/s bf16 x 0.17 (FlashAttention-2 on Hopper) over 132 SMs; 1 x 8 heads x 8 query
    blocks of 128 = 64 blocks, one wave; a block pair 4 x 128 x 128 x 128 flops (x2.5 backward); floor 4.5 us
    (x2 backward); the backward's 3 kernels add 2 launches of 1.55 us."""
    per_sm = 989.4e12 * 0.17 / 132
    work = 1 * kv_blocks * 4 * 128 ** 3 * (2.5 if backward else 1.0) / per_sm * 1e9
    return (9_000 + 2 * 1_550 if backward else 4_500) + work


def test_causal_flash_attention_is_priced_by_the_key_blocks_it_visits():
    r = run_child(CALL)
    causal, full = r["causal"], r["full"]
    assert causal["names"] == ["aten::_scaled_dot_product_flash_attention",
                               "aten::_scaled_dot_product_flash_attention_backward"]
    assert causal["causal"] == [True, True]
    assert full["causal"] is None        # no causal call: no column (absent means not causal)
    blocks = math.ceil(1024 / 128)
    for got, backward in zip(causal["ns"], (False, True)):
        assert got == pytest.approx(by_hand((blocks + 1) / 2, backward), abs=1)
    for got, backward in zip(full["ns"], (False, True)):
        assert got == pytest.approx(by_hand(blocks, backward), abs=1)
