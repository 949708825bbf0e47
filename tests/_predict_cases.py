"""Shared by the predict tests: the child process every prediction runs in, and the training steps (as
source for that child) that several test files predict.

Each prediction runs in a child process that imports memlens before torch (the fake-CUDA shim must be in
place before torch initialises); the test process's own torch was imported long before.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def built_shim():
    """Build the fake-CUDA shim once (a child process: building must not initialise torch here)."""
    proc = subprocess.run([sys.executable, "-c", "import memlens.prediction.shim as s; print(s.build())"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]


def run_child(body: str, timeout: int = 900, env: dict | None = None) -> dict:
    """Run `body` after ``import memlens; import torch`` in a fresh interpreter; it must set `result`."""
    code = "import json, sys\nsys.path.insert(0, %r)\nimport memlens\nimport torch\n" % str(ROOT)
    code += textwrap.dedent(body) + "\nprint('RESULT=' + json.dumps(result))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT=")]
    assert lines, f"child failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT="):])


# An MLP whose first dimensions do not divide by 4 (510 and 7 rows): FSDP2 pads shards to ceil(dim0 / N) rows.
# fsdp_mlp_step() runs one AdamW step of it under FSDP2 (one fully_shard per Linear, then the root) and returns
# the model and optimizer (a caller that keeps them holds the rank's state after the step).
FSDP_MLP = """
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
def fsdp_mlp_step():
    model = nn.Sequential(nn.Linear(1000, 510), nn.ReLU(), nn.Linear(510, 7)).cuda()
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(16, 1000, device="cuda")).sum().backward()
    opt.step()
    return model, opt
"""


def pipeline_step(d: int, h: int, m: int, n: int) -> str:
    """Source of `step(schedule, static=True)`: one pipeline stage per rank, each Linear(d, h, bias=False) ->
    ReLU -> Linear(h, d, bias=False), run by a torch.distributed.pipelining schedule class over n microbatches
    of m rows (fp32); static: the stage is given one microbatch's shapes. The schedule is kept in `keep`."""
    return f"""
import torch
import torch.nn as nn
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, Schedule1F1B
D, H, M, N = {d}, {h}, {m}, {n}
keep = []
def step(schedule, static=True):
    rank, world = dist.get_rank(), dist.get_world_size()
    mod = nn.Sequential(nn.Linear(D, H, bias=False), nn.ReLU(), nn.Linear(H, D, bias=False)).cuda()
    # one microbatch's shapes (meta: no memory); a stage after the first receives an activation that needs
    # its gradient, as the previous stage's output does
    example = torch.empty(M, D, device="meta")
    shapes = dict(input_args=(example.clone().requires_grad_(rank > 0),),
                  output_args=(example.clone().requires_grad_(),)) if static else {{}}
    stage = PipelineStage(mod, rank, world, torch.device("cuda"), **shapes)
    sched = schedule(stage, n_microbatches=N, loss_fn=lambda out, target: out.sum())
    if rank == 0:
        sched.step(torch.randn(N * M, D, device="cuda"))
    elif rank == world - 1:
        sched.step(target=torch.randn(N * M, D, device="cuda"))
    else:
        sched.step()
    keep.append(sched)
"""


def interleaved_step(schedule: str) -> str:
    """Source of `step_interleaved()`, to follow pipeline_step's: 2 stages per rank (rank r runs stages r and
    r + world, of the same module as pipeline_step's), run by the interleaved schedule class `schedule`."""
    return f"""
from torch.distributed.pipelining import {schedule}
def step_interleaved():
    rank, world = dist.get_rank(), dist.get_world_size()
    stages = []
    for idx in (rank, rank + world):
        mod = nn.Sequential(nn.Linear(D, H, bias=False), nn.ReLU(), nn.Linear(H, D, bias=False)).cuda()
        example = torch.empty(M, D, device="meta")
        stages.append(PipelineStage(mod, idx, 2 * world, torch.device("cuda"),
                                    input_args=(example.clone().requires_grad_(idx > 0),),
                                    output_args=(example.clone().requires_grad_(),)))
    sched = {schedule}(stages, n_microbatches=N, loss_fn=lambda out, target: out.sum())
    if rank == 0:
        sched.step(torch.randn(N * M, D, device="cuda"))
    else:
        sched.step(target=torch.randn(N * M, D, device="cuda"))
    keep.append(sched)
"""


# The training lines of a user's script for the `memlens predict` CLI tests (torch and fully_shard imported, the
# process group made, before them): two Linears (256 -> 512 -> 256) under FSDP2, one fully_shard each and then
# the root, and one AdamW step on a batch of 32 rows.
FSDP_SCRIPT_STEP = """model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)).cuda()
for m in model:
    fully_shard(m)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(32, 256, device="cuda")).sum().backward()
opt.step()
"""
