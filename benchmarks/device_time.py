"""Device time: the bert-small forward recorded on CPU, retimed to H100 and MI300X, against real kernels.

The architecture is read off the shared TraceLens profiles (AMD-AGI/TraceLens tests/traces/{h100,mi300}:
a HuggingFace BertForMaskedLM "bert-small" forward, 1 x 141 tokens, bf16, SDPA attention): word /
position / token-type embeddings (30522 / 512 / 2 x 512), 4 encoder layers of 8 heads, hidden 512,
intermediate 2048, GELU, LayerNorm eps 1e-12, the attention-mask check (``(mask == 1).all()``), and the
MLM head (512 -> 512, GELU, LayerNorm, 512 -> 30522 with bias). Weights are random: device time does
not depend on their values. It is built here with plain torch modules, recorded on the CPU with
`memlens.record`, put on the H100 and MI300X clocks with `memlens.retime`, and compared with the kernel
busy time of the real profiles, in total and per op class, beside a naive roofline
(``max(flops / dense peak, bytes / HBM bandwidth)`` per op, no floors).

    .venv/bin/python benchmarks/device_time.py

The issue's targets: total within 25%, each class within 35%, on both GPUs. The model's constants are
not fitted to these totals (see memlens/devicetime/gpus.py for where each one comes from); note that the
H100 / MI300X latency floors were read from individual small kernels of these same profiles, so this
checks the model's structure more than it validates those constants.

Measured (modeled / real kernel busy time; naive roofline in brackets):

    GPU       total         GEMM          attention     normalization  elementwise
    H100      0.96 (0.12)   0.94 (0.12)   0.99 (0.02)   1.04 (0.03)    0.99 (0.30)
    MI300X    0.92 (0.06)   0.88 (0.08)   0.94 (0.00)   1.08 (0.01)    0.86 (0.13)
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces" / "kineto"
TRACES = {"H100 SXM": SHARED / "tracelens_h100_bert_small.json.gz",
          "MI300X": SHARED / "tracelens_mi300_bert_small.json.gz"}
REPORTED_CLASSES = ("gemm", "attention", "normalization", "elementwise")
# the model's finer classes -> the four reported (reductions and gathers are elementwise-like kernels)
_REPORT_CLASS = {"gemm": "gemm", "attention": "attention", "normalization": "normalization",
                 "reduction": "elementwise", "gather": "elementwise", "elementwise": "elementwise",
                 "foreach": "elementwise", "transfer": "transfer", "none": "none"}


class BertLayer(nn.Module):
    def __init__(self, hidden=512, heads=8, intermediate=2048, eps=1e-12):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.up = nn.Linear(hidden, intermediate)
        self.down = nn.Linear(intermediate, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=eps)

    def _heads(self, x):
        b, s, h = x.shape
        return x.view(b, s, self.heads, h // self.heads).permute(0, 2, 1, 3)

    def forward(self, x):
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(x.shape)
        x = self.attn_norm(F.dropout(self.attn_out(a), 0.1, self.training) + x)
        y = self.down(F.gelu(self.up(x)))
        return self.out_norm(F.dropout(y, 0.1, self.training) + x)


class BertSmallMLM(nn.Module):
    """bert-small (4 layers, hidden 512, 8 heads) with the masked-LM head, as in the profiles."""

    def __init__(self, vocab=30522, hidden=512, layers=4, heads=8, intermediate=2048, max_pos=512, types=2):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_pos, hidden)
        self.token_type = nn.Embedding(types, hidden)
        self.emb_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, intermediate) for _ in range(layers))
        self.transform = nn.Linear(hidden, hidden)
        self.head_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.decoder = nn.Linear(hidden, vocab)
        self.register_buffer("position_ids", torch.arange(max_pos).unsqueeze(0), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, max_pos, dtype=torch.long), persistent=False)

    def forward(self, input_ids, attention_mask):
        s = input_ids.shape[1]
        x = self.word(input_ids) + self.token_type(self.token_type_ids[:, :s])
        x += self.position(self.position_ids[:, :s])
        x = F.dropout(self.emb_norm(x), 0.1, self.training)
        if not bool((attention_mask == 1).all()):   # HF's SDPA path drops an all-ones mask
            raise ValueError("this replica handles the all-ones mask of the profiles only")
        for layer in self.layers:
            x = layer(x)
        return self.decoder(self.head_norm(F.gelu(self.transform(x))))


def record_bert_small(tokens: int = 141, dtype=torch.bfloat16, seed: int = 0):
    """Record one bert-small MLM forward (1 x `tokens`, `dtype`) on the CPU; returns the Trace."""
    import memlens
    torch.manual_seed(seed)
    model = BertSmallMLM().to(dtype).eval()
    ids = torch.randint(0, 30522, (1, tokens))
    mask = torch.ones(1, tokens, dtype=torch.long)
    with torch.no_grad():
        model(ids, mask)                       # warm-up outside the recording
        with memlens.record(model, allocator="none") as rec:
            model(ids, mask)
    return rec.trace


def real_by_class(path) -> pd.Series:
    """Kernel busy ns per class in a real profile (kernels only; memcpys reported as 'transfer')."""
    from memlens.gpu_activity import kernel_summary
    k = kernel_summary(path)
    return k.groupby("kernel_class")["dur_ns"].sum()


def modeled_by_class(trace, gpu: str) -> tuple[pd.Series, pd.Series]:
    """(modeled ns, naive roofline ns) per reported class for `trace` on `gpu`."""
    from memlens.devicetime.costmodel import device_times
    from memlens.devicetime.gpus import gpu as resolve
    dt = device_times(trace.ops, resolve(gpu))
    cls = dt["op_class"].map(_REPORT_CLASS)
    return dt["device_ns"].groupby(cls).sum(), dt["roofline_ns"].groupby(cls).sum()


def compare(trace, gpu: str, path) -> pd.DataFrame:
    """Rows per class + total: real_us, model_us, model_ratio, roofline_us, roofline_ratio."""
    real = real_by_class(path)
    model, roof = modeled_by_class(trace, gpu)
    rows = []
    for c in REPORTED_CLASSES + ("total",):
        if c == "total":
            r = sum(real.get(x, 0) for x in REPORTED_CLASSES)
            m = sum(model.get(x, 0) for x in REPORTED_CLASSES)
            f = sum(roof.get(x, 0) for x in REPORTED_CLASSES)
        else:
            r, m, f = real.get(c, 0), model.get(c, 0), roof.get(c, 0)
        rows.append({"class": c, "real_us": r / 1e3, "model_us": m / 1e3, "model_ratio": m / r if r else math.nan,
                     "roofline_us": f / 1e3, "roofline_ratio": f / r if r else math.nan})
    return pd.DataFrame(rows)


def main() -> int:
    missing = [str(p) for p in TRACES.values() if not p.exists()]
    if missing:
        print(f"needs the shared TraceLens profiles: {', '.join(missing)}")
        return 1
    torch.set_num_threads(1)
    trace = record_bert_small()
    ops = trace.ops
    print(f"bert-small MLM forward, 1 x 141 tokens, bf16, recorded on CPU: {len(ops)} ops, "
          f"{(ops['flops'] > 0).sum()} with flops ({ops['flops'].sum() / 1e9:.2f} GFLOP)")
    import memlens
    ok = True
    for gpu, path in TRACES.items():
        table = compare(trace, gpu, path)
        retimed = memlens.retime(trace, gpu=gpu)
        print(f"\n{gpu}: ratio = modeled / real kernel busy time (real: {path.name})")
        print(f"  {'class':<14}{'real us':>10}{'model us':>10}{'ratio':>8}{'roofline us':>13}{'ratio':>8}")
        for row in table.itertuples():
            print(f"  {row._1:<14}{row.real_us:>10.1f}{row.model_us:>10.1f}{row.model_ratio:>8.2f}"
                  f"{row.roofline_us:>13.1f}{row.roofline_ratio:>8.2f}")
            limit = 0.25 if row._1 == "total" else 0.35
            ok &= abs(row.model_ratio - 1) <= limit
        print(f"  retimed trace: {retimed.metadata['clock']['kernels']} kernels, device busy "
              f"{retimed.metadata['clock']['device_busy_ns'] / 1e3:.1f} us (incl. transfers), "
              f"span {retimed.duration_ns / 1e3:.1f} us on the {retimed.metadata['clock']['gpu']} clock")
    print("\nwithin the targets (total 25%, each class 35%) on both GPUs:", "yes" if ok else "NO")
    return 0


if __name__ == "__main__":
    sys.exit(main())
