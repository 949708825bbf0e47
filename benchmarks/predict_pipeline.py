"""Pipeline parallelism predicted per stage: the 7B Llama-style model of `predict_scale.py` as pipeline stages.

Each rank builds only its stage on ``cuda`` (as torchtitan splits it: the first stage has the embedding, the
last the final norm and the head, every stage its share of the layers; bf16 weights, AdamW states following
the weights), wraps it in torch's ``PipelineStage`` with
``device="meta"`` example shapes and runs one ``ScheduleGPipe`` or ``Schedule1F1B`` step of ``--microbatches``
microbatches of 1 x 2048 tokens, cross-entropy on the last stage, then ``opt.step()``; all under
``memlens.predict(step, world_size=stages)`` (torch's fake process group, every stage rank run). Prints the
host wall seconds, this process's peak RSS, each stage's predicted peak allocated / reserved bytes and the
pipeline step time on the modeled H100 clock (`d.step_time()`: stages joined with their waits and the p2p
transfers over NVLink, `memlens.prediction.distributed.pipeline_time`), with the textbook step
``(M + S - 1)(F + B)`` from the stages' mean forward and backward beside it. Nothing is allocated for real.

    python benchmarks/predict_pipeline.py [--stages 8] [--microbatches 16] [--layers 32]
"""
from __future__ import annotations

import os
import sys
import time

import memlens  # noqa: F401  (first: installs the fake-CUDA shim before torch)
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from predict_scale import Layer, Llama, RMSNorm  # noqa: E402  (the model of the single-GPU and FSDP2 runs)

SEQ, VOCAB, D = 2048, 32000, 4096


class Stage(nn.Module):
    """One pipeline stage of `Llama`: `layers` layers, plus the embedding (first) or the norm and head (last)."""

    def __init__(self, first: bool, last: bool, layers: int, d=D, heads=32, ff=11008, vocab=VOCAB):
        super().__init__()
        self.emb = nn.Embedding(vocab, d) if first else None
        self.layers = nn.ModuleList(Layer(d, heads, ff) for _ in range(layers))
        self.norm = RMSNorm(d) if last else None
        self.head = nn.Linear(d, vocab, bias=False) if last else None

    def forward(self, x):
        if self.emb is not None:
            x = self.emb(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)) if self.head is not None else x


def pipeline_step(schedule_name: str, layers: int, microbatches: int):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]

    def step():
        rank, world = dist.get_rank(), dist.get_world_size()
        first, last = rank == 0, rank == world - 1
        with torch.device("cuda"):
            mod = Stage(first, last, layers // world).to(torch.bfloat16)
        meta = dict(device="meta")
        inp = (torch.empty(1, SEQ, dtype=torch.long, **meta) if first
               else torch.empty(1, SEQ, D, dtype=torch.bfloat16, **meta).requires_grad_())
        out = torch.empty(1, SEQ, VOCAB if last else D, dtype=torch.bfloat16, **meta).requires_grad_()
        stage = PipelineStage(mod, rank, world, torch.device("cuda"), input_args=(inp,), output_args=(out,))

        def loss_fn(logits, target):
            return F.cross_entropy(logits.view(-1, VOCAB).float(), target.view(-1))
        sched = schedule(stage, n_microbatches=microbatches, loss_fn=loss_fn)
        opt = torch.optim.AdamW(mod.parameters())
        ids = torch.randint(0, VOCAB, (microbatches, SEQ), device="cuda")
        if first:
            sched.step(ids)
        elif last:
            sched.step(target=ids)
        else:
            sched.step()
        opt.step()
    return step


def main(stages: int, microbatches: int, layers: int) -> None:
    import resource
    with torch.device("meta"):
        n_params = sum(x.numel() for x in Llama(layers).parameters())
    for name in ("gpipe", "1f1b"):
        t = time.perf_counter()
        d = memlens.predict(pipeline_step(name, layers, microbatches), gpu="H100", capacity="80GiB",
                            world_size=stages)
        secs = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # Linux: KiB
        assert not d.errors, d.errors
        print(f"{name}: {n_params / 1e9:.2f}B params, {layers} layers as {stages} stages, {microbatches} "
              f"microbatches of 1 x {SEQ}: predicted in {secs:.1f} s (host wall clock), peak RSS {rss / 2**30:.2f} GiB")
        print("  peak allocated by stage (GiB): " + " / ".join(f"{r.peak_allocated / 2**30:.2f}" for r in d.results))
        print("  peak reserved by stage (GiB):  " + " / ".join(f"{r.peak_reserved / 2**30:.2f}" for r in d.results))
        print(f"  {d.symmetry}; fits 80 GiB: {d.fits()}")
        t = time.perf_counter()
        times = d.step_time()
        secs = time.perf_counter() - t
        ms = lambda ns: ns / 1e6          # noqa: E731
        whole = times[0]["pipeline_step_ns"]
        print(f"  pipeline step (modeled H100 clock): {ms(whole):.1f} ms ({secs:.1f} s host wall clock to time)")
        for key in ("step_ns", "busy_ns", "wait_ns", "bubble_ns", "p2p_ns"):
            print(f"  {key:<10} by stage (ms): " + " / ".join(f"{ms(times[r][key]):.1f}" for r in sorted(times)))
        acts = [a for r in times for a in times[r]["pipeline_actions"]]
        f = sum(a["end_ns"] - a["start_ns"] for a in acts if a["kind"] == "F") / stages / microbatches
        b = sum(a["end_ns"] - a["start_ns"] for a in acts if a["kind"] == "B") / stages / microbatches
        ideal = (microbatches + stages - 1) * (f + b)
        print(f"  mean F {ms(f):.2f} ms, B {ms(b):.2f} ms: (M + S - 1)(F + B) = {ms(ideal):.1f} ms; bubble fraction "
              f"(S - 1)/(M + S - 1) = {(stages - 1) / (microbatches + stages - 1):.3f}, stage 0's "
              f"{times[0]['bubble_ns'] / whole:.3f}")


if __name__ == "__main__":
    argv = sys.argv[1:]

    def option(name, default):
        if name in argv:
            return int(argv[argv.index(name) + 1])
        return default
    main(option("--stages", 8), option("--microbatches", 16), option("--layers", 32))
