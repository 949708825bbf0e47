"""Held-out training steps for `recorder_overhead.py` (`--workload heldout` or one of their names).

The recorder's close and per-op paths were tuned on the GPT and CNN steps of `recorder_overhead.py`; these four
steps were never used for that, so their figures say how the costs carry over to steps nobody tuned for. They
differ from the tuned two where it matters for the recorder: op size (the MLP's ops take ~7 us each, so a fixed
close cost weighs most), op mix (an LSTM's fused cell ops and `clip_grad_norm_`; residual adds; `nn.
TransformerEncoderLayer`'s fused attention and GELU) and optimizer (Adam, AdamW with foreach lists, SGD with
weight decay). Each builder returns (model, step); a step is forward, loss, backward, optimizer step, zero_grad.
"""
from __future__ import annotations

import torch
from torch import nn


def mlp_step():
    """A new user's MLP (64 -> 128 -> 128 -> 10, ReLU) with AdamW on a batch of 32: ~100 tiny ops."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step():
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step


class _LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int = 500, d: int = 64, hidden: int = 128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        return self.head(self.rnn(self.emb(tokens))[0])


def lstm_step():
    """A 2-layer LSTM language model (vocab 500, 8 x 32 tokens), Adam, gradient clipping."""
    torch.manual_seed(0)
    model = _LSTMLanguageModel()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 500, (8, 33))

    def step():
        logits = model(tokens[:, :-1])
        nn.functional.cross_entropy(logits.reshape(-1, 500), tokens[:, 1:].reshape(-1)).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


def resnet_step():
    """A small ResNet (stem + 4 residual blocks of 16 channels, 32x32 inputs, batch 16), SGD with momentum and
    weight decay."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), *[_ResidualBlock(16) for _ in range(4)],
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))

    def step():
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step


def vit_step():
    """A ViT-like encoder (patch projection 48 -> 96, 4 pre-norm `nn.TransformerEncoderLayer`s with GELU, 64
    tokens, batch 8, mean-pooled head), AdamW with foreach lists."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(96, 4, 192, batch_first=True, activation="gelu", norm_first=True)
    model = nn.Sequential(nn.Linear(48, 96), nn.TransformerEncoder(layer, 4, enable_nested_tensor=False),
                          nn.Linear(96, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x, y = torch.randn(8, 64, 48), torch.randint(0, 10, (8,))

    def step():
        nn.functional.cross_entropy(model(x).mean(1), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step


HELDOUT = {"mlp": (mlp_step, "MLP training step (64-128-128-10, batch 32, AdamW)"),
           "lstm": (lstm_step, "LSTM LM training step (2 layers, hidden 128, 8 x 32 tokens, Adam, grad clip)"),
           "resnet": (resnet_step, "ResNet training step (4 residual blocks, 16 ch, batch 16, SGD wd)"),
           "vit": (vit_step, "ViT-like training step (4 encoder layers, d 96, 64 tokens, batch 8, AdamW foreach)")}
