"""Planned activation offload: the selection on a hand-built trace, training with the hooks against training
without them (bit for bit), a recording of the hooked steps read for where each planned block leaves and comes
back, and a prediction of the applied plan against the advised peak."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from _advice_cases import NET
from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)

MiB = 1 << 20
MS = 1_000_000



# ---- the selection on a hand-built trace -------------------------------------------------------------------
def hand_trace():
    """Two blocks' forward and backward (ms): P a parameter, A (64 MiB) idle from 2 to 40 ms, S (0.5 MiB)
    small, D saved twice, E saved by the last forward op and read by the first backward op; C a forward
    temporary (not saved) that makes the peak at 21.1 ms."""
    from memlens import Trace
    # op: (name, start ms, end ms, module, phase, reads, writes)
    ops = [("aten::mm", 0, 1, "net.blk.0", "forward", ["P"], ["A"]),
           ("aten::nansum", 1.0, 1.01, "net.blk.0", "forward", ["A"], []),       # census: save 0 is A
           ("aten::nansum", 1.02, 1.03, "net.blk.0", "forward", ["P"], []),      # save 1 is P
           ("aten::relu", 1.1, 2, "net.blk.0", "forward", ["A"], ["S", "D"]),
           ("aten::nansum", 2.0, 2.01, "net.blk.0", "forward", ["S"], []),       # save 2 is S
           ("aten::nansum", 2.02, 2.03, "net.blk.0", "forward", ["D"], []),      # saves 3 and 4: D twice
           ("aten::nansum", 2.04, 2.05, "net.blk.0", "forward", ["D"], []),
           ("aten::mm", 20, 21, "net.blk.1", "forward", ["D"], ["C"]),
           ("aten::gelu", 21.1, 30, "net.blk.1", "forward", ["C", "S"], ["E"]),
           ("aten::nansum", 30.0, 30.01, "net.blk.1", "forward", ["E"], []),     # save 0 of blk.1 is E
           ("aten::gelu_backward", 30.02, 31, "net.blk.1", "backward", ["E", "D"], []),
           ("aten::add", 31, 40, "net.blk.1", "backward", ["D"], []),
           ("aten::mm", 40, 41, "net.blk.0", "backward", ["A", "S", "P", "D"], [])]
    sizes = {"P": 100 * MiB, "A": 64 * MiB, "S": MiB // 2, "D": 64 * MiB, "C": 64 * MiB, "E": 2 * MiB}
    made = {"A": 0, "S": 3, "D": 3, "C": 7, "E": 8}
    freed = {"C": 22, "E": 31}
    ids = {k: i for i, k in enumerate(sizes)}
    op_rows, acc = [], []
    for i, (name, a, b, module, phase, reads, writes) in enumerate(ops):
        op_rows.append({"op_id": i, "name": name, "start_ns": int(a * MS), "end_ns": int(b * MS),
                        "module": module, "phase": phase})
        acc += [{"block_id": ids[k], "t_ns": int(a * MS), "op_id": i, "is_write": k in writes}
                for k in reads + writes]
    op_rows.append({"op_id": len(ops), "name": "end", "start_ns": 50 * MS, "end_ns": 50 * MS, "module": "",
                    "phase": "other"})
    blocks = [{"block_id": ids[k], "device": "cuda:0", "size": sizes[k], "category": "activation",
               "alloc_ns": int(ops[made[k]][1] * MS) if k in made else None,
               "free_ns": freed.get(k, 45) * MS, "alloc_op_id": made.get(k),
               "op": ops[made[k]][0] if k in made else "", "module": "net", "allocated_before": k not in made}
              for k in sizes]
    blocks = pd.DataFrame(blocks).astype({"alloc_ns": "Int64", "alloc_op_id": "Int64"})
    trace = Trace.from_tables(blocks, pd.DataFrame(acc), pd.DataFrame(op_rows))
    f32 = "torch.float32"
    saves = [("blk.0", 0, (16, 1024, 1024), f32), ("blk.0", 1, (25, 1024, 1024), f32),
             ("blk.0", 2, (128, 1024), f32), ("blk.0", 3, (16, 1024, 1024), f32),
             ("blk.0", 4, (16, 1024, 1024), f32), ("blk.1", 0, (512, 1024), f32)]
    return trace, [s + (0, 1, True) for s in saves]


def link(gb_per_s):
    from memlens.analysis.bandwidth import BandwidthModel
    return BandwidthModel(h2d_bytes_per_s=gb_per_s * 1e9, d2h_bytes_per_s=gb_per_s * 1e9, latency_ns=10_000)


def test_only_the_large_long_idle_tensor_made_by_its_module_is_planned():
    from memlens.advice.offload import OffloadTensor
    from memlens.advice.offload_plan import plan_offload
    trace, saves = hand_trace()
    plan = plan_offload(trace, saves, ["blk.0", "blk.1"], link(50))
    # A only: P is a parameter (not made by the forward), S is under the 1 MiB floor, D is saved twice, E is
    # idle 10 us between its last forward and first backward use. A's copy back starts at 40 ms minus
    # 64 MiB / 50 GB/s + 10 us = 38.65 ms: the latest module backward start before it is blk.1's, at 30.02 ms.
    want = OffloadTensor("blk.0", 0, (16, 1024, 1024), "torch.float32", 64 * MiB, "blk.1", "aten::mm",
                         "aten::relu", "aten::mm", 0)
    assert plan.tensors == (want,)
    assert plan.by_module == {"blk.0": (64 * MiB, 0)}          # off the 21.1 ms peak, no stall
    assert plan.swap.peak_before == (100 + 64 * 3 + 2) * MiB + MiB // 2
    assert plan.swap.peak_after == plan.swap.peak_before - 64 * MiB


def test_a_prefetch_that_cannot_start_before_backward_is_planned_at_its_start_with_its_stall():
    from memlens.advice.offload_plan import plan_offload
    trace, saves = hand_trace()
    plan = plan_offload(trace, saves, ["blk.0", "blk.1"], link(5))
    # at 5 GB/s the copy back takes 10 us + 64 MiB / 5 GB/s; the planner would start it at 40 ms minus that,
    # during the forward, so it comes back at the start of backward (30.02 ms), ending past its use at 40 ms
    in_ns = 10_000 + -(-64 * MiB * 10**9 // (5 * 10**9))
    (t,) = plan.tensors
    assert t.prefetch_at == "" and t.stall_ns == 30_020_000 + in_ns - 40 * MS > 0
    assert plan.by_module == {"blk.0": (64 * MiB, t.stall_ns)}


def test_no_host_link_or_too_slow_a_link_plans_nothing():
    from memlens.advice.offload_plan import host_link, plan_offload
    trace, saves = hand_trace()
    none = plan_offload(trace, saves, ["blk.0", "blk.1"], None)
    assert none.tensors == () and "no host link" in none.notes[0]
    # 1 GB/s: the round trip of 64 MiB (2 x 67.1 ms) is longer than A's 38 ms idle
    slow = plan_offload(trace, saves, ["blk.0", "blk.1"], link(1))
    assert slow.tensors == () and "no saved tensor is large and idle long enough" in slow.notes[0]
    # the GPU table's links: PCIe 5.0 x16 on the H100 (50 GB/s each way), NVLink-C2C on the GH200 (450 GB/s)
    assert (host_link("H100").h2d_bytes_per_s, host_link("H100").d2h_bytes_per_s) == (50e9, 50e9)
    assert host_link("GH200").h2d_bytes_per_s == 450e9 and host_link("GH200").latency_ns == 2_000
    assert host_link("no such gpu") is None


# ---- a plan made by prediction, enacted on the CPU ---------------------------------------------------------
@pytest.fixture(scope="module")
def planned():
    """The offload plan of the 4-block net (batch 8 x 256 x 256) on an H100, its advised peak, and a prediction
    of the plan applied inside build_model by hand, as a user would."""
    r = run_child(NET + """
import dataclasses
from memlens.advice import Plan
from memlens.advice.advisor import _offload_plan
from memlens.advice.verify import Workload, verify
def step(model, opt):
    model(torch.randn(8, 256, 256, device="cuda")).backward(); opt.step(); opt.zero_grad()
work = Workload(Net, step, "H100")
base = Plan(); verify(work, base)
notes = []
off = _offload_plan(work, base, [f"layers.{i}" for i in range(4)], notes)
plan = Plan(checkpoint={m: "offload" for m in off.by_module}, offload=off.tensors)
verify(work, plan)
held = []
def by_hand():
    if not held:
        model = plan.apply(Net()).cuda(); held.append((model, torch.optim.AdamW(model.parameters())))
    step(*held[0])
q = memlens.predict(by_hand, gpu="H100")
result = dict(tensors=[dataclasses.asdict(t) for t in off.tensors], by_module=off.by_module, notes=notes,
              base=base.peak_allocated, advised=plan.peak_allocated, independent=q.peak_allocated,
              checkpoint=plan.checkpoint)
""")
    from memlens.advice.offload import OffloadTensor
    r["tensors"] = tuple(OffloadTensor(**{**t, "shape": tuple(t["shape"])}) for t in r["tensors"])
    return r


def test_the_applied_plan_is_predicted_at_the_advised_peak(planned):
    assert planned["tensors"] and not planned["notes"]
    assert abs(planned["independent"] - planned["advised"]) <= 0.005 * planned["advised"]
    # the plan cannot take more off the peak than it moves; once the first block's tensors are away the peak may
    # move to an instant where a later block's tensor is already back, so the drop lies between the first
    # block's bytes (away from its forward to the last backward, the base peak included) and all planned bytes
    moved = {m: b for m, (b, _) in planned["by_module"].items()}
    drop = planned["base"] - planned["advised"]
    assert moved["layers.0"] > 0
    assert moved["layers.0"] <= drop <= sum(moved.values())


def _train(tensors=None, steps=3, snippet=None, outer=False, checkpoint=None):
    """Losses and last gradients of `steps` SGD steps of the net on the CPU (fixed seed), with the planned
    `tensors` offloaded (or the plan's `snippet` run on the model)."""
    import torch
    from memlens.advice import Plan
    ns: dict = {}
    exec(NET, ns)
    torch.manual_seed(0)
    model = ns["Net"]()
    hooks = None
    if checkpoint:
        Plan(checkpoint=checkpoint).apply(model)
    if snippet is not None:
        exec(snippet, {"model": model})
    elif tensors:
        from memlens.advice.offload import install
        hooks = install(model, tensors)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 256, 256, generator=g)
        if outer:      # the user's own hooks around the whole step: the planned ones take the blocks' saves
            with torch.autograd.graph.saved_tensors_hooks(lambda t: (t * 1,), lambda p: p[0]):
                loss = model(x)
        else:
            loss = model(x)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, grads, hooks


def test_three_cpu_steps_with_the_plan_are_bitwise_the_same(planned):
    import torch
    base_losses, base_grads, _ = _train()
    losses, grads, hooks = _train(planned["tensors"])
    assert losses == base_losses
    assert all(torch.equal(a, b) for a, b in zip(grads, base_grads))
    n = len(planned["tensors"])
    assert (hooks.offloaded, hooks.prefetched, hooks.late) == (3 * n, 3 * n, 0)
    # the user's own saved-tensor hooks around the step, and a checkpointed sibling block, change nothing
    outer, outer_grads, _ = _train(planned["tensors"], outer=True)
    assert outer == base_losses and all(torch.equal(a, b) for a, b in zip(outer_grads, base_grads))
    owners = {t.module for t in planned["tensors"]}
    # a block that holds a prefetch point and no planned tensor, when there is one
    holding = {".".join(t.prefetch_at.split(".")[:2]) for t in planned["tensors"]
               if t.prefetch_at.startswith("layers.")} - owners
    sibling = min(holding) if holding else next(f"layers.{i}" for i in range(4) if f"layers.{i}" not in owners)
    mixed, mixed_grads, mixed_hooks = _train(planned["tensors"], checkpoint={sibling: "full"})
    assert mixed == pytest.approx(base_losses, rel=1e-6)
    # a prefetch point inside the checkpointed block still fires at its backward (found through the wrapper)
    assert (mixed_hooks.prefetched, mixed_hooks.late) == (3 * n, 0)
    for a, b in zip(mixed_grads, base_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_prefetch_point_that_comes_too_late_falls_back_to_a_copy_at_the_use(planned):
    import torch
    # prefetched at the first block's backward, which runs after every later block's: each copy of a tensor of
    # a later block is made at its use instead
    late = tuple(dataclasses.replace(t, module="layers.3", prefetch_at="layers.0") for t in planned["tensors"])
    base_losses, base_grads, _ = _train(steps=1)
    losses, grads, hooks = _train(late, steps=1)
    assert losses == base_losses and all(torch.equal(a, b) for a, b in zip(grads, base_grads))
    assert hooks.offloaded == hooks.late == len(late) and hooks.prefetched == 0


def test_the_snippet_runs_and_trains_the_same(planned):
    from memlens.advice import Plan
    plan = Plan(checkpoint=planned["checkpoint"], offload=planned["tensors"])
    assert "offload.install(model)" in plan.snippet
    assert _train(planned["tensors"])[0] == _train(snippet=plan.snippet)[0] == _train()[0]
    assert plan.changes.startswith(f"offload {len(plan.offload)} planned saved activations "
                                   f"({sum(t.size for t in plan.offload):,} bytes) of layers.")


def test_the_save_is_named_by_module_and_order_and_remove_restores_the_module():
    import torch
    import torch.nn as nn

    from memlens.advice.offload import OffloadTensor, install
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    # Tanh's forward saves one tensor, its (2, 4) output; a wrong shape or a later index matches nothing
    hooks = install(model, [OffloadTensor("1", 0, (2, 4), "torch.float32", 32),
                            OffloadTensor("1", 1, (2, 4), "torch.float32", 32)])
    x = torch.randn(2, 4)
    model(x).sum().backward()
    lone = nn.Sequential(nn.Tanh())
    other = install(lone, [OffloadTensor("0", 0, (4, 2), "torch.float32", 32)])
    lone(x.requires_grad_()).sum().backward()
    assert other.offloaded == 0
    assert (hooks.offloaded, hooks.prefetched, hooks.late) == (1, 1, 0)      # back at the model's output
    want = model[0].weight.grad.clone()
    hooks.remove()
    model.zero_grad()
    model(x).sum().backward()
    assert hooks.offloaded == 1 and "forward" not in model[1].__dict__ and not hasattr(model[1], "_memlens_offload")
    assert torch.equal(model[0].weight.grad, want)


def test_an_offload_module_without_planned_tensors_or_inside_a_checkpoint_is_refused():
    import torch.nn as nn

    from memlens.advice import CannotWrap, Plan
    from memlens.advice.offload import OffloadTensor
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(CannotWrap, match="'0' is to be offloaded but the plan names none"):
        Plan(checkpoint={"0": "offload"}).apply(model)
    t = OffloadTensor("0.0", 0, (1, 2), "torch.float32", 8)
    with pytest.raises(CannotWrap, match="'0.0' is offloaded and '0' checkpointed"):
        Plan(checkpoint={"0": "full", "0.0": "offload"}, offload=(t,)).apply(model)
    with pytest.raises(CannotWrap, match="'0.7' is not in the model"):
        Plan(checkpoint={"0.7": "offload"}, offload=(dataclasses.replace(t, module="0.7"),)).apply(model)


# ---- a recording of the hooked steps -----------------------------------------------------------------------
def test_a_recording_shows_each_planned_block_leave_after_its_last_use_and_return_before_its_use(planned):
    import torch

    import memlens
    from memlens.advice.offload import install
    ns: dict = {}
    exec(NET, ns)
    torch.manual_seed(0)
    model = ns["Net"]()
    install(model, planned["tensors"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with memlens.record(model) as rec:
        for _ in range(3):
            model(torch.randn(8, 256, 256)).backward()
            opt.step()
            opt.zero_grad()
            memlens.step()
    trace = rec.trace
    ops, blocks, acc = trace.ops, trace.blocks, trace.accesses
    root = ops.loc[ops["module"].str.endswith(".layers.0.ln"), "module"].iloc[0][:-len(".layers.0.ln")]
    acc = acc.merge(ops[["op_id", "name", "start_ns", "end_ns", "module"]], on="op_id")

    def under(path):
        return (ops["module"] == path) | ops["module"].str.startswith(path + ".")

    for k in range(3):
        step_ops = ops[ops["iteration"] == k]
        fwd, bwd = step_ops[step_ops["phase"] == "forward"], step_ops[step_ops["phase"] == "backward"]
        for t in planned["tensors"]:
            owner = f"{root}.{t.module}"
            # leaving: the block its module's forward made is freed right after its last forward use
            made = blocks[(blocks["op"] == t.made_by) & (blocks["size"] == t.size)
                          & blocks["alloc_op_id"].isin(fwd.loc[under(owner), "op_id"])]
            assert len(made) == 1, (k, t)
            gone = made.iloc[0]
            uses = acc[acc["block_id"] == gone["block_id"]].sort_values("op_id")
            last = uses.iloc[-1]
            assert last["name"] == t.last_use and last["op_id"] in set(fwd["op_id"])
            after = fwd[fwd["op_id"] > last["op_id"]]["start_ns"]
            assert last["start_ns"] <= gone["free_ns"] <= after.iloc[1], (k, t)   # not held until backward
            # returning: a block of its size allocated at the planned module's backward start, before its use
            point = f"{root}.{t.prefetch_at}" if t.prefetch_at else root
            copies = bwd["name"].isin(["aten::_to_copy", "aten::copy_", "aten::empty", "aten::empty_strided"])
            starts_at = int(bwd.loc[under(point).reindex(bwd.index) & ~copies, "start_ns"].min())
            before = bwd.loc[(bwd["start_ns"] < starts_at) & ~copies, "start_ns"]
            window_from = int(before.max()) if len(before) else int(step_ops["start_ns"].min())
            back = blocks[(blocks["size"] == t.size) & (blocks["alloc_ns"] >= window_from)
                          & (blocks["alloc_ns"] <= starts_at)]
            use = None
            for b in back.itertuples():
                reads = acc[(acc["block_id"] == b.block_id) & ~acc["is_write"]].sort_values("op_id")
                if len(reads) and reads.iloc[0]["name"] == t.first_use:
                    use = reads.iloc[0]
                    break
            assert use is not None, (k, t)
            assert b.alloc_ns < use["start_ns"] and use["module"].startswith(owner)
