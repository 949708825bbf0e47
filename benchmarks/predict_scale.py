"""How long memlens.predict takes for one training step of a Llama-style model, on this CPU-only machine.

A 7B-parameter Llama-style decoder (32 layers, d_model 4096, 32 heads, SwiGLU d_ff 11008, vocab 32000,
RMSNorm, no biases), one step of batch 1 x 2048 tokens, in two variants:

- ``bf16``: bf16 weights, torch.optim.AdamW (foreach default) whose states follow the weights (bf16);
- ``fp32-adam`` (the issue's "bf16 weights, AdamW in fp32"): bf16 weights and gradients in the model, fp32
  master weights in the optimizer (the usual mixed-precision recipe): the bf16 gradients are copied into
  fp32 gradients of the masters, torch.optim.AdamW (foreach) steps the masters with fp32 states, and the
  masters are copied back into the bf16 weights.

- ``fsdp2``: the same model under FSDP2 on 8 ranks (``memlens.predict(step, world_size=8)``):
  built on the meta device, ``fully_shard`` per layer and at the root with bf16 compute and fp32 gradient
  reduction (``MixedPrecisionPolicy``), ``to_empty(device="cuda")``, fp32 sharded parameters and AdamW
  states; torch's fake process group, no weights anywhere. Prints host wall seconds, this process's peak
  RSS and the per-rank table (``--world-size N`` changes 8).

Prints the wall-clock seconds of the prediction (model build + step + trace + allocator replay), the
predicted peaks and the first op that would not fit in 80 GiB; then runs the swap and plan what-ifs
(`memlens swap` / `memlens plan` on the predicted trace, through their CLI commands) and prints their
figures and seconds. Nothing is allocated for real.

    python benchmarks/predict_scale.py [bf16|fp32-adam|fsdp2 ...] [--layers N] [--world-size N] [--no-whatif]
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


def predicted_step(variant: str, layers: int):
    with memlens.predict(gpu="H100", capacity="80GiB") as p:
        with torch.device("cuda"):
            model = Llama(layers).to(torch.bfloat16)
        params = list(model.parameters())
        if variant == "fp32-adam":
            masters = [q.detach().float().requires_grad_() for q in params]   # fp32 master weights
            opt = torch.optim.AdamW(masters)
        else:
            opt = torch.optim.AdamW(params)
        ids = torch.randint(0, 32000, (1, 2048), device="cuda")
        logits = model(ids)
        F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), ids.view(-1)).backward()
        del logits
        if variant == "fp32-adam":
            for q, m in zip(params, masters):
                m.grad = q.grad.float()       # fp32 copy of the bf16 gradient
                q.grad = None
            opt.step()
            with torch.no_grad():
                for q, m in zip(params, masters):
                    q.copy_(m)                # back into the bf16 weights
        else:
            opt.step()
    n_params = sum(x.numel() for x in params)
    return p, n_params


def fsdp2_step(layers: int):
    """One FSDP2 training step of the Llama-style model, as each rank runs it (see the module docstring)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    def step():
        with torch.device("meta"):
            model = Llama(layers)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        model.to_empty(device="cuda")
        opt = torch.optim.AdamW(model.parameters())
        ids = torch.randint(0, 32000, (1, 2048), device="cuda")
        logits = model(ids)
        F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), ids.view(-1)).backward()
        del logits
        opt.step()
    return step


def main_fsdp2(layers: int, world_size: int) -> None:
    import resource
    with torch.device("meta"):
        n_params = sum(x.numel() for x in Llama(layers).parameters())
    t = time.perf_counter()
    d = memlens.predict(fsdp2_step(layers), gpu="H100", capacity="80GiB", world_size=world_size)
    secs = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # Linux: KiB
    # by hand, per rank: fp32 sharded parameters, fp32 gradients and two fp32 AdamW moments, 16 B / param / N
    floor = 16 * n_params // world_size
    assert not d.errors, d.errors
    assert min(r.peak_allocated for r in d.results) >= floor, (d.summary(), floor)
    print(f"fsdp2: {n_params / 1e9:.2f}B params, {layers} layers, {world_size} ranks: predicted in {secs:.1f} s "
          f"(host wall clock, ranks run: {sorted(d.predictions)}), peak RSS {rss / 2**30:.2f} GiB; "
          f"by-hand floor per rank {floor / 2**30:.2f} GiB")
    print(d.table())
    print(f"  {d.symmetry}; NCCL allowance {d.nccl['bytes'] / 2**20:.0f} MiB per rank")
    for rank, st in sorted(d.step_time().items()):
        print(f"  rank {rank} step time (modeled GPU clock, not measured): {st['step_ns'] / 1e6:.1f} ms; compute "
              f"{st['compute_ns'] / 1e6:.1f} ms, {st['collectives']} collectives {st['comm_ns'] / 1e6:.1f} ms over "
              f"{st['link']}, exposed {st['exposed_comm_ns'] / 1e6:.1f} ms")


def whatifs(trace_path: str) -> None:
    """`memlens swap` and `memlens plan` on the predicted trace, as a user would run them."""
    import json
    import subprocess
    for name, args in (("swap", ["swap", "--gpu", "H100", "--json", trace_path]),
                       ("plan", ["plan", "--time-limit", "5", "--json", trace_path])):
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "memlens.cli", *args], capture_output=True, text=True)
        secs = time.perf_counter() - t
        if proc.returncode != 0:
            print(f"  memlens {name}: failed (rc {proc.returncode}): {proc.stderr.strip()[-300:]}")
            continue
        out = json.loads(proc.stdout)
        keys = [k for k in ("peak_before", "peak_after", "bound", "stall_ns", "height", "max_live", "gap",
                            "status") if k in out]
        print(f"  memlens {name}: {secs:.1f} s; " + ", ".join(f"{k}={out[k]}" for k in keys))


def main(variants, layers: int = 32, whatif: bool = True):
    import tempfile
    for variant in variants:
        t = time.perf_counter()
        p, n_params = predicted_step(variant, layers)
        s = p.summary()
        secs = time.perf_counter() - t
        oom = p.oom
        # what must be alive at the optimizer step, by hand: bf16 weights (2 B/param) and, with bf16 AdamW,
        # bf16 gradients and two bf16 moments (6 B); with fp32 AdamW, fp32 masters, fp32 gradients and two
        # fp32 moments (16 B; the bf16 gradients are dropped once copied)
        bound = n_params * (2 + (16 if variant == "fp32-adam" else 6))
        assert s["peak_allocated"] >= bound and s["peak_reserved"] >= s["peak_allocated"], (s, bound)
        print(f"{variant}: {n_params / 1e9:.2f}B params, {layers} layers: predicted in {secs:.1f} s "
              f"({s['ops']:,} ops, {s['blocks']:,} blocks); peak allocated {s['peak_allocated'] / 2**30:.2f} GiB, "
              f"peak reserved {s['peak_reserved'] / 2**30:.2f} GiB (by-hand floor {bound / 2**30:.2f} GiB), "
              f"fits 80GiB: {s['fits']}"
              + (f"; first OOM: {oom.op} in {oom.module or '-'} ({oom.size / 2**20:.0f} MiB)" if oom else ""))
        if whatif:
            with tempfile.TemporaryDirectory() as tmp:
                path = f"{tmp}/predicted.memlens"
                t = time.perf_counter()
                p.trace.save(path)
                print(f"  saved the predicted trace in {time.perf_counter() - t:.1f} s")
                whatifs(path)


if __name__ == "__main__":
    argv = sys.argv[1:]
    layers = 32
    if "--layers" in argv:
        i = argv.index("--layers")
        layers = int(argv[i + 1])
        del argv[i:i + 2]
    world_size = 8
    if "--world-size" in argv:
        i = argv.index("--world-size")
        world_size = int(argv[i + 1])
        del argv[i:i + 2]
    whatif = "--no-whatif" not in argv
    argv = [a for a in argv if a != "--no-whatif"]
    if "fsdp2" in argv:
        argv.remove("fsdp2")
        main_fsdp2(layers, world_size)
        if not argv:
            sys.exit(0)
    main(argv or ["bf16", "fp32-adam"], layers, whatif)
