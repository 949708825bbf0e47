"""Predict a framework-style Llama-3-8B training setup on 8 ranks, on this CPU-only machine.

The model and step are tests/_titan_llama.py's (as torchtitan sets one up): meta-device init, selective
activation checkpointing by op policy on every block, FSDP2 per block and at the root with bf16 parameters and
fp32 gradient reduction (``MixedPrecisionPolicy``), ``to_empty(device="cuda")``, ``init_weights`` with
``trunc_normal_`` on the sharded parameters, fp32 cross-entropy, ``clip_grad_norm_`` over the sharded gradients,
AdamW, ``zero_grad``. Llama-3-8B shapes: dim 4096, 32 layers, 32 heads / 8 kv heads, ffn 14336, vocab 128256,
sequence 8192, batch 1 per rank. Two steps per rank (``steps=2``: the second starts with AdamW's state, the
steady state).

Prints the host wall seconds of the prediction, this process's peak RSS, the per-rank table (predicted peak
allocated / reserved on the modeled H100), each step's peaks and the by-hand model states per rank (fp32
parameters, gradients, two AdamW moments: 16 B per parameter / 8).

    python benchmarks/predict_framework_8b.py [--layers N] [--world-size N] [--batch N]

torchtitan's published figure for the same setup (Llama 3.1 8B, FSDP on 8 H100s of 96 GB, selective activation
checkpointing, sequence 8192) is at local batch 2: ``--batch 2`` predicts that one.
"""
from __future__ import annotations

import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

import memlens  # noqa: F401  (first: installs the fake-CUDA shim before torch)
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _titan_llama import LLAMA3_8B, Transformer, make_step  # noqa: E402


def main(layers: int, world_size: int, batch: int) -> None:
    args = replace(LLAMA3_8B, n_layers=layers, batch=batch)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in Transformer(args).parameters())
    step, _ = make_step(args)
    t = time.perf_counter()
    d = memlens.predict(step, gpu="H100", capacity="80GiB", world_size=world_size, steps=2)
    secs = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # Linux: KiB
    assert not d.errors, d.errors
    states = 16 * n_params / world_size
    print(f"framework-style Llama-3-8B ({n_params / 1e9:.2f}B params, {layers} layers, seq {args.seq}, batch "
          f"{args.batch}), {world_size} ranks: predicted in {secs:.1f} s (host wall clock; ranks run "
          f"{sorted(d.predictions)}), peak RSS {rss / 2**30:.2f} GiB")
    print(f"  model states per rank by hand (fp32 params + grads + 2 AdamW moments, / {world_size}): "
          f"{states / 2**30:.2f} GiB")
    print(d.table())
    print(f"  {d.symmetry}; NCCL allowance {d.nccl['bytes'] / 2**20:.0f} MiB per rank")
    for rank, p in sorted(d.predictions.items()):
        for s in p.step_peaks:
            print(f"  rank {rank} step {s['step']}: peak allocated {s['peak_allocated'] / 2**30:.2f} GiB, "
                  f"peak reserved {s['peak_reserved'] / 2**30:.2f} GiB (modeled H100 allocator)")


if __name__ == "__main__":
    argv = sys.argv[1:]
    opts = {"--layers": 32, "--world-size": 8, "--batch": 1}
    for key in opts:
        if key in argv:
            i = argv.index(key)
            opts[key] = int(argv[i + 1])
            del argv[i:i + 2]
    main(opts["--layers"], opts["--world-size"], opts["--batch"])
