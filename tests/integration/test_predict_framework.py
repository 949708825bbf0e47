"""A large-framework-style training setup predicted on 8 ranks, at tiny shapes: meta-device init, selective
activation checkpointing by op policy, FSDP2 per block and root with bf16 parameters and fp32 reduction,
``to_empty``, ``trunc_normal_`` on the sharded parameters, gradient clipping over sharded gradients, AdamW
(tests/_titan_llama.py). Checked by hand: each rank's model states (FSDP2 shards, fp32) and its gradients (one
fp32 reduce-scatter output per ``fully_shard`` group, per step), and that the steady-state step is reported.

Each prediction runs in a child process that imports memlens before torch (see tests/_predict_cases.py).
"""
from __future__ import annotations

import pytest

from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)

WORLD = 8
DIM, LAYERS, HEADS, KV_HEADS, FFN, VOCAB, SEQ, BATCH = 64, 2, 4, 2, 96, 256, 32, 2


def shard_bytes(numel: int) -> int:
    """One parameter's FSDP2 shard on every rank, fp32 (every first dimension here divides by 8: no padding)."""
    return 4 * numel // WORLD


@pytest.mark.slow
def test_framework_style_llama_on_8_ranks_holds_the_fsdp2_arithmetic():
    r = run_child(f"""
import sys
sys.path.insert(0, "tests")
from _titan_llama import LlamaArgs, make_step
a = LlamaArgs(dim={DIM}, n_layers={LAYERS}, n_heads={HEADS}, n_kv_heads={KV_HEADS}, ffn_dim={FFN}, vocab={VOCAB},
              seq={SEQ}, batch={BATCH})
step, kept = make_step(a)
d = memlens.predict(step, gpu="H100", world_size={WORLD}, steps=2)
def sizes(p, category, held):
    b = p.trace.blocks
    b = b[(b.device == "cuda:0") & (b.category == category)]
    return sorted((b[b.free_ns.isna()] if held else b).requested_size.tolist())
result = {{"errors": {{str(k): v for k, v in d.errors.items()}}, "strategies": sorted(d.strategies),
          "symmetry": d.symmetry, "ran": sorted(d.predictions), "ranks": {{str(k): {{
    "params": sizes(p, "parameter", True), "states": sizes(p, "optimizer_state", True),
    "grads": sizes(p, "gradient", False), "step_peaks": p.step_peaks, "peak": p.peak_allocated,
    "result_peak": d.results[k].peak_allocated}} for k, p in d.predictions.items()}},
    "dtypes": sorted({{str(t.dtype) for t in kept[0][0].parameters()}})}}
""")
    assert r["errors"] == {} and r["strategies"] == ["fsdp2"]
    assert r["ran"] == [0, WORLD - 1] and r["symmetry"].startswith("symmetric")
    assert r["dtypes"] == ["torch.float32"]          # sharded parameters stay fp32; bf16 is the all-gathered copy
    head = DIM // HEADS
    block = [DIM * HEADS * head, DIM * KV_HEADS * head, DIM * KV_HEADS * head, HEADS * head * DIM,
             DIM * FFN, FFN * DIM, DIM * FFN, DIM, DIM]                  # wq wk wv wo w1 w2 w3, two norms
    root = [VOCAB * DIM, DIM, VOCAB * DIM]                               # embedding, final norm, output
    params = sorted(shard_bytes(n) for n in block * LAYERS + root)
    group_grads = [sum(shard_bytes(n) for n in block)] * LAYERS + [sum(shard_bytes(n) for n in root)]
    for rank in ("0", str(WORLD - 1)):
        got = r["ranks"][rank]
        assert got["params"] == params, rank
        assert got["states"] == sorted(params * 2), rank           # AdamW's exp_avg and exp_avg_sq, fp32
        # one fp32 reduce-scatter output per fully_shard group and step; zero_grad() frees them
        assert got["grads"] == sorted(group_grads * 2), rank
        # two calls: the second starts with AdamW's state, so its peak is the steady state and the answer
        peaks = got["step_peaks"]
        assert [p["step"] for p in peaks] == [1, 2]
        assert peaks[1]["peak_allocated"] >= peaks[0]["peak_allocated"]
        assert got["peak"] == got["result_peak"] == max(p["peak_allocated"] for p in peaks)
