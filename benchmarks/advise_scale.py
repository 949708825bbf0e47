"""How long `memlens.advise` takes, and how much host memory, for a 7B Llama-style model under FSDP2 on 8 ranks.

The model is the one of `benchmarks/predict_scale.py` (32 layers, d_model 4096, 32 heads, SwiGLU 11008, vocab
32000), in bf16, one step of batch 1 x 2048 tokens with AdamW. `memlens.advise(..., world_size=8,
strategies=("fsdp2",))` predicts DDP (the baseline) and FSDP2, then the checkpoint plans the solver chooses
for each, each block checkpointed in full for comparison, and the allocator settings on the closest plan.
Every plan is a full prediction of the ranks run (``--ranks first``: rank 0 stands for all; ``auto``: rank 0
and the last). Nothing is allocated for real.

Prints the host wall seconds, this process's peak RSS and the ranked plans.

    python benchmarks/advise_scale.py [--layers 32] [--capacity 24GiB] [--world-size 8] [--ranks first]
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import memlens  # noqa: F401  (first: installs the fake-CUDA shim before torch)
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from predict_scale import Llama  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--capacity", default="24GiB")
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--ranks", default="first")
    args = ap.parse_args()

    def build_model():
        return Llama(args.layers).to(torch.bfloat16)

    def step(model, opt):
        ids = torch.randint(0, 32000, (1, 2048), device="cuda")
        logits = model(ids)
        F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), ids.view(-1)).backward()
        del logits
        opt.step()
        opt.zero_grad()

    t = time.perf_counter()
    advice = memlens.advise(build_model, step, gpu="H100", capacity=args.capacity, world_size=args.world_size,
                            strategies=("fsdp2",), ranks=args.ranks)
    secs = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # Linux: KiB
    print(f"advise: {args.layers} layers, {args.world_size} ranks (ranks run: {args.ranks}), capacity "
          f"{args.capacity}: {len(advice.plans)} plans predicted in {secs:.1f} s (host wall clock), peak RSS "
          f"{rss / 2**30:.2f} GiB")
    import pandas as pd
    with pd.option_context("display.width", 250, "display.max_colwidth", 90):
        print(advice.table().drop(columns=["error"]).to_string())
    print(advice.summary())
    for note in advice.notes:
        print("note:", note)


if __name__ == "__main__":
    main()
