"""The modeled step time of an FSDP2 training step against a published run of the same configuration.

Published run (the held-out figure): pytorch/torchtitan ``docs/performance.md`` (torchtitan commit 9dec370,
torch 1963fc8, 2024-12), Table 1, row "FSDP": Llama 3.1 8B, 8 H100 GPUs in one host (NVLink), 1-D FSDP2,
local batch size 2 (global 16), sequence length 8192 (``llama3_8b.toml``), selective activation checkpointing
per op (``selective_ac_option = 'op'``), bf16 parameters in compute with fp32 gradient reduction
(torchtitan's default ``MixedPrecisionPolicy``), AdamW, gradient clipping at 1.0, no torch.compile, no Float8:
**5,762 tokens/s per GPU**, 82.4 GiB. The page states its GPUs are 96 GB HBM2e H100s (2.4 TB/s) held at a 500 W
power limit, "between SXM and NVL" in peak; memlens models the 700 W H100 SXM, so the modeled step should be
somewhat faster than the published one, never fitted to it.

The step as each rank runs it under `memlens.predict(world_size=8, gpu="H100 SXM")`: torchtitan's Llama 3
block (separate wq/wk/wv with 8 KV heads repeated to 32, rotary embedding, causal SDPA, SwiGLU FFN 14336,
RMSNorm), built on the meta device; per block torchtitan's op-level selective checkpoint (every matmul and
attention output saved, except every second matmul, recomputed) then ``fully_shard`` (resharded after forward
except the last block), then the root; AdamW (foreach), ``clip_grad_norm_(1.0)``. Two iterations are
predicted and then one: the steady-state step is the difference of the two modeled step times (the first
iteration creates AdamW's state). ``--layers N`` predicts N blocks instead of 32 (the per-layer scaling is
not used: the full model is what is compared).

    python benchmarks/predict_fsdp_published.py [--layers N]
"""
from __future__ import annotations

import sys
import time

import memlens  # noqa: F401  (first: installs the fake-CUDA shim before torch)
import torch
import torch.nn as nn
import torch.nn.functional as F

PUBLISHED_TOKENS_PER_GPU_S = 5_762          # torchtitan docs/performance.md Table 1, FSDP row
PUBLISHED_SOURCE = "pytorch/torchtitan docs/performance.md, Table 1 (FSDP, Llama 3.1 8B, 8 x H100)"
DIM, LAYERS, HEADS, KV_HEADS, FFN, VOCAB = 4096, 32, 32, 8, 14336, 128256
BATCH, SEQ, WORLD = 2, 8192, 8


def tokens_per_gpu_second(batch: int, seq: int, step_ns: float) -> float:
    """Tokens per second per GPU of a data-parallel step: each rank trains ``batch x seq`` tokens per
    `step_ns` nanoseconds (torchtitan's TPS/GPU counts the local tokens)."""
    if step_ns <= 0:
        raise ValueError(f"step time must be positive, got {step_ns} ns")
    return batch * seq / (step_ns * 1e-9)


def ratio_to_published(modeled: float, published: float) -> float:
    """modeled / published throughput (1.0: equal; above 1: the model is faster)."""
    if published <= 0:
        raise ValueError(f"published throughput must be positive, got {published}")
    return modeled / published


def steady_step_ns(two_iterations_ns: int, one_iteration_ns: int) -> int:
    """The second iteration's modeled time: the step time of a run of two iterations minus that of one."""
    if two_iterations_ns < one_iteration_ns:
        raise ValueError("two iterations cannot take less time than one")
    return two_iterations_ns - one_iteration_ns


class Block(nn.Module):
    """torchtitan's Llama 3 TransformerBlock (attention with GQA and rotary embedding, SwiGLU FFN)."""

    def __init__(self):
        super().__init__()
        hd = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * hd, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * hd, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * hd, bias=False)
        self.wo = nn.Linear(HEADS * hd, DIM, bias=False)
        self.w1 = nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, FFN, bias=False)
        self.attention_norm = nn.RMSNorm(DIM, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(DIM, eps=1e-5)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        hd = DIM // HEADS
        h = self.attention_norm(x)
        q = self.wq(h).view(b, s, HEADS, hd)
        k = self.wk(h).view(b, s, KV_HEADS, hd)
        v = self.wv(h).view(b, s, KV_HEADS, hd)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        rep = HEADS // KV_HEADS      # repeat_kv: expand then reshape (a copy), as torchtitan does
        k = k[:, :, :, None, :].expand(b, s, KV_HEADS, rep, hd).reshape(b, s, HEADS, hd)
        v = v[:, :, :, None, :].expand(b, s, KV_HEADS, rep, hd).reshape(b, s, HEADS, hd)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, DIM))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def rotary(x, cos, sin):
    """Rotary embedding on pairs (x0, x1) of the head dimension, in fp32 then back (torchtitan multiplies
    complex numbers: the same flops and bytes)."""
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2).type_as(x)


class Llama3(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.RMSNorm(DIM, eps=1e-5)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens, cos, sin):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def selective_op_checkpoint(block: nn.Module) -> nn.Module:
    """torchtitan's op-level selective activation checkpoint of a block: matmuls, attention and max are
    saved, except every second matmul (recomputed in backward)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention.default, torch.ops.aten.max.default}

    def context_fn():
        counts = {"forward": 0, "recompute": 0}

        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            if func == torch.ops.aten.mm.default:
                counts[mode] += 1
            to_save = func in save and not (func == torch.ops.aten.mm.default and counts[mode] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)
    return checkpoint_wrapper(block, context_fn=context_fn, preserve_rng_state=False)


def fsdp_step(layers: int, iterations: int, checkpoint: bool = True):
    """Each rank's program: build, shard, then `iterations` training iterations of batch x seq tokens."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    def step():
        with torch.device("meta"):
            model = Llama3(layers)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for i, block in enumerate(model.layers):
            if checkpoint:
                model.layers[i] = block = selective_op_checkpoint(block)
            fully_shard(block, mp_policy=mp, reshard_after_forward=i < layers - 1)
        fully_shard(model, mp_policy=mp)
        model.to_empty(device="cuda")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
        angles = torch.randn(SEQ, DIM // HEADS // 2, device="cuda")
        cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
        for _ in range(iterations):
            tokens = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
            logits = model(tokens, cos, sin)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten(0, 1))
            del logits
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad()
    return step


def modeled(layers: int, iterations: int, checkpoint: bool = True) -> dict:
    """Rank 0's modeled step time (`DistributedPrediction.step_time`) of `iterations` iterations."""
    d = memlens.predict(fsdp_step(layers, iterations, checkpoint), gpu="H100 SXM", world_size=WORLD,
                        ranks="first")
    assert not d.errors, d.errors
    t = d.step_time()[0]
    t["peak_allocated"] = d.results[0].peak_allocated
    return t


def main(layers: int = LAYERS) -> None:
    t0 = time.perf_counter()
    two, one = modeled(layers, 2), modeled(layers, 1)
    wall = time.perf_counter() - t0
    step = steady_step_ns(two["step_ns"], one["step_ns"])
    compute = steady_step_ns(two["compute_ns"], one["compute_ns"])
    comm = steady_step_ns(two["comm_ns"], one["comm_ns"])
    exposed = step - compute
    tps = tokens_per_gpu_second(BATCH, SEQ, step)
    print(f"configuration: Llama 3 8B shapes (dim {DIM}, {layers} layers, {HEADS} heads, {KV_HEADS} KV heads, "
          f"ffn {FFN}, vocab {VOCAB}), FSDP2 on {WORLD} x H100 SXM (modeled, NVLink), local batch {BATCH} x {SEQ}, "
          f"bf16 params / fp32 reduce, selective op AC, AdamW, clip_grad_norm")
    print(f"predicted in {wall:.0f} s host wall clock (two predictions); rank 0 peak allocated "
          f"{two['peak_allocated'] / 2**30:.1f} GiB (published 82.4 GiB reserved)")
    print(f"modeled compute time   {compute / 1e6:9.1f} ms   (modeled H100 SXM clock, steady-state iteration)")
    print(f"communication          {comm / 1e6:9.1f} ms   ({two['collectives'] - one['collectives']} collectives, "
          f"{two['link']}; FSDP2 copy-ins {steady_step_ns(two['copy_in_ns'], one['copy_in_ns']) / 1e6:.1f} ms "
          f"on their stream)")
    print(f"exposed communication  {exposed / 1e6:9.1f} ms")
    print(f"step time              {step / 1e6:9.1f} ms")
    print(f"tokens/s/GPU modeled   {tps:9.0f}")
    print(f"tokens/s/GPU published {PUBLISHED_TOKENS_PER_GPU_S:9d}   ({PUBLISHED_SOURCE})")
    print(f"ratio modeled/published {ratio_to_published(tps, PUBLISHED_TOKENS_PER_GPU_S):.3f}")
    if layers != LAYERS:
        print(f"note: {layers} layers, not the published {LAYERS}: not comparable as is")


if __name__ == "__main__":
    argv = sys.argv[1:]
    main(int(argv[argv.index("--layers") + 1]) if "--layers" in argv else LAYERS)
