"""memlens.predict(world_size=N): sharded training per rank under torch's fake process group, checked against
sharding arithmetic done by hand here.

Each prediction runs in a child process that imports memlens before torch (the fake-CUDA shim must be in
place before torch initialises): tests/_predict_cases.py.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from _predict_cases import FSDP_MLP, FSDP_SCRIPT_STEP, ROOT, built_shim, run_child  # noqa: F401  (the shim fixture)

# FSDP_MLP's MLP (tests/_predict_cases.py): its first dimensions do not divide by 4 (510 and 7 rows), and FSDP2
# pads shards to ceil(dim0 / N) rows.
SHAPES = [(510, 1000), (510,), (7, 510), (7,)]       # Linear(1000, 510) weight, bias; Linear(510, 7) weight, bias
GROUPS = [[0, 1], [2, 3]]                            # one fully_shard per Linear: one reduce-scatter per group

FSDP_STEP = FSDP_MLP + """
keep = []
def step():
    keep.append(fsdp_mlp_step())      # alive after the step: what is left is what a rank holds between steps
def held(p, category):
    b = p.trace.blocks
    b = b[(b.device == "cuda:0") & (b.category == category) & b.free_ns.isna()]
    return sorted(b.requested_size.tolist())
"""


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_shards_equal_the_sharding_arithmetic(world):
    r = run_child(FSDP_STEP + f"""
d = memlens.predict(step, gpu="H100", world_size={world}, ranks="all")
result = {{"errors": d.errors, "strategies": sorted(d.strategies), "ranks": {{
    str(k): {{c: held(p, c) for c in ("parameter", "gradient", "optimizer_state")}} for k, p in d.predictions.items()}},
    "table": [[x.rank, x.ran, x.stands_for, x.fits] for x in d.results]}}
""")
    assert r["errors"] == {} and r["strategies"] == ["fsdp2"]
    assert r["table"] == [[k, True, k, True] for k in range(world)]
    for rank in range(world):
        rows_padded = [math.ceil(s[0] / world) for s in SHAPES]
        rest = [math.prod(s[1:]) for s in SHAPES]
        # parameters: FSDP2's padded shard, ceil(dim0 / N) rows on every rank, fp32
        padded = [4 * n * m for n, m in zip(rows_padded, rest)]
        # gradients: one reduce-scatter output per fully_shard group, the group's padded shards side by side
        grads = [sum(padded[i] for i in g) for g in GROUPS]
        # AdamW's exp_avg and exp_avg_sq: zeros_like of the local (unpadded) shard: this rank's real rows
        local_rows = [max(0, min(n, s[0] - rank * n)) for n, s in zip(rows_padded, SHAPES)]
        states = [4 * rows * m for rows, m in zip(local_rows, rest) if rows] * 2
        got = r["ranks"][str(rank)]
        assert got["parameter"] == sorted(padded), rank
        assert got["gradient"] == sorted(grads), rank
        assert got["optimizer_state"] == sorted(states), rank


def test_fsdp2_symmetric_ranks_run_once_and_uneven_ones_each():
    r = run_child(FSDP_STEP + """
def step_even():
    model = nn.Sequential(nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 8)).cuda()
    for m in model:
        fully_shard(m) if isinstance(m, nn.Linear) else None
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(16, 1024, device="cuda")).sum().backward()
    opt.step()
even = memlens.predict(step_even, gpu="H100", world_size=4)
uneven = memlens.predict(step, gpu="H100", world_size=4)
result = {"even": [[x.rank, x.ran, x.stands_for, x.peak_allocated] for x in even.results],
          "even_symmetry": even.symmetry, "uneven_ran": sorted(uneven.predictions),
          "uneven_symmetry": uneven.symmetry}
""")
    # 512 and 8 rows divide by 4: rank 0 and rank 3 allocate alike, rank 0 stands for ranks 1 and 2
    assert [row[:3] for row in r["even"]] == [[0, True, 0], [1, False, 0], [2, False, 0], [3, True, 3]]
    assert len({row[3] for row in r["even"]}) == 1
    assert r["even_symmetry"].startswith("symmetric")
    # 7 rows over 4 ranks: the last rank's optimizer state is smaller, so every rank runs
    assert r["uneven_ran"] == [0, 1, 2, 3] and r["uneven_symmetry"].startswith("asymmetric")


def test_world_size_one_is_exactly_the_single_gpu_prediction():
    r = run_child("""
import torch.nn as nn
def step():
    model = nn.Sequential(nn.Linear(1000, 510), nn.ReLU(), nn.Linear(510, 7)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(16, 1000, device="cuda")).sum().backward()
    opt.step()
one = memlens.predict(step, gpu="H100")
world = memlens.predict(step, gpu="H100", world_size=1)
w = world.predictions[0]
sizes = lambda p: p.trace.blocks[p.trace.blocks.device == "cuda:0"].requested_size.tolist()
result = {"one": [one.peak_allocated, one.peak_reserved, one.device_bytes_needed, one.fits()],
          "world": [w.peak_allocated, w.peak_reserved, w.device_bytes_needed, w.fits()],
          "rows": [[x.peak_allocated, x.peak_reserved, x.device_bytes_needed, x.fits] for x in world.results],
          "same_blocks": sizes(one) == sizes(w), "nccl": world.nccl["bytes"]}
""")
    assert r["world"] == r["one"] and r["rows"] == [r["one"]]
    assert r["same_blocks"] and r["nccl"] == 0


def test_ddp_rank_holds_a_full_replica_plus_its_buckets():
    r = run_child("""
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
def step(wrap, **kw):
    model = nn.Sequential(nn.Linear(1000, 510), nn.ReLU(), nn.Linear(510, 7)).cuda()
    net = DDP(model, **kw) if wrap else model
    opt = torch.optim.AdamW(model.parameters())
    net(torch.randn(16, 1000, device="cuda")).sum().backward()
    opt.step()
plain = memlens.predict(lambda: step(False), gpu="H100", world_size=2)
default = memlens.predict(lambda: step(True), gpu="H100", world_size=2)
capped = memlens.predict(lambda: step(True, bucket_cap_mb=1, find_unused_parameters=True), gpu="H100", world_size=2)
def buckets(d):
    b = d.predictions[0].trace.blocks
    return b[(b.device == "cuda:0") & (b.op == "aten::zeros")]["requested_size"].tolist()
def held(d, c):
    b = d.predictions[0].trace.blocks
    return int(b[(b.device == "cuda:0") & (b.category == c)].requested_size.sum())
result = {"peaks": [d.peak_allocated for d in (plain, default, capped)], "buckets": [buckets(default), buckets(capped)],
          "params": held(default, "parameter"), "grads": held(default, "gradient"), "strategies": sorted(default.strategies),
          "symmetry": default.symmetry}
""")
    param_bytes = 4 * (510 * 1000 + 510 + 7 * 510 + 7)
    # every rank: the full replica's parameters and gradients
    assert r["params"] == param_bytes and r["grads"] == param_bytes
    # torch 2.13 DDP without find_unused_parameters: one bucket holds every parameter until the rebuild
    assert r["buckets"][0] == [param_bytes]
    # bucket_cap_mb=1 with find_unused_parameters: the 2,040,000-byte weight closes the first bucket (>= 1 MiB),
    # the rest share the second; the Reducer takes them in reverse (the last layer's first) and allocates so
    assert r["buckets"][1] == [4 * (510 + 7 * 510 + 7), 4 * 510 * 1000]
    # the buckets live from construction on: the peak moves up by exactly their allocator-rounded bytes
    rounded = [512 * math.ceil(b / 512) for b in r["buckets"][1]]
    assert r["peaks"][2] - r["peaks"][0] == sum(rounded)
    assert r["peaks"][1] - r["peaks"][0] == 512 * math.ceil(param_bytes / 512)
    assert r["strategies"] == ["ddp"] and r["symmetry"].startswith("symmetric")


def test_nccl_allowance_is_stated_and_counted_against_capacity():
    r = run_child("""
import torch.nn as nn
def step():
    model = nn.Linear(512, 512).cuda()
    model(torch.randn(8, 512, device="cuda")).sum().backward()
d = memlens.predict(step, gpu="H100", world_size=8, ranks="first")
p = d.predictions[0]
result = {"nccl": d.nccl, "need": d.results[0].device_bytes_needed,
          "parts": p.peak_reserved + p.gpu.cuda_context, "stands": [x.stands_for for x in d.results],
          "symmetry": d.symmetry, "in_trace": p.trace.metadata["prediction"]["nccl_allowance"]}
""", env={"NCCL_BUFFSIZE": str(2 << 20)})
    assert r["in_trace"] == r["nccl"]          # stated in each rank's trace too
    # NCCL_BUFFSIZE (2 MiB from the environment) x 16 channels x 2 ring neighbours
    assert r["nccl"]["bytes"] == (2 << 20) * 16 * 2 and "NCCL_BUFFSIZE" in r["nccl"]["source"]
    assert r["need"] == r["parts"] + r["nccl"]["bytes"]
    assert r["stands"] == [0] * 8 and "not checked" in r["symmetry"]


def test_a_failing_rank_gives_no_verdict():
    r = run_child("""
def step():
    x = torch.empty(10, device="cuda")
    raise ValueError("boom")
d = memlens.predict(step, gpu="H100", world_size=2)
result = {"fits": d.fits(), "errors": d.errors, "row": [d.results[0].fits, d.results[0].error]}
""")
    assert r["fits"] is None and "boom" in r["errors"]["0"]
    assert r["row"] == [None, "ValueError: boom"]


def test_cli_world_size_prints_a_rank_table_and_checks_the_strategy(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    """) + FSDP_SCRIPT_STEP + "dist.destroy_process_group()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "memlens", "predict", "--gpu", "H100", *args, "--", "python",
                               str(script)], capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    proc = cli("--world-size", "4", "--strategy", "fsdp2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    rows = [line.split() for line in lines if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]
    assert rows[1][1:4] == ["=", "rank", "0"] and rows[0][1] == "ran"
    assert any("NCCL" in line for line in lines) and any("symmetric" in line for line in lines)
    js = cli("--world-size", "2", "--json")
    s = json.loads(js.stdout[js.stdout.index("{"):])
    # two shards of (512 x 256 + 512) and (256 x 512 + 256) fp32 parameters per rank
    shard_bytes = 4 * (256 * 256 + 256) + 4 * (128 * 512 + 128)
    assert s["strategies"] == ["fsdp2"] and len(s["ranks"]) == 2
    assert all(rank["peak_allocated"] >= 4 * shard_bytes for rank in s["ranks"])   # params, grads, 2 states
    wrong = cli("--world-size", "2", "--strategy", "ddp")
    assert wrong.returncode != 0 and "fsdp2" in (wrong.stdout + wrong.stderr)


def test_zero_redundancy_optimizer_keeps_state_for_its_own_partition():
    r = run_child("""
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
keep = []
def step():
    model = nn.Sequential(nn.Linear(1000, 510), nn.ReLU(), nn.Linear(510, 7)).cuda()
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW)
    model(torch.randn(16, 1000, device="cuda")).sum().backward()
    opt.step()
    keep.append((model, opt))
d = memlens.predict(step, gpu="H100", world_size=2, ranks="all")
def held(p, c):
    b = p.trace.blocks
    return sorted(b[(b.device == "cuda:0") & (b.category == c) & b.free_ns.isna()].requested_size.tolist())
result = {"errors": d.errors, "strategies": sorted(d.strategies),
          "state": {str(k): held(p, "optimizer_state") for k, p in d.predictions.items()},
          "params": {str(k): held(p, "parameter") for k, p in d.predictions.items()}}
""")
    sizes = [4 * 510 * 1000, 4 * 510, 4 * 7 * 510, 4 * 7]
    # ZeRO's partition by hand: largest first, each to the rank holding the fewest bytes so far
    totals, owner = [0, 0], {}
    for i in sorted(range(4), key=lambda i: -sizes[i]):
        rank = totals.index(min(totals))
        owner[i] = rank
        totals[rank] += sizes[i]
    assert r["errors"] == {} and r["strategies"] == ["zero"]
    for rank in (0, 1):
        mine = [sizes[i] for i in range(4) if owner[i] == rank]
        assert r["state"][str(rank)] == sorted(mine * 2)          # exp_avg, exp_avg_sq of its own parameters
        assert r["params"][str(rank)] == sorted(sizes)            # every rank keeps the full replica


def test_fsdp2_collective_buffers_are_allocated_on_their_own_streams():
    r = run_child(FSDP_STEP + """
d = memlens.predict(step, gpu="H100", world_size=2, ranks="first")
b = d.predictions[0].trace.blocks
b = b[b.device == "cuda:0"]
side = b[b.stream != 0]
result = {"streams": int(side.stream.nunique()),
          "per_stream": sorted(sorted(set(g.requested_size.tolist())) for _, g in side.groupby("stream"))}
""")
    # a group's padded shard: Linear(1000, 510) 255 rows x (1000 + 1) fp32 values; Linear(510, 7) 4 rows x 511
    shard0, shard1 = 4 * 255 * 1001, 4 * 4 * 511
    # FSDP2's code: all-gather outputs (2 ranks x the shard) are made on the all-gather copy-in stream,
    # reduce-scatter outputs (one shard; the sharded gradients are views of it) on the reduce-scatter
    # stream; reduce-scatter inputs are made on the default stream before it switches
    assert r["streams"] == 2
    assert r["per_stream"] == [sorted([shard0, shard1]), sorted([2 * shard0, 2 * shard1])]


def test_max_batch_per_rank_with_world_size_one_matches_the_single_gpu_search():
    r = run_child("""
import torch.nn as nn
def stepper(n):
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    model(torch.randn(n, 1024, device="cuda")).pow(2).mean().backward(); opt.step()
cap = memlens.predict(lambda: stepper(3000), gpu="H100").device_bytes_needed
one = memlens.max_batch(stepper, capacity=cap, gpu="H100", low=1024)
world = memlens.max_batch(stepper, capacity=cap, gpu="H100", low=1024, world_size=1)
result = {"one": [one["max"], sorted(one["tried"].items())], "world": [world["max"], sorted(world["tried"].items())]}
""")
    # the same sizes tried, the same bytes needed for each, the same answer (3000 needs exactly `cap`)
    assert r["world"] == r["one"] and r["one"][0] >= 3000


def test_tensor_parallel_plan_shards_parameters_and_gradients():
    r = run_child("""
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh       # imported before the prediction, by name
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
keep = []
def step():
    mesh = init_device_mesh("cuda", (4,))
    model = nn.Sequential(nn.Linear(1024, 4096, bias=False), nn.ReLU(), nn.Linear(4096, 1024, bias=False)).cuda()
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(16, 1024, device="cuda")).sum().backward()
    opt.step()
    keep.append((model, opt))
d = memlens.predict(step, gpu="H100", world_size=4, ranks="first")
b = d.predictions[0].trace.blocks
b = b[(b.device == "cuda:0") & b.free_ns.isna()]
result = {"errors": d.errors, **{c: sorted(b[b.category == c].requested_size.tolist())
                                 for c in ("parameter", "gradient", "optimizer_state")}}
""")
    quarter = 4 * 1024 * 4096 // 4        # each weight split four ways (by columns, then by rows)
    assert r["errors"] == {}
    assert r["parameter"] == [quarter, quarter] and r["gradient"] == [quarter, quarter]
    assert r["optimizer_state"] == [quarter] * 4


@pytest.mark.parametrize("dp, tp", [(2, 2), (4, 2)])
def test_tensor_parallel_inside_fsdp2_on_a_2d_mesh_shards_and_initialises_by_both(dp, tp):
    r = run_child(f"""
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.distributed.fsdp import fully_shard
keep, offsets = [], []
def step():
    mesh = init_device_mesh("cuda", ({dp}, {tp}), mesh_dim_names=("dp", "tp"))
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    parallelize_module(model, mesh["tp"], {{"0": ColwiseParallel(), "2": RowwiseParallel()}})
    fully_shard(model, mesh=mesh["dp"])
    model.to_empty(device="cuda")
    for linear in (model[0], model[2]):     # random init of parameters sharded on both mesh dimensions
        nn.init.normal_(linear.weight, std=0.02)
        nn.init.uniform_(linear.bias)
    offsets.append(int.from_bytes(bytes(torch.cuda.get_rng_state().tolist())[8:], "little"))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    opt.step()
    keep.append((model, opt))
def held(p, category):
    b = p.trace.blocks
    b = b[(b.device == "cuda:0") & (b.category == category) & b.free_ns.isna()]
    return sorted(b.requested_size.tolist())
d = memlens.predict(step, gpu="H100", world_size={dp * tp}, ranks="all")
result = {{"errors": d.errors, "offsets": offsets, "ranks": {{str(k): {{c: held(p, c) for c in ("parameter", "gradient", "optimizer_state")}}
                                       for k, p in d.predictions.items()}}}}
""")
    assert r["errors"] == {}
    # TP first: Colwise splits Linear(64, 256)'s weight and bias by output rows, Rowwise Linear(256, 64)'s weight
    # by input columns (its bias stays whole); then FSDP2 splits each local tensor's rows into ceil(rows / dp)
    local_tp = [(256 // tp, 64), (256 // tp,), (64, 256 // tp), (64,)]
    shards = [4 * math.ceil(s[0] / dp) * math.prod(s[1:]) for s in local_tp]
    for rank in range(dp * tp):
        got = r["ranks"][str(rank)]
        assert got["parameter"] == sorted(shards), rank
        assert got["gradient"] == [sum(shards)], rank          # one fully_shard: one reduce-scatter output
        assert got["optimizer_state"] == sorted(shards * 2), rank
    # DTensor's Philox bookkeeping: every rank ends past every whole tensor's numbers (multiples of 4 here)
    assert r["offsets"] == [256 * 64 + 256 + 64 * 256 + 64] * (dp * tp)


def test_per_rank_oom_and_fit_follow_the_world_size():
    r = run_child(FSDP_STEP + """
def step():      # 8 layers: the sharded state (16 B per parameter / N) outweighs one layer's all-gather
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    for m in model:
        fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(16, 2048, device="cuda")).sum().backward()
    opt.step()
two = memlens.predict(step, gpu="H100", world_size=2, ranks="first")
four = memlens.predict(step, gpu="H100", world_size=4, ranks="first")
p2 = two.predictions[0]
floor_two = p2.peak_allocated + p2.gpu.cuda_context + two.nccl["bytes"]   # a rank of 2 cannot do with less
cap = four.device_bytes_needed          # enough for a rank of 4 (its peak reserved and the rest)
two_cap = memlens.predict(step, gpu="H100", world_size=2, ranks="first", capacity=cap)
four_cap = memlens.predict(step, gpu="H100", world_size=4, ranks="first", capacity=cap)
p = two_cap.predictions[0]
result = {"needs": [floor_two, cap], "fits": [two_cap.fits(), four_cap.fits()],
          "oom": two_cap.results[0].oom, "oom_op": p.oom.op if p.oom else None,
          "rows": [[x.rank, x.fits, x.oom is not None] for x in two_cap.results]}
""")
    # a rank of 2 holds twice the shards of a rank of 4: its allocated peak alone exceeds what a rank of 4 needs
    assert r["needs"][0] > r["needs"][1]
    assert r["fits"] == [False, True]
    assert r["oom"].startswith("OOM: ") and r["oom_op"] and r["oom_op"] in r["oom"]
    assert r["rows"] == [[0, False, True], [1, False, True]]


def test_cli_world_size_failed_script_prints_no_verdict(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import torch\nx = torch.empty(4, device='cuda')\nraise RuntimeError('bad step')\n")
    proc = subprocess.run([sys.executable, "-m", "memlens", "predict", "--world-size", "2", "--", "python",
                           str(script)], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1
    assert "bad step" in proc.stdout and "fits" not in proc.stdout
