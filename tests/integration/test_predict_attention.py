"""Grouped-query attention (`scaled_dot_product_attention(..., enable_gqa=True)`) under `memlens.predict`:
the kernel CUDA would run, and what it allocates, counted by hand.

CUDA's flash kernel takes fewer key/value heads than query heads as they are (fp16/bf16, no mask, sm80+);
its backward adds two query-head-sized buffers for the per-group gradient sums. The memory-efficient kernel
does not take grouped heads, so fp32 GQA runs the math path on CUDA (key/value repeated, scores kept).
"""
from __future__ import annotations

import importlib.util

import pytest

from test_predict import built_shim, run_child  # noqa: F401  (built_shim: the module fixture)

BF16, F32 = 2, 4


def _block(n: int) -> int:
    """The caching allocator's rounding of a small request: up to a multiple of 512 bytes."""
    return -(-n // 512) * 512


GQA_CALL = """
import torch.nn.functional as F
B, H, KV, L, D = 2, 8, 2, 256, 64
def attend(dtype):
    with memlens.predict(gpu="H100") as p:
        q = torch.randn(B, H, L, D, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(B, KV, L, D, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(B, KV, L, D, device="cuda", dtype=dtype, requires_grad=True)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.sum().backward()
    b = p.trace.blocks
    b = b[b.device == "cuda:0"].sort_values("alloc_seq")
    return {"peak": p.peak_allocated, "ops": sorted(set(p.trace.ops.name)),
            "blocks": [[o, int(s)] for o, s in zip(b.op, b.requested_size)]}
result = {"bf16": attend(torch.bfloat16), "fp32": attend(torch.float32)}
"""


def test_grouped_query_attention_in_bf16_takes_flash_and_allocates_what_it_does():
    r = run_child(GQA_CALL)
    B, H, KV, L, D = 2, 8, 2, 256, 64
    q, kv, lse = B * H * L * D * BF16, B * KV * L * D * BF16, B * H * L * F32
    group_buffer = B * L * H * D * BF16         # dk_expanded / dv_expanded: key length x query heads
    flash, backward = "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_backward"
    bf16 = r["bf16"]
    assert flash in bf16["ops"] and backward in bf16["ops"] and "aten::bmm" not in bf16["ops"]
    assert bf16["blocks"][:4] == [["aten::randn", q], ["aten::randn", kv], ["aten::randn", kv], [flash, q]]
    assert bf16["blocks"][4] == [flash, lse]
    # backward: dq, dk, dv at the inputs' sizes (K/V heads, not repeated), then the two group buffers
    grads = [blk for blk in bf16["blocks"] if blk[0] == backward]
    assert grads == [[backward, q], [backward, kv], [backward, kv]]
    assert [blk for blk in bf16["blocks"] if blk[0] == "aten::empty"] == [["aten::empty", group_buffer]] * 2
    # the peak, by hand: q, k, v, the output and logsumexp, the philox seed and offset that flash's fake
    # kernel returns (16 B and 8 B on the device: one 512 B block each), `out.sum()` and its gradient seed (one
    # 512 B block each), the three gradients and the two group buffers, all live at the end of the backward
    # (the modelled reduction scratch of `sum` is freed before the backward: not at the peak), and the flash
    # backward's own fp32 scratch, alive with the group buffers: softmax_d (B, H, L rounded to 128) and
    # dq_accum (B, L, H, D rounded to 32)
    softmax_d, dq_accum = B * H * L * F32, B * L * H * D * F32
    peak = (q + 2 * kv + q + lse + 2 * _block(16) + 2 * _block(2) + q + 2 * kv + 2 * group_buffer
            + softmax_d + dq_accum)
    assert bf16["peak"] == peak == 3_164_160 + 16_384 + 1_048_576
    # fp32: no fused CUDA kernel takes grouped heads (flash needs fp16/bf16, memory-efficient has no GQA),
    # so the math path runs, as on CUDA: the scores (B x H x L x L) are materialised
    fp32 = r["fp32"]
    assert flash not in fp32["ops"] and "aten::_scaled_dot_product_efficient_attention" not in fp32["ops"]
    assert ["aten::bmm", B * H * L * L * F32] in fp32["blocks"]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="HuggingFace transformers is not installed (pip install 'memlens[models]')")
def test_transformers_llama_with_grouped_query_attention_against_its_non_gqa_twin():
    """A bf16 Llama from a config with 2 key/value heads for 8 query heads, beside the same model with 8:
    both take flash attention, and the peak (inside AdamW's foreach step) differs by exactly what the
    smaller k_proj/v_proj weigh, five times over (weights, gradients, two moments, the foreach `sqrt`
    temporary). Before grouped heads took flash, the GQA model was predicted 50% above its twin (math path:
    K/V repeated and the 8 x 256 x 256 scores kept per layer)."""
    r = run_child("""
from transformers import LlamaConfig, LlamaForCausalLM
def run(kv):
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                      num_key_value_heads=kv, vocab_size=1000, attn_implementation="sdpa")
    with memlens.predict(gpu="H100", cublas_workspaces=False, kernel_scratch=False) as p:
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters())
        ids = torch.randint(0, 1000, (4, 256), device="cuda")
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    names = list(p.trace.ops.name)
    b = p.trace.blocks
    b = b[b.device == "cuda:0"]
    return {"peak": p.peak_allocated, "flash": names.count("aten::_scaled_dot_product_flash_attention"),
            "math": names.count("aten::bmm"),
            "params": int(b[b.category == "parameter"].requested_size.sum()),
            "empties": sorted(int(s) for o, s in zip(b.op, b.requested_size) if o == "aten::empty")}
result = {"gqa": run(2), "mha": run(8)}
""")
    layers, d, heads, kv, batch, seq = 2, 256, 8, 2, 4, 256
    hd = d // heads
    gqa, mha = r["gqa"], r["mha"]
    assert gqa["flash"] == mha["flash"] == layers and gqa["math"] == mha["math"] == 0
    removed = layers * 2 * d * (heads - kv) * hd * BF16       # k_proj and v_proj: d -> kv x hd instead of d -> d
    assert mha["params"] - gqa["params"] == removed == 393_216
    assert mha["peak"] - gqa["peak"] == 5 * removed
    # the flash backward's group buffers, two per layer, only with grouped heads
    group_buffer = batch * seq * heads * hd * BF16
    assert gqa["empties"].count(group_buffer) - mha["empties"].count(group_buffer) == 2 * layers
