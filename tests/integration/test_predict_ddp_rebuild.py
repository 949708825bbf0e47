"""DDP's bucket rebuild under prediction: the construction bucket is replaced at the second forward by buckets in
the first backward's ready order, with the old and new alive together only while gradients still view the old
bucket. Sizes and live bytes computed by hand here.

Model: Linear(1000, 510) -> ReLU -> Linear(510, 600), fp32. Gradients become ready in the order b2, w2, b1, w1;
the rebuild's limits are 1 MiB then 25 MiB: [b2, w2] (2,400 + 1,224,000 = 1,226,400 B >= 1 MiB closes it), then
[b1, w1] (2,040 + 2,040,000 = 2,042,040 B).
"""
from __future__ import annotations

from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)

P = 4 * (510 * 1000 + 510 + 600 * 510 + 600)      # trainable fp32 bytes: 3,268,440
NEW = [4 * (600 + 600 * 510), 4 * (510 + 510 * 1000)]
X = 4 * 4 * 1000                                  # the second forward's input, made before DDP's forward runs

CASE = """
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
def step(as_view, set_to_none):
    model = nn.Sequential(nn.Linear(1000, 510), nn.ReLU(), nn.Linear(510, 600)).cuda()
    net = DDP(model, gradient_as_bucket_view=as_view)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    for _ in range(2):
        net(torch.randn(4, 1000, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
def facts(as_view, set_to_none):
    d = memlens.predict(lambda: step(as_view, set_to_none), gpu="H100", world_size=2)
    b = d.predictions[0].trace.blocks
    b = b[(b.device == "cuda:0") & (b.category != "workspace")]
    zeros = b[b.op == "aten::zeros"].sort_values("alloc_seq")
    old, new = zeros.iloc[0], zeros.iloc[1:]
    last_new = int(new.alloc_seq.max())
    alive = b[(b.alloc_seq <= last_new) & (b.free_seq.isna() | (b.free_seq > last_new))]
    return {"old": int(old.requested_size), "new": new.requested_size.tolist(),
            "old_freed_after_new": int(old.free_seq) > last_new,
            "old_freed_before_new": int(old.free_seq) < int(new.alloc_seq.min()),
            "new_alive_at_end": bool(new.free_seq.isna().all()),
            "live_at_rebuild": int(alive.requested_size.sum())}
result = {"view_kept": facts(True, False), "copy_kept": facts(False, False), "view_none": facts(True, True)}
"""


def test_rebuild_replaces_the_bucket_and_overlaps_only_while_gradients_view_it():
    r = run_child(CASE)
    for case in r.values():
        assert case["old"] == P and case["new"] == NEW and case["new_alive_at_end"]
        assert sum(NEW) == P
    # gradients are views of the old bucket and kept: old and new alive together. Live then: parameters P,
    # AdamW's exp_avg and exp_avg_sq 2P (its step counts are on the CPU), old bucket P, new buckets P, input X
    assert r["view_kept"]["old_freed_after_new"] and r["view_kept"]["live_at_rebuild"] == 5 * P + X
    # separate gradients (kept, P): the Reducer clears the old bucket before allocating: P + 2P + P + new P
    assert r["copy_kept"]["old_freed_before_new"] and r["copy_kept"]["live_at_rebuild"] == 5 * P + X
    # gradient views set to None by zero_grad: nothing holds the old bucket at the clear: P + 2P + new P
    assert r["view_none"]["old_freed_before_new"] and r["view_none"]["live_at_rebuild"] == 4 * P + X
