"""A Llama written the way large training frameworks (torchtitan) set one up, for predictions of it: the
model is built on the ``meta`` device, each block gets selective activation checkpointing by op policy (every
matmul's output and attention's are saved, except every second matmul's, which is recomputed), each block and
then the root get FSDP2 (``fully_shard``) with bf16 parameters and fp32 gradient reduction, ``to_empty``
materialises the shards on ``cuda`` and ``init_weights`` draws them with ``trunc_normal_`` on the sharded
(DTensor) parameters. A training step: forward, cross-entropy in fp32, backward, gradient-norm clipping over the
sharded gradients, AdamW, ``zero_grad``.

Used by tests/integration/test_predict_framework.py (tiny shapes) and benchmarks/predict_framework_8b.py (Llama-3-8B
shapes). Import it after memlens (torch is imported here).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts


@dataclass
class LlamaArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab: int
    seq: int
    batch: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5


LLAMA3_8B = LlamaArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab=128256, seq=8192,
                      batch=1)


def rotary_tables(head_dim: int, seq: int, theta: float, device=None) -> torch.Tensor:
    """cos and sin of the rotary angles, shape (seq, head_dim): [cos | sin] of head_dim / 2 frequencies each."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), freqs)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def apply_rotary(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :h/2], x[..., h/2:]) of x (batch, seq, heads, head_dim) by the table's angles."""
    half = x.shape[-1] // 2
    cos, sin = table[: x.shape[1], :half][None, :, None, :], table[: x.shape[1], half:][None, :, None, :]
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * self.head_dim, a.dim, bias=False)

    def forward(self, x, table):
        bs, seq, _ = x.shape
        q = apply_rotary(self.wq(x).view(bs, seq, self.n_heads, self.head_dim), table)
        k = apply_rotary(self.wk(x).view(bs, seq, self.n_kv_heads, self.head_dim), table)
        v = self.wv(x).view(bs, seq, self.n_kv_heads, self.head_dim)
        repeat = self.n_heads // self.n_kv_heads      # grouped-query attention: each kv head serves `repeat` heads
        k = k.repeat_interleave(repeat, dim=2)
        v = v.repeat_interleave(repeat, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.ffn_dim, bias=False)
        self.w2 = nn.Linear(a.ffn_dim, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.ffn_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.attention_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.attention = Attention(a)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.feed_forward = FeedForward(a)

    def forward(self, x, table):
        h = x + self.attention(self.attention_norm(x), table)
        return h + self.feed_forward(self.ffn_norm(h))


# selective activation checkpointing by op (torchtitan's "op" policy): these ops' outputs are saved ...
SAVE_OPS = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention.default, torch.ops.aten.max.default}


def op_policy_context():
    """... except every second matmul's, in forward and in recompute alike; everything else is recomputed."""
    counts = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[key] += 1
        save = func in SAVE_OPS and not (func == torch.ops.aten.mm.default and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


class CheckpointedBlock(nn.Module):
    def __init__(self, block: Block):
        super().__init__()
        self.block = block

    def forward(self, x, table):
        return checkpoint(self.block, x, table, use_reentrant=False, context_fn=op_policy_context,
                          preserve_rng_state=False)


class Transformer(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.register_buffer("rope", rotary_tables(a.dim // a.n_heads, a.seq, a.rope_theta), persistent=False)
        self.layers = nn.ModuleDict({str(i): Block(a) for i in range(a.n_layers)})
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab, bias=False)

    def init_weights(self):
        """torchtitan's scheme: trunc_normal_ on every weight (std 0.02 scaled by depth for the output
        projections), the output layer's by dim ** -0.5 within 3 std; norms to one; the rotary table recomputed
        on the parameters' device (``to_empty`` left it uninitialised)."""
        a = self.args
        with torch.no_grad():
            self.rope.copy_(rotary_tables(a.dim // a.n_heads, a.seq, a.rope_theta, device=self.rope.device))
            nn.init.normal_(self.tok_embeddings.weight)
            depth_std = 0.02 / (2 * a.n_layers) ** 0.5
            for layer in self.layers.values():
                block = layer.block if isinstance(layer, CheckpointedBlock) else layer
                for lin in (block.attention.wq, block.attention.wk, block.attention.wv, block.feed_forward.w1):
                    nn.init.trunc_normal_(lin.weight, mean=0.0, std=0.02)
                for lin in (block.attention.wo, block.feed_forward.w2, block.feed_forward.w3):
                    nn.init.trunc_normal_(lin.weight, mean=0.0, std=depth_std)
                block.attention_norm.reset_parameters()
                block.ffn_norm.reset_parameters()
            self.norm.reset_parameters()
            std = a.dim ** -0.5
            nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.rope)
        return self.output(self.norm(h))


def build_sharded(a: LlamaArgs) -> Transformer:
    """Meta init, selective checkpointing per block, FSDP2 per block then the root (bf16 params, fp32 reduce),
    ``to_empty`` on cuda, ``init_weights`` on the shards."""
    with torch.device("meta"):
        model = Transformer(a)
    for name, block in list(model.layers.items()):
        model.layers[name] = CheckpointedBlock(block)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers.values():
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device="cuda")
    model.init_weights()
    return model


def make_step(a: LlamaArgs, max_norm: float = 1.0):
    """A step function for `memlens.predict`: builds its rank's model and AdamW at its first call on that rank
    and keeps them (later calls are the steady state), then one training step. Returns (step, kept) with
    kept = {rank: [model, opt]}."""
    kept: dict = {}

    def step():
        rank = torch.distributed.get_rank()
        if rank not in kept:
            torch.manual_seed(0)
            model = build_sharded(a)
            kept[rank] = [model, torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)]
        model, opt = kept[rank]
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
        labels = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        del logits
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
        opt.step()
        opt.zero_grad()
    return step, kept
