"""FSDP2 on a model with parameters outside its repeated blocks: the root ``fully_shard`` holds them.

A stem Linear(17, 63) before the blocks and a head Linear(63, 5) after them; two blocks of Linear(63, 30),
Linear(30, 63). On 4 ranks every parameter is sharded along dim 0, padded to ceil(rows / 4) rows per rank;
each FSDP group (each block, and the root with the stem and the head) keeps one reduce-scatter output: the
sum of its padded shards. All fp32, AdamW's two states per parameter shard. Computed by hand here.

Each prediction runs in a child process that imports memlens before torch (see tests/_predict_cases.py).
"""
from __future__ import annotations

import math

from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)

WORLD = 4
ROOT_SHAPES = [(63, 17), (63,), (5, 63), (5,)]     # stem weight, bias; head weight, bias (5 rows: 2 per rank)
BLOCK_SHAPES = [(30, 63), (30,), (63, 30), (63,)]
BLOCKS = 2

MODEL = f"""
import torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(17, 63)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(63, 30), nn.ReLU(), nn.Linear(30, 63))
                                    for _ in range({BLOCKS}))
        self.head = nn.Linear(63, 5)
    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
def step(model, opt):
    model(torch.randn(64, 17, device="cuda")).sum().backward()
    opt.step()
"""


def _padded(shape) -> int:
    return 4 * math.ceil(shape[0] / WORLD) * math.prod(shape[1:])


def test_the_root_group_shards_the_parameters_outside_the_blocks():
    """Mutant killed: the root's ``fully_shard(model)`` left out (the stem and head stay whole on every rank:
    parameter bytes 4 x (63 x 17 + 63 + 5 x 63 + 5) for them instead of their padded shards)."""
    r = run_child(MODEL + f"""
df = memlens.predict_strategies(Net, step, world_sizes=({WORLD},), strategies=("fsdp2",))
result = {{"rows": df.to_dict("records")}}
""")
    row = r["rows"][0]
    assert row["error"] is None and row["fits"]
    root = [_padded(s) for s in ROOT_SHAPES]            # 4 x (16 x 17 + 16 + 2 x 63 + 2) = 1664 bytes
    block = [_padded(s) for s in BLOCK_SHAPES]          # 4 x (8 x 63 + 8 + 16 x 30 + 16) = 4032 bytes
    assert sum(root) == 1664 and sum(block) == 4032
    params = sum(root) + BLOCKS * sum(block)
    assert (row["parameter_bytes"], row["gradient_bytes"], row["optimizer_state_bytes"]) == \
        (params, params, 2 * params)
