"""Flash attention backward's scratch (``softmax_d``, ``dq_accum``) in a prediction, bytes worked out by hand from
``mha_bwd``'s sizing: fp32 softmax_d (batch, heads, seqlen_q rounded up to 128) and fp32 dq_accum (batch,
seqlen_q rounded, heads, head dim rounded up to 32 at <= 128)."""
from __future__ import annotations

from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)
from memlens.prediction.scratch.flash import flash_backward_scratch_bytes

B, H, S, D = 2, 3, 200, 40       # 200 -> 256 rows; 40 -> 64 (a multiple of 32)


def test_mha_bwd_sizes_by_hand_at_the_rounding_boundaries():
    assert flash_backward_scratch_bytes(B, H, S, D, False, 132) == (4 * 2 * 3 * 256, 4 * 2 * 256 * 3 * 64)
    # exact multiples stay; 128 -> 128 (multiple of 32), 129 pads to 136 (8) then rounds to 192 (multiple of 64)
    assert flash_backward_scratch_bytes(1, 1, 128, 128, False, 132) == (4 * 128, 4 * 128 * 128)
    assert flash_backward_scratch_bytes(1, 1, 129, 129, False, 132) == (4 * 256, 4 * 256 * 192)
    # deterministic: ceil(132 SMs / (2 x 3)) = 22 splits of dq_accum
    assert flash_backward_scratch_bytes(B, H, S, D, True, 132)[1] == 22 * 4 * 2 * 256 * 3 * 64


def test_flash_backward_scratch_blocks_in_a_prediction():
    r = run_child(f"""
import torch.nn.functional as F
def step():
    q, k, v = (torch.randn({B}, {H}, {S}, {D}, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
p = memlens.predict(step, gpu="H100")
b = p.trace.blocks
ops = p.trace.ops.set_index("op_id")
w = b[b.op.str.startswith("flash_bwd")].sort_values("alloc_ns")
result = {{"blocks": [[o, int(s), int(a), int(f)] for o, s, a, f in zip(w.op, w.requested_size, w.alloc_ns, w.free_ns)],
          "ops": sorted({{str(ops.loc[i, "name"]) for i in w.alloc_op_id}}), "cats": sorted(set(w.category)),
          "inside": bool(all(ops.loc[i, "start_ns"] <= a and f <= ops.loc[i, "end_ns"]
                             for i, a, f in zip(w.alloc_op_id, w.alloc_ns, w.free_ns)))}}
""")
    softmax_d, dq_accum = 4 * B * H * 256, 4 * B * 256 * H * 64        # 6,144 and 393,216 bytes
    assert [x[:2] for x in r["blocks"]] == [["flash_bwd softmax_d (modelled)", softmax_d],
                                            ["flash_bwd dq_accum (modelled)", dq_accum]]
    assert r["cats"] == ["workspace"] and r["inside"]
    assert r["ops"] == ["aten::_scaled_dot_product_flash_attention_backward"]
    (_, _, a_sd, f_sd), (_, _, a_dq, f_dq) = r["blocks"]
    assert a_sd < a_dq < f_dq < f_sd          # softmax_d first, dq_accum freed first
