"""The cs336 workload of the shared real snapshots, written from scratch for memlens's prediction tests.

`../shared/traces/snapshots/cs336_wedsonlin_medium_128_{training,inference}.pickle` were recorded on a CUDA
GPU from Stanford CS336's reference pre-norm Transformer LM ("medium": d_model 1024, d_ff 4096, 24 layers,
16 heads, vocab 10000, context 128) at batch 4 in fp32, after 5 warm-up steps. The snapshots' frames name
the code (cs336_basics model.py / nn_utils.py / optimizer.py and the profiling script), and this module
reproduces the same tensor operations in the same order, because memory depends on exactly that:
- `Linear` is an einsum of x with a (d_out, d_in) weight, no bias; weights are created on the CPU with a
  truncated normal and the whole model is moved with ``model.to(device)``;
- `RMSNorm` upcasts, squares, means, adds eps, rsqrt, scales, multiplies by the weight;
- RoPE slices cos/sin from its cache and rotates the two interleaved halves, then concatenates;
- attention: einsum scores / sqrt(d_k), causal ``where`` with -inf, a max-subtract-exp-sum-divide softmax,
  einsum with V, heads merged with a contiguous copy;
- SwiGLU with silu = x * sigmoid(x);
- the loss is a hand-written cross entropy (max, subtract, exp, sum, log, negate, gather, mean);
- the optimizer is the course's AdamW (the frames show its optimizer.py, not torch.optim.AdamW; its defaults:
  lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01), which builds fresh moment tensors each step and
  evaluates ``state.get(key, torch.zeros_like(grad))`` eagerly;
- the profiling loop: ``output`` and ``loss`` of one warm-up step stay alive into the next step's forward;
  ``zero_grad()`` between steps; before the recorded step ``del output, loss``, ``zero_grad(set_to_none=True)``,
  ``reset_peak_memory_stats()``; inference runs under ``torch.inference_mode()`` with ``model.eval()``.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

MEDIUM = dict(vocab_size=10000, context_length=128, d_model=1024, num_layers=24, num_heads=16, d_ff=4096)
BATCH = 4
WARMUP_STEPS = 5


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        std = math.sqrt(2 / (d_in + d_out))
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std, a=-3 * std, b=3 * std))

    def forward(self, x):
        return torch.einsum("...i,oi->...o", x, self.weight)


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(vocab_size, d_model), std=1.0, a=-3, b=3))

    def forward(self, token_ids):
        return self.weight[token_ids, :]


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        in_dtype = x.dtype
        x = x.to(torch.float32)
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = x * rms
        return (self.weight * x).to(in_dtype)


class Rotary(nn.Module):
    def __init__(self, context_length: int, dim: int, theta: float = 10000.0):
        super().__init__()
        d = torch.arange(0, dim, 2) / dim
        freqs = torch.outer(torch.arange(context_length).float(), torch.tensor(theta) ** -d)
        self.register_buffer("cos_sin", torch.stack((torch.cos(freqs), torch.sin(freqs))), persistent=False)

    def forward(self, x):
        b, h, s, d = x.shape
        pairs = x.view(b, h, s, d // 2, 2).permute(4, 0, 1, 2, 3)        # (xy, b, h, s, d/2): a view
        x1, x2 = pairs.unbind(0)
        cos, sin = self.cos_sin[:, :s, :].unbind(0)                      # views of the cache
        x1_rot = cos * x1 - sin * x2
        x2_rot = sin * x1 + cos * x2
        return torch.cat((x1_rot, x2_rot), dim=-1)


def silu(x):
    return x * torch.sigmoid(x)


def softmax(x, dim=-1):
    shifted = x - torch.max(x, dim=dim, keepdim=True)[0]
    e = torch.exp(shifted)
    return e / torch.sum(e, dim=dim, keepdim=True)


def cross_entropy(logits, targets):
    x_max = torch.max(logits, dim=-1, keepdim=True)[0]
    x = logits - x_max
    log_probs = x - torch.log(torch.sum(torch.exp(x), dim=-1, keepdim=True))
    return torch.mean(torch.gather(-log_probs, -1, targets.unsqueeze(-1)))


class Attention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, rope: Rotary):
        super().__init__()
        self.h = num_heads
        self.q_proj, self.k_proj = Linear(d_model, d_model), Linear(d_model, d_model)
        self.v_proj, self.output_proj = Linear(d_model, d_model), Linear(d_model, d_model)
        self.rope = [rope]          # shared, not a submodule of every layer

    def forward(self, x):
        b, s, d = x.shape
        split = lambda t: t.view(b, s, self.h, d // self.h).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        q, k = self.rope[0](q), self.rope[0](k)
        seq = torch.arange(s, device=x.device)
        mask = seq.view(1, 1, s, 1) >= seq.view(1, 1, 1, s)
        scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(d // self.h)
        scores = torch.where(mask, scores, float("-inf"))
        out = torch.einsum("...qk,...kd->...qd", softmax(scores), v)
        return self.output_proj(out.transpose(1, 2).reshape(b, s, d).contiguous())


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(d_model, d_ff), Linear(d_ff, d_model), Linear(d_model, d_ff)

    def forward(self, x):
        # silu as a function: w1's output dies when silu returns, before w3 runs (as in the course code)
        return self.w2(silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, rope):
        super().__init__()
        self.attn, self.ffn = Attention(d_model, num_heads, rope), SwiGLU(d_model, d_ff)
        self.ln1, self.ln2 = RMSNorm(d_model), RMSNorm(d_model)

    def forward(self, x):
        # named locals, as in the course code: x and x_attn stay alive until the block returns
        x_attn = self.attn(self.ln1(x))
        attn_out = x + x_attn
        x_ffn = self.ffn(self.ln2(attn_out))
        return attn_out + x_ffn


class TransformerLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff):
        super().__init__()
        self.token_embeddings = Embedding(vocab_size, d_model)
        self.rope = Rotary(context_length, d_model // num_heads)
        self.layers = nn.ModuleList([Block(d_model, num_heads, d_ff, self.rope) for _ in range(num_layers)])
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size)

    def forward(self, ids):
        embedded = self.token_embeddings(ids)     # a named local: alive for the whole forward, as in the course
        x = embedded
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


class CourseAdamW(torch.optim.Optimizer):
    """The course's AdamW, as its optimizer.py computes it (see the module docstring)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.data
                state = self.state[p]
                t = state.get("t", 1)
                m_prev = state.get("m", torch.zeros_like(grad))
                v_prev = state.get("v", torch.zeros_like(grad))
                m = beta1 * m_prev + ((1 - beta1) * grad)
                v = beta2 * v_prev + ((1 - beta2) * torch.square(grad))
                alpha_t = group["lr"] * (math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t))
                p.data -= alpha_t * m / (torch.sqrt(v) + group["eps"])
                p.data -= group["lr"] * group["weight_decay"] * p.data
                state["m"], state["v"], state["t"] = m, v, t + 1


def training_run(device="cuda", config=MEDIUM, batch=BATCH, warmup=WARMUP_STEPS):
    """The profiling script's full-training-step pattern; returns the model."""
    model = TransformerLM(**config)
    model.to(device)
    opt = CourseAdamW(model.parameters())
    v, s = config["vocab_size"], config["context_length"]
    warm_in = torch.randint(0, v, (warmup, batch, s), device=device)
    run_in = torch.randint(0, v, (1, batch, s), device=device)
    warm_tg = torch.randint(0, v, (warmup, batch, s), device=device)
    run_tg = torch.randint(0, v, (1, batch, s), device=device)
    model.train()
    for i in range(warmup):
        output = model(warm_in[i])
        loss = cross_entropy(output, warm_tg[i])
        loss.backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    del output, loss
    opt.zero_grad(set_to_none=True)
    torch.cuda.reset_peak_memory_stats()
    output = model(run_in[0])
    loss = cross_entropy(output, run_tg[0])
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    return model


def inference_run(device="cuda", config=MEDIUM, batch=BATCH, warmup=WARMUP_STEPS):
    """The profiling script's forward-only pattern under inference_mode; returns the model."""
    model = TransformerLM(**config)
    model.to(device)
    v, s = config["vocab_size"], config["context_length"]
    warm_in = torch.randint(0, v, (warmup, batch, s), device=device)
    run_in = torch.randint(0, v, (1, batch, s), device=device)
    model.eval()
    with torch.inference_mode():
        for i in range(warmup):
            model(warm_in[i])
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        model(run_in[0])
        torch.cuda.synchronize()
    return model
