"""Meta-device models initialised after sharding, as large-model training code does: built on ``meta``,
``fully_shard``, ``to_empty(device="cuda")``, then ``init_weights()`` with ``nn.init`` random ops on the
sharded (DTensor) parameters, which run through DTensor's RNG operator. Checked by hand here: each rank's
parameter bytes (FSDP2's padded shards) and the CUDA generator's Philox offset after the init (DTensor moves it
past every tensor's numbers, rounded up to a multiple of 4, on every rank alike).

Each prediction runs in a child process that imports memlens before torch (see tests/_predict_cases.py).
"""
from __future__ import annotations

import math

import pytest
import torch

from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)

IN, OUT, LAYERS = 64, 30, 2        # 30 rows do not divide by 4 or 8: FSDP2 pads to ceil(30 / N)
SEED = 1234

MODEL = f"""
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear({IN}, {OUT}) for _ in range({LAYERS}))
    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x)) @ torch.ones({OUT}, {IN}, device=x.device)
        return x
    def init_weights(self):
        for layer in self.layers:
            nn.init.trunc_normal_(layer.weight, std=0.02)
            nn.init.normal_(layer.bias)
            nn.init.uniform_(layer.bias, -0.1, 0.1)
offsets, keep = [], []
def step():
    torch.manual_seed({SEED})
    with torch.device("meta"):
        model = Net()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device="cuda")
    model.init_weights()
    state = bytes(torch.cuda.get_rng_state().tolist())    # (seed, offset), little-endian 64-bit
    offsets.append([int.from_bytes(state[:8], "little"), int.from_bytes(state[8:], "little")])
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, {IN}, device="cuda")).sum().backward()
    opt.step()
    keep.append((model, opt))
def held(p, category):
    b = p.trace.blocks
    b = b[(b.device == "cuda:0") & (b.category == category) & b.free_ns.isna()]
    return sorted(b.requested_size.tolist())
"""


@pytest.mark.parametrize("world", [4, 8])
def test_meta_init_with_random_ops_on_sharded_parameters_predicts_the_sharded_bytes(world):
    r = run_child(MODEL + f"""
d = memlens.predict(step, gpu="H100", world_size={world}, ranks="all")
result = {{"errors": {{str(k): v for k, v in d.errors.items()}}, "offsets": offsets,
          "params": {{str(k): held(p, "parameter") for k, p in d.predictions.items()}}}}
""")
    assert r["errors"] == {}
    rows = math.ceil(OUT / world)
    # each rank: ceil(30 / N) rows of every weight and bias, fp32, whatever its share of real rows
    expect = sorted([4 * rows * IN, 4 * rows] * LAYERS)
    assert r["params"] == {str(k): expect for k in range(world)}
    # Philox offset: per random op, the whole tensor's numel rounded up to a multiple of 4 (not the shard's)
    per_layer = (OUT * IN + 3) // 4 * 4 + 2 * ((OUT + 3) // 4 * 4)
    assert r["offsets"] == [[SEED, LAYERS * per_layer]] * world


def test_the_fake_cuda_generator_packs_seed_and_offset_as_torch_does():
    from memlens.prediction.distributed.rng import FakeCudaGenerator
    g = FakeCudaGenerator()
    g.manual_seed(2**64 - 5)               # a seed above int64, as torch.seed() may draw
    g.offset = 1_000_004
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.shape == (16,)
    # little-endian seed, then offset: the layout DTensor's _PhiloxState reads
    assert bytes(state.tolist()) == (2**64 - 5).to_bytes(8, "little") + (1_000_004).to_bytes(8, "little")
    other = FakeCudaGenerator()
    other.set_state(state)
    assert (other.seed, other.offset) == (2**64 - 5, 1_000_004)
    g.manual_seed(-1)                      # torch takes seeds modulo 2**64 and restarts the offset
    assert (g.seed, g.offset) == (2**64 - 1, 0)
    with pytest.raises(ValueError, match="16 bytes"):
        other.set_state(torch.zeros(8, dtype=torch.uint8))
