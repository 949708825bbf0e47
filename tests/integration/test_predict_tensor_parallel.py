"""Tensor parallelism (DTensor) under `memlens.predict(world_size=N)`: what DTensor's dispatch runs on the local
tensors is recorded op by op, so the redistributions of inputs (all-gathers, reduce-scatters, all-reduces,
all-to-alls) appear as the temporaries a real run allocates, at local sizes computed by hand here."""
from __future__ import annotations

import pytest

from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)

F32 = 4
WORKSPACE = 32 * 1024 * 1024       # cuBLAS workspace torch allocates on Hopper for the first matmul (32 MiB)


@pytest.mark.parametrize("world", [2, 4])
def test_redistribution_inside_dispatch_allocates_the_all_to_all_buffers(world):
    # torch.mm(Shard(0), Shard(0)): DTensor's strategy moves `a` to Shard(1) inside the op's dispatch
    # (`_dtensor::shard_dim_alltoall`), neither an input nor an output of mm; a DTensor-level recorder misses it
    r = run_child(f"""
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
W = {world}
def step():
    mesh = init_device_mesh("cuda", (W,))
    a = DTensor.from_local(torch.randn(64 // W, 128, device="cuda"), mesh, [Shard(0)], run_check=False)
    b = DTensor.from_local(torch.randn(128 // W, 256, device="cuda"), mesh, [Shard(0)], run_check=False)
    c = torch.mm(a, b)
d = memlens.predict(step, gpu="H100", world_size=W, ranks="first")
p = d.predictions[0]
b = p.trace.blocks
b = b[(b.device == "cuda:0") & (b.op != "cublas_workspace (modelled)")].sort_values("alloc_seq")
result = {{"errors": d.errors, "peak": p.peak_allocated,
          "blocks": [[int(s), o, int(a), int(f)] for s, o, a, f in
                     zip(b.requested_size, b.op, b.alloc_seq, b.free_seq)]}}
""")
    assert r["errors"] == {}
    a_local, b_local, out = 64 // world * 128 * F32, 128 // world * 256 * F32, 64 * 256 * F32
    blocks = r["blocks"]
    assert [(s, o) for s, o, _, _ in blocks] == [
        (a_local, "aten::randn"), (b_local, "aten::randn"),
        (a_local, "aten::clone"),        # a's W shards made contiguous along dim 0 (movedim + contiguous)
        (a_local, "aten::empty_like"),   # the all-to-all receive buffer: a as Shard(1), mm's real input
        (out, "aten::mm")]               # the local product [64, 256], Partial
    contiguous, received, product = blocks[2], blocks[3], blocks[4]
    assert contiguous[3] < product[2] < received[3]    # the send copy dies inside the redistribution
    assert r["peak"] == a_local + b_local + a_local + out + WORKSPACE


SP_MLP = """
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module
W = {world}
def step():
    mesh = init_device_mesh("cuda", (W,))
    model = nn.Sequential(nn.LayerNorm(256), nn.Linear(256, 1024, bias=False), nn.ReLU(),
                          nn.Linear(1024, 256, bias=False)).cuda()
    parallelize_module(model, mesh, {{"0": SequenceParallel(), "1": ColwiseParallel(input_layouts=Shard(1)),
                                     "3": RowwiseParallel(output_layouts=Shard(1))}})
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64, 256, device="cuda")).sum().backward()      # this rank's 64 positions
    opt.step()
d = memlens.predict(step, gpu="H100", world_size=W, ranks="first")
b = d.predictions[0].trace.blocks
b = b[b.device == "cuda:0"].sort_values("alloc_seq")
def made_by(op):
    s = b[b.op == op]
    return [[int(x), int(a), int(f)] for x, a, f in zip(s.requested_size, s.alloc_seq, s.free_seq)]
result = {{"errors": d.errors, **{{op: made_by(op) for op in (
    "_c10d_functional::all_gather_into_tensor", "_c10d_functional::reduce_scatter_tensor",
    "_c10d_functional::all_reduce", "_c10d_functional::wait_tensor", "aten::mm", "aten::cat")}}}}
"""


@pytest.mark.parametrize("world", [2, 4])
def test_sequence_parallel_mlp_collective_buffers_are_local_times_world(world):
    r = run_child(SP_MLP.format(world=world))
    assert r["errors"] == {}
    local = 2 * 64 * 256 * F32          # this rank's [2, 64, 256] slice of the sequence
    full = world * local                # the whole sequence, [2, 64 W, 256]
    gathered = r["_c10d_functional::all_gather_into_tensor"]
    # forward: the LayerNorm output gathered for the column-parallel Linear; backward: the gradient of the
    # row-parallel output gathered back to the whole sequence
    assert [s for s, _, _ in gathered] == [full, full]
    # forward: the row-parallel Linear's partial sums scattered to this rank's slice; backward: the gradient
    # of the column-parallel input, likewise
    assert [s for s, _, _ in r["_c10d_functional::reduce_scatter_tensor"]] == [local, local]
    assert r["_c10d_functional::wait_tensor"] == []      # waiting returns the collective's own output
    # each gathered buffer lives until its reordering copy (`cat` along the sequence dim) is made, no longer
    cats = r["aten::cat"]
    for size, alloc, free in gathered:
        cat = next(c for c in cats if c[1] > alloc)
        assert cat[0] == full and free < next(m[1] for m in r["aten::mm"] if m[1] > cat[1])
    # the local matmuls: [2 x 64 W, 1024 / W] and [2 x 64 W, 256] (the partial sums), then backward's
    mm = [s for s, _, _ in r["aten::mm"]]
    assert mm[:2] == [2 * 64 * world * 1024 // world * F32, full]
    # LayerNorm's weight and bias gradients are partial sums on each rank (sequence-sharded input); AdamW's
    # foreach ops on the replicated parameters all-reduce them inside DTensor's dispatch: [256] each
    reduced = [s for s, _, _ in r["_c10d_functional::all_reduce"]]
    assert reduced and set(reduced) == {256 * F32} and len(reduced) % 2 == 0
