"""Offload in the advisor's autocast variant: the offload planned for the fp32 step is planned again for the
autocast-bf16 step (its saves are bf16, half the bytes), the applied plan takes the planned bytes off the
predicted autocast peak, its hooks pack exactly the planned tensors, and CPU training under autocast with them
gives the same losses bit for bit; a plan whose tensors match no save says so and its peak is the unmoved one."""
from __future__ import annotations

import pytest

from _advice_cases import NET as _NET
from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)

# the 4-block net with its loss summed in fp32 (under autocast the head's output is bf16)
NET = _NET.replace("return self.head(x).sum()", "return self.head(x).float().sum()")


@pytest.fixture(scope="module")
def variant():
    """On a predicted H100: the fp32 offload plan of the 4-block net (batch 8 x 256 x 256), its autocast-bf16
    variant made by the advisor's precision search, the autocast plan made directly, the autocast baseline,
    the fp32 tensors applied under autocast unchanged (stale), and the hooks' counts in the variant's
    prediction."""
    r = run_child(NET + """
import dataclasses
from memlens.advice import Plan
from memlens.advice.advisor import _offload_plan, _precision_plans
from memlens.advice.verify import Workload, run_plan, verify
def step(model, opt):
    model(torch.randn(8, 256, 256, device="cuda")).backward(); opt.step(); opt.zero_grad()
work = Workload(Net, step, "H100")
blocks = [f"layers.{i}" for i in range(4)]
base = Plan(); verify(work, base)
fp32 = _offload_plan(work, base, blocks, [])
start = Plan(checkpoint={m: "offload" for m in fp32.by_module}, offload=fp32.tensors)
verify(work, start)
ac = next(p for p in _precision_plans(work, start, {}, None) if p.autocast)
ac_base = Plan(autocast="bfloat16"); verify(work, ac_base)
direct = _offload_plan(work, ac_base, blocks, [])
stale = Plan(checkpoint=dict(start.checkpoint), offload=fp32.tensors, autocast="bfloat16"); verify(work, stale)
installed = []
run_plan(work, ac, installed=installed)
rows = lambda ts: [dataclasses.asdict(t) for t in ts]
result = dict(fp32=rows(fp32.tensors), ac=rows(ac.offload), direct=rows(direct.tensors),
              by_module=direct.by_module, ac_peak=ac.peak_allocated, ac_base=ac_base.peak_allocated,
              stale_peak=stale.peak_allocated, stale_freed=stale.freed, ac_freed=ac.freed,
              ac_checkpoint=ac.checkpoint, offloaded=[h.offloaded for h in installed],
              unmatched=[len(h.unmatched()) for h in installed])
""")
    from memlens.advice.offload import OffloadTensor
    for k in ("fp32", "ac", "direct"):
        r[k] = tuple(OffloadTensor(**{**t, "shape": tuple(t["shape"])}) for t in r[k])
    return r


def test_the_autocast_variant_is_planned_for_the_autocast_step(variant):
    assert variant["fp32"] and {t.dtype for t in variant["fp32"]} == {"torch.float32"}
    # the variant's tensors are the ones planned on the autocast step itself, bf16 among them
    assert variant["ac"] == variant["direct"] and "torch.bfloat16" in {t.dtype for t in variant["ac"]}
    assert set(variant["ac_checkpoint"]) == {t.module for t in variant["ac"]}
    assert all(v == "offload" for v in variant["ac_checkpoint"].values())
    assert not any("matched no save" in f for f in variant["ac_freed"])


def test_the_applied_variant_takes_the_planned_bytes_off_the_autocast_peak(variant):
    moved = {m: b for m, (b, _) in variant["by_module"].items()}
    drop = variant["ac_base"] - variant["ac_peak"]
    # bounded as for fp32: the first block's planned bytes are away over the base peak; at most all planned bytes
    assert moved["layers.0"] > 0
    assert moved["layers.0"] <= drop <= sum(moved.values())
    # the hooks of the variant's prediction packed every planned tensor, each step the same number
    n = len(variant["ac"])
    assert variant["unmatched"] == [0]
    (packed,) = variant["offloaded"]
    assert packed >= n and packed % n == 0


def test_fp32_tensors_under_autocast_match_nothing_and_the_plan_says_so(variant):
    n = len(variant["fp32"])
    assert any(f.startswith(f"offload: {n} of the {n} planned saved tensors matched no save")
               for f in variant["stale_freed"])
    assert variant["stale_peak"] == variant["ac_base"]         # nothing moved: the autocast peak as it is


def _train(tensors=None, steps=3):
    """Losses of `steps` SGD steps of the net on the CPU under autocast bf16 (fixed seed), with `tensors`
    offloaded; and the hooks."""
    import torch
    ns: dict = {}
    exec(NET, ns)
    torch.manual_seed(0)
    model = ns["Net"]()
    hooks = None
    if tensors:
        from memlens.advice.offload import install
        hooks = install(model, tensors)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 256, 256, generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, hooks


def test_three_cpu_autocast_steps_with_the_variant_are_bitwise_the_same(variant):
    base, _ = _train()
    losses, hooks = _train(variant["ac"])
    n = len(variant["ac"])
    assert losses == base
    assert (hooks.offloaded, hooks.prefetched, hooks.late) == (3 * n, 3 * n, 0) and hooks.unmatched() == []
