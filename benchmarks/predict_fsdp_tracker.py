"""memlens's per-rank FSDP2 prediction beside torch's own FSDP2 memory tracker on the same model (issue 29).

The model: 8 x Linear(2048, 2048) (fp32), ``fully_shard`` per layer and at the root, AdamW (foreach), one step
of batch 16, rank 0 of 4. Each tool's own flow:

- memlens: ``memlens.predict(step, gpu="H100", world_size=4)``: fake `cuda`, torch's fake process group, the
  caching-allocator replay; prints peak allocated and what is live at that peak, by category.
- torch: ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` under ``FakeTensorMode`` with the fake
  process group on the CPU device (a CPU-only torch has no `cuda` without memlens's shim), as its docstring
  shows; prints its peak snapshot.

Both are compared with the sharding arithmetic done here by hand. Nothing is allocated for real.

    python benchmarks/predict_fsdp_tracker.py
"""
from __future__ import annotations

import memlens  # noqa: F401  (first: installs the fake-CUDA shim before torch)
import torch
import torch.nn as nn

LAYERS, D, WORLD = 8, 2048, 4


def build(mesh=None):
    from torch.distributed.fsdp import fully_shard
    model = nn.Sequential(*[nn.Linear(D, D) for _ in range(LAYERS)])
    for m in model:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def memlens_side():
    def step():
        with torch.device("cuda"):
            model = build()
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(16, D, device="cuda")).sum().backward()
        opt.step()
    d = memlens.predict(step, gpu="H100", world_size=WORLD, ranks="first")
    p = d.predictions[0]
    tl = p.simulate().timeline
    t = int(tl.loc[tl["allocated"].idxmax(), "t_ns"])
    b = p.trace.blocks
    b = b[b["device"] == "cuda:0"]
    live = b[(b["alloc_ns"] <= t) & (b["free_ns"].isna() | (b["free_ns"] > t))]
    return p.peak_allocated, live.groupby(["category", "op"])["requested_size"].sum()


def tracker_side():
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        with FakeTensorMode():
            model = build(mesh)
            opt = torch.optim.AdamW(model.parameters(), foreach=True)
            x = torch.randn(16, D)
            tracker = FSDPMemTracker(model, opt)
            tracker.track_inputs((x,))
            with tracker:
                model(x).sum().backward()
                opt.step()
            snap = tracker.get_tracker_snapshot("peak")
    finally:
        dist.destroy_process_group()
    return {str(k).split(".")[-1]: v for k, v in snap[torch.device("cpu")].items() if v}


def main():
    shard = 4 * (D * D + D) // WORLD * LAYERS          # fp32 sharded parameters of rank 0 (D divides by 4)
    print(f"by hand, rank 0 of {WORLD}: sharded parameters {shard:,} B, sharded gradients {shard:,} B, "
          f"AdamW exp_avg + exp_avg_sq {2 * shard:,} B")
    peak, live = memlens_side()
    print(f"memlens peak allocated {peak:,} B; live at the peak (requested bytes):")
    for (category, op), size in live.items():
        print(f"  {category:<16} {op:<30} {int(size):>14,}")
    snap = tracker_side()
    print("FSDPMemTracker peak snapshot (bytes): " + ", ".join(f"{k}={v:,}" for k, v in snap.items()))


if __name__ == "__main__":
    main()
