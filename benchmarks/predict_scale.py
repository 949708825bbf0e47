"""How long memlens.predict takes for one training step of a Llama-style model, on this CPU-only machine.

A 7B-parameter Llama-style decoder (32 layers, d_model 4096, 32 heads, SwiGLU d_ff 11008, vocab 32000,
RMSNorm, no biases) with bf16 weights and torch.optim.AdamW (fused=False, foreach default), one step of
batch 1 x 2048 tokens. Prints the wall-clock seconds of the prediction (model build + step + trace +
allocator replay) and the predicted peaks; nothing is allocated for real.

    python benchmarks/predict_scale.py [num_layers]
"""
from __future__ import annotations

import sys
import time

import memlens  # noqa: F401  (first: installs the fake-CUDA shim before torch)
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


class Layer(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.h = heads
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.w1, self.w3 = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.w2 = nn.Linear(ff, d, bias=False)
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.wqkv(self.n1(x)).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.wo(a)
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, layers=32, d=4096, heads=32, ff=11008, vocab=32000):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d, heads, ff) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def main(layers: int = 32):
    t = time.perf_counter()
    with memlens.predict(gpu="H100", capacity="80GiB") as p:
        with torch.device("cuda"):
            model = Llama(layers).to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters())
        ids = torch.randint(0, 32000, (1, 2048), device="cuda")
        logits = model(ids)
        F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), ids.view(-1)).backward()
        opt.step()
    s = p.summary()
    secs = time.perf_counter() - t
    n_params = sum(x.numel() for x in model.parameters())
    print(f"{n_params / 1e9:.2f}B params, {layers} layers: predicted in {secs:.1f} s "
          f"({s['ops']:,} ops, {s['blocks']:,} blocks); peak allocated {s['peak_allocated'] / 2**30:.2f} GiB, "
          f"peak reserved {s['peak_reserved'] / 2**30:.2f} GiB, fits 80GiB: {s['fits']}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 32)
