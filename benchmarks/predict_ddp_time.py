"""DDP step time on the modeled GPU clock with its bucket all-reduces: a 166M-parameter LM under
`DistributedDataParallel`, predicted per rank on this CPU machine, two training steps.

The model: 8 pre-norm ``nn.TransformerEncoderLayer`` (d 1024, 16 heads, ffn 4096) between a 32k-token embedding
and an untied output projection, fp32, AdamW, batch 8 x 1024 tokens. The first backward pass all-reduces DDP's
construction bucket (torch 2.13 without ``find_unused_parameters``: one bucket of every parameter, so its
all-reduce starts after the last gradient and is all exposed); the second pass uses the buckets DDP rebuilds in
gradient-ready order (1 MiB, then 25 MiB), whose all-reduces overlap the rest of backward. Printed per pass:
buckets, bytes, modeled all-reduce time, and the time the optimizer waited for them; per world size (8 ranks in
one node over NVLink, 16 over two nodes: hierarchical). Times are modeled (GPU table, ring/tree formulas of
`memlens.devicetime.collectives`), not measured.

    python benchmarks/predict_ddp_time.py
"""
from __future__ import annotations

import time

import memlens
import torch
import torch.nn as nn

VOCAB, D, LAYERS, BATCH, SEQ = 32_000, 1024, 8, 8, 1024


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        layer = nn.TransformerEncoderLayer(D, 16, 4 * D, batch_first=True, norm_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


def step():
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = LM().cuda()
    net = DDP(model)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
        nn.functional.cross_entropy(net(tokens).flatten(0, 1), tokens.flatten()).backward()
        opt.step()
        opt.zero_grad()


def main():
    for world in (8, 16):
        t0 = time.perf_counter()
        d = memlens.predict(step, gpu="H100", world_size=world, ranks="first")
        wall = time.perf_counter() - t0
        t = d.step_time()[0]
        sched = t["schedule"]
        params = sum(d.predictions[0].trace.metadata["prediction"]["ddp"][0]["param_bytes"])
        print(f"world {world} ({t['link']}): {params / 4 / 1e6:.1f}M parameters; predicted in {wall:.1f} s host wall "
              f"clock; two steps {t['step_ns'] / 1e6:.2f} ms modeled, compute {t['compute_ns'] / 1e6:.2f} ms, "
              f"communication {t['comm_ns'] / 1e6:.2f} ms, exposed {t['exposed_comm_ns'] / 1e6:.2f} ms")
        for k in sorted({a["pass"] for a in t["ddp_all_reduces"]}):
            ar = [a for a in t["ddp_all_reduces"] if a["pass"] == k]
            end_op = ar[0]["backward_end_op"]
            waited = int(sched.loc[sched["op_id"] == end_op, "wait_ns"].sum())
            algos = sorted({a["algorithm"] for a in ar})
            print(f"  pass {k + 1}: {len(ar)} bucket(s), {sum(a['bytes'] for a in ar):,} B, all-reduces "
                  f"{sum(a['end_ns'] - a['start_ns'] for a in ar) / 1e6:.2f} ms ({', '.join(algos)}), "
                  f"optimizer waited {waited / 1e6:.2f} ms after backward")


if __name__ == "__main__":
    main()
