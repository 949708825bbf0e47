"""memlens's per-rank FSDP2 prediction beside torch's own FSDP2 memory tracker on the same model.

The model: 8 x Linear(2048, 2048) (fp32), ``fully_shard`` per layer and at the root, AdamW (foreach), one step
of batch 16, rank 0 of 4. Each tool's own flow:

- memlens: ``memlens.predict(step, gpu="H100", world_size=4)``: fake `cuda`, torch's fake process group, the
  caching-allocator replay; prints peak allocated and what is live at that peak, by category.
- torch: ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` under ``FakeTensorMode`` with the fake
  process group on the CPU device (a CPU-only torch has no `cuda` without memlens's shim), as its docstring
  shows; prints its peak snapshot.

Both are compared with the sharding arithmetic done here by hand. Nothing is allocated for real.

Why the tracker reports 503,562,304 B of optimizer state where the sharding arithmetic gives 67,141,632 B
(found by reading torch/distributed/_tools/fsdp2_mem_tracker.py and mem_tracker.py, torch 2.13, and checked by
this script's probe, which notes the op that made each storage the tracker counts and prints what is live at
its peak): the tracker labels *every* tensor created while ``optimizer.step`` runs (between its step pre- and
post-hooks, ``_in_opt``) as optimizer state, whatever it is. At its peak, inside AdamW's
``_foreach_addcdiv_(params, exp_avgs, denom)``, that is

- 67,141,632 B: ``exp_avg`` + ``exp_avg_sq`` of the shard (``zeros_like``): the real state, memlens's
  ``optimizer_state``, the same bytes;
- 33,570,816 B: the ``_foreach_sqrt`` output (``denom``, a step temporary): memlens has it too, as
  ``temporary`` (freed at the end of the step);
- 64 B: the 16 AdamW ``step`` counters (fp32 scalars): on a GPU run they stay on the host (AdamW without
  ``capturable``/``fused``), so memlens, which counts device memory, has none; the tracker runs on the CPU
  device, so it counts them;
- 402,849,792 B = 3 x 134,283,264 B: three tensor lists of 16 *global-shape* fake tensors (each parameter's
  unsharded size, 8 x (2048 x 2048 + 2048) x 4 B per list) that DTensor's sharding propagation builds with
  ``torch.empty_strided`` (``_op_schema.gen_fake_args`` -> ``_rebuild_tensor_from_dtensor_meta``) to infer the
  output of ``_foreach_addcdiv_`` on its three DTensor lists. They hold no GPU memory on a real run (shape
  inference only). The tracker means to skip them (it counts ops only when ``active_fake_mode()`` is the fake
  mode active when it was entered), but run as its docstring shows, inside the user's ``FakeTensorMode``,
  propagation runs under that same mode, so the skip never applies.

67,141,632 + 33,570,816 + 64 + 402,849,792 = 503,562,304 B. The probe's reconciliation table below prints
these per category beside memlens's. memlens's peak has besides two modelled cuBLAS workspaces (64 MiB),
which the tracker does not model, and no input (memlens's step frees its input; the benchmark's tracker run
keeps ``x``: 131,072 B).

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
    """The tracker's peak snapshot and, from the probe, what it counts at that peak by (its category, the op
    that made the storage): DTensor sharding-propagation fakes are named so."""
    import collections

    import torch.distributed as dist
    import torch.distributed.tensor._op_schema as op_schema
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools import mem_tracker
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    where = {"op": "(made outside the tracker's dispatch)", "propagating": False}
    made_by: dict[int, str] = {}
    create, rebuild = mem_tracker._WeakRefInfo.create_winfo.__func__, op_schema._rebuild_tensor_from_dtensor_meta

    def noted_create(cls, st, device, reftype, callback=None):
        out = create(cls, st, device, reftype, callback)
        made_by[id(out[0])] = ("DTensor sharding propagation (global-shape fake args)" if where["propagating"]
                               else where["op"])
        return out

    def noted_rebuild(arg):
        where["propagating"] = True
        try:
            return rebuild(arg)
        finally:
            where["propagating"] = False

    class Probe(FSDPMemTracker):
        at_peak = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            outer, where["op"] = where["op"], str(func)
            try:
                return super().__torch_dispatch__(func, types, args, kwargs)
            finally:
                where["op"] = outer

        def _update_peak_stats(self, peak_state):
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            if self._peak_mem != before:     # a new peak: note what the tracker counts now
                Probe.at_peak = collections.Counter()
                for _, (w, _) in list(self._WINFO.items()):
                    Probe.at_peak[(str(w.reftype).split(".")[-1], made_by.get(id(w), "?"))] += w.mem_consumed

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    mem_tracker._WeakRefInfo.create_winfo = classmethod(noted_create)
    op_schema._rebuild_tensor_from_dtensor_meta = noted_rebuild
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        with FakeTensorMode():
            model = build(mesh)
            opt = torch.optim.AdamW(model.parameters(), foreach=True)
            x = torch.randn(16, D)
            tracker = Probe(model, opt)
            tracker.track_inputs((x,))
            with tracker:
                model(x).sum().backward()
                opt.step()
            snap = tracker.get_tracker_snapshot("peak")
    finally:
        mem_tracker._WeakRefInfo.create_winfo = classmethod(create)
        op_schema._rebuild_tensor_from_dtensor_meta = rebuild
        dist.destroy_process_group()
    return ({str(k).split(".")[-1]: v for k, v in snap[torch.device("cpu")].items() if v},
            {k: v for k, v in Probe.at_peak.items() if v})


def main():
    shard = 4 * (D * D + D) // WORLD * LAYERS          # fp32 sharded parameters of rank 0 (D divides by 4)
    print(f"by hand, rank 0 of {WORLD}: sharded parameters {shard:,} B, sharded gradients {shard:,} B, "
          f"AdamW exp_avg + exp_avg_sq {2 * shard:,} B")
    peak, live = memlens_side()
    print(f"memlens peak allocated {peak:,} B; live at the peak (requested bytes):")
    for (category, op), size in live.items():
        print(f"  {category:<16} {op:<30} {int(size):>14,}")
    snap, counted = tracker_side()
    print("FSDPMemTracker peak snapshot (bytes): " + ", ".join(f"{k}={v:,}" for k, v in snap.items()))
    print("what the tracker counts at that peak (probe: its category, the op that made the storage):")
    for (category, op), size in sorted(counted.items()):
        print(f"  {category:<14} {op:<56} {size:>14,}")
    reconcile(live, counted)


def reconcile(live, counted):
    """The tracker's categories beside memlens's for the same blocks (bytes); rows by what the blocks are."""
    def ml(category, op=None):
        rows = {k: v for k, v in live.items() if k[0] == category and (op is None or k[1] == op)}
        return int(sum(rows.values()))

    def tr(category, op=None):
        return int(sum(v for (c, o), v in counted.items() if c == category and (op is None or op in o)))
    rows = [("sharded parameters", "parameter", ml("parameter"), "SHARDED_PARAM", tr("SHARDED_PARAM")),
            ("sharded gradients", "gradient", ml("gradient"), "SHARDED_GRAD", tr("SHARDED_GRAD")),
            ("AdamW exp_avg + exp_avg_sq", "optimizer_state", ml("optimizer_state"), "OPT",
             tr("OPT", "zeros_like")),
            ("AdamW foreach sqrt (denom)", "temporary", ml("temporary", "aten::_foreach_sqrt"), "OPT",
             tr("OPT", "_foreach_sqrt")),
            ("AdamW step counters", "(host, not device)", 0, "OPT", tr("OPT", "lift_fresh")),
            ("DTensor propagation fakes", "(none: shape inference)", 0, "OPT", tr("OPT", "propagation")),
            ("cuBLAS workspaces", "unknown", ml("unknown", "cublas_workspace (modelled)"), "(not modelled)", 0),
            ("input batch", "(freed before the peak)", 0, "INP", tr("INP"))]
    print(f"reconciliation at each tool's peak (bytes):\n  {'what':<28} {'memlens category':<26} {'memlens':>14}  "
          f"{'tracker category':<16} {'tracker':>14}")
    for what, mc, mv, tc, tv in rows:
        print(f"  {what:<28} {mc:<26} {mv:>14,}  {tc:<16} {tv:>14,}")
    print(f"  {'total':<28} {'':<26} {sum(r[2] for r in rows):>14,}  {'':<16} {sum(r[4] for r in rows):>14,}")


if __name__ == "__main__":
    main()
