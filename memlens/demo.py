"""Built-in workloads for the demo, the sample traces, tests and benchmarks: small models that run on
CPU in well under a second per step, with module names like real ones (``model.layers.0.attn``).

- `TinyTransformerLM`: decoder-only transformer (embedding, pre-norm blocks with `attn` and `mlp`,
  tied-free LM head), trained with AdamW on random tokens.
- `MLP`: three linear layers, SGD.
- `SmallCNN`: two conv-bn-relu-pool stages and a linear head (inference, or training with SGD).
"""
from __future__ import annotations

import math
from pathlib import Path


def _torch():
    import torch
    return torch


def make_transformer(vocab: int = 256, d_model: int = 64, n_heads: int = 4, n_layers: int = 2,
                     seq_len: int = 32):
    """A small decoder-only transformer LM (causal self-attention written out, so every op is visible)."""
    torch = _torch()
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(x).split(c, dim=2)
            shape = (b, t, n_heads, c // n_heads)
            q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(c // n_heads)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, c)
            return self.proj(y)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(d_model)
            self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class TinyTransformerLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(seq_len, d_model)
            self.layers = nn.ModuleList(Block() for _ in range(n_layers))
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)

        def forward(self, tokens):
            pos = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.embed(tokens) + self.pos(pos)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    return TinyTransformerLM()


def make_mlp(d_in: int = 128, hidden: int = 256, d_out: int = 10):
    """Three linear layers with ReLU."""
    nn = _torch().nn
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, d_out))


def make_cnn(channels: int = 16, n_classes: int = 10):
    """conv-bn-relu-pool x2 and a linear head, for 3x32x32 images."""
    nn = _torch().nn
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.BatchNorm2d(2 * channels), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2 * channels * 8 * 8, n_classes))


def _train_steps(model, optimizer, steps: int, make_batch, loss_of, mark_steps: bool) -> float:
    """The shared loop: batch, loss, backward, optimizer step, zero_grad(set_to_none=True), and
    `memlens.step()` after each step when `mark_steps`. Returns the last loss."""
    torch = _torch()
    from memlens.recording import step
    loss = torch.zeros(())
    for _ in range(steps):
        loss = loss_of(model, make_batch())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if mark_steps:
            step()
    return float(loss.detach())


def train_transformer_steps(model, optimizer, steps: int, batch: int = 8, seq_len: int = 32,
                            vocab: int = 256, mark_steps: bool = True) -> float:
    """Train `model` for `steps` steps on random tokens; calls `memlens.step()` after each. Returns the
    last loss."""
    torch = _torch()

    def next_token_loss(m, tokens):
        logits = m(tokens[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))

    return _train_steps(model, optimizer, steps, lambda: torch.randint(0, vocab, (batch, seq_len + 1)),
                        next_token_loss, mark_steps)


def train_classifier_steps(model, optimizer, steps: int, make_batch, mark_steps: bool = True) -> float:
    """Train a classifier for `steps` steps on batches from `make_batch()` -> (x, y)."""
    torch = _torch()
    return _train_steps(model, optimizer, steps, make_batch,
                        lambda m, xy: torch.nn.functional.cross_entropy(m(xy[0]), xy[1]), mark_steps)


def record_demo_trace(steps: int = 4, seed: int = 0):
    """Record the small transformer trained for `steps` AdamW steps on CPU; returns the Trace."""
    torch = _torch()
    from memlens.recording import record
    torch.manual_seed(seed)
    model = make_transformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with record(model) as rec:
        train_transformer_steps(model, optimizer, steps)
    return rec.trace


def run_demo(out_dir, steps: int = 4, overwrite: bool = True) -> dict:
    """Record the demo workload, save ``OUT/demo.memlens`` and write ``OUT/report.html`` when the report
    module is available. Returns {"trace": path, "report": path or None, "report_error": str or None}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trace = record_demo_trace(steps=steps)
    trace_path = trace.save(out / "demo.memlens", overwrite=overwrite)
    result = {"trace": trace_path, "report": None, "report_error": None, "summary": trace.summary()}
    try:
        from memlens.reporting import report
    except ImportError as exc:
        result["report_error"] = f"the HTML report is unavailable in this build ({exc})"
        return result
    report_path = out / "report.html"
    report(trace, report_path)
    result["report"] = report_path
    return result
