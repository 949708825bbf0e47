"""The small model the advice tests predict, as source for a child process (`_predict_cases.run_child`) or a
script: 4 blocks of LayerNorm -> Linear 256x1024 -> GELU -> Linear 1024x256 with a residual, then a head summed
to a scalar loss. `STEP` trains it one step on a batch of 32 x 256 x 256 made on cuda (fake inside a prediction)."""

NET = """
import torch, torch.nn as nn
class Block(nn.Module):
    def __init__(self, d=256):
        super().__init__(); self.ln = nn.LayerNorm(d); self.fc1 = nn.Linear(d, 4 * d); self.fc2 = nn.Linear(4 * d, d)
    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
class Net(nn.Module):
    def __init__(self, n=4, d=256):
        super().__init__(); self.layers = nn.ModuleList(Block(d) for _ in range(n)); self.head = nn.Linear(d, 10)
    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).sum()
"""

STEP = """def step(model, opt):
    model(torch.randn(32, 256, 256, device="cuda")).backward(); opt.step(); opt.zero_grad()
"""
