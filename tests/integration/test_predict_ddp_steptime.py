"""DDP's bucket all-reduces on the modeled clock (memlens.prediction.distributed.steptime + ddp): each bucket
issued when its last gradient is in, serialized on the all-reduce stream, the first op after backward waits for
all; values by hand (ring all-reduce 2 (N-1)/N x bytes / (0.8 x 450 GB/s) + 2 (N-1) x 1 us on 4 H100s)."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from memlens.devicetime.gpus import gpu
from memlens.prediction.distributed.ddp import all_reduce_rounds
from memlens.prediction.distributed.steptime import step_time

H100 = gpu("H100")
NVL = 0.8 * 450e9


def ring_all_reduce_ns(nbytes, n=4):
    return 2 * (n - 1) / n * nbytes / NVL * 1e9 + 2 * (n - 1) * 1_000


class FakeTrace:
    def __init__(self, ops, record):
        self.ops = ops
        self.accesses = pd.DataFrame({"block_id": [], "t_ns": [], "op_id": [], "is_write": []})
        self.metadata = {"prediction": {"ddp": [record]}}


def backward_then_step():
    """forward mm 100 us; grad of layer 2 (50 us) and its copy into the bucket (1 us); grad of layer 1 (200 us)
    and its copy (1 us); the optimizer (10 us). Op counts: layer 2's gradient is in its bucket after op 2
    (count 3), layer 1's after op 4 (count 5), which is also the end of backward."""
    durs = [100_000, 50_000, 1_000, 200_000, 1_000, 10_000]
    starts = [sum(durs[:i]) for i in range(len(durs))]
    return pd.DataFrame({"op_id": range(6), "name": ["aten::mm", "aten::mm", "aten::copy_", "aten::mm",
                                                     "aten::copy_", "aten::_foreach_add_"],
                         "start_ns": starts, "end_ns": [s + d for s, d in zip(starts, durs)],
                         "bytes_read": [0] * 6, "bytes_written": [0] * 6})


def record(layer1_bytes, layer2_bytes):
    # parameters in module order: layer 1, layer 2; the Reducer's bucket 0 holds the last layer
    return {"param_bytes": [layer1_bytes, layer2_bytes], "buckets": [[1], [0]], "rebuilds": False,
            "rebuilt_buckets": None, "rounds": [{"ready": [[1, 3], [0, 5]], "end": 5}]}


def test_buckets_overlap_backward_and_the_optimizer_waits_for_the_last():
    t = step_time(FakeTrace(backward_then_step(), record(36_000_000, 4_000_000)), 4, H100)
    ar = t["ddp_all_reduces"]
    # bucket 0 (4 MB) ready at the end of op 2 = 151_000: ring 2 x 3/4 x 4 MB / 360 GB/s + 6 us = 22_666.7 ns
    # (tree: 2 x 4 MB / 360 GB/s + 4 us = 26_222 ns, slower)
    assert ring_all_reduce_ns(4e6) == pytest.approx(22_666.67, abs=0.01)
    assert (ar[0]["bytes"], ar[0]["start_ns"], ar[0]["end_ns"], ar[0]["algorithm"]) == (4_000_000, 151_000,
                                                                                         173_667, "ring")
    # bucket 1 (36 MB) ready at the end of op 4 = 352_000: 150 us + 6 us
    assert (ar[1]["start_ns"], ar[1]["end_ns"]) == (352_000, 508_000)
    # the optimizer (first op after backward) waits 156 us: step 518_000, compute 362_000, exposed 156_000
    assert t["schedule"].set_index("op_id").loc[5, "wait_ns"] == 156_000
    assert (t["step_ns"], t["compute_ns"], t["exposed_comm_ns"]) == (518_000, 362_000, 156_000)
    assert t["comm_ns"] == (173_667 - 151_000) + 156_000 and t["collectives"] == 2 and t["note"] == ""


def test_buckets_are_serialized_on_the_all_reduce_stream():
    t = step_time(FakeTrace(backward_then_step(), record(36_000_000, 72_000_000)), 4, H100)
    ar = t["ddp_all_reduces"]
    # bucket 0 (72 MB): 151_000 .. 151_000 + 300 us + 6 us = 457_000, still running when bucket 1 is ready at
    # 352_000, so bucket 1 starts at 457_000 and ends 613_000; the optimizer waits 613_000 - 352_000
    assert (ar[0]["end_ns"], ar[1]["issue_ns"], ar[1]["start_ns"], ar[1]["end_ns"]) == (457_000, 352_000,
                                                                                          457_000, 613_000)
    assert (t["step_ns"], t["exposed_comm_ns"]) == (623_000, 261_000)


def test_communication_past_the_last_op_is_exposed_without_an_optimizer_step():
    ops = backward_then_step().iloc[:5]
    t = step_time(FakeTrace(ops, record(36_000_000, 4_000_000)), 4, H100)
    # no op after backward: the step ends with the last bucket, 508_000; compute 352_000
    assert (t["step_ns"], t["compute_ns"], t["exposed_comm_ns"]) == (508_000, 352_000, 156_000)


def test_rounds_use_the_rebuilt_buckets_after_the_first_pass_and_unready_parameters_wait_for_the_end():
    rec = {"param_bytes": [400, 40, 4000, 4], "buckets": [[0, 1, 2, 3]], "rebuilds": True,
           "rebuilt_buckets": [[3, 2], [1, 0]],
           "rounds": [{"ready": [[3, 10], [2, 12], [1, 20], [0, 22]], "end": 22},
                      {"ready": [[3, 40], [2, 42], [0, 52]], "end": 55}]}
    assert all_reduce_rounds(rec) == [{"end": 22, "buckets": [(4444, 22)]},
                                      # parameter 1 had no gradient in pass 2: its bucket is ready at the end
                                      {"end": 55, "buckets": [(4004, 42), (440, 55)]}]


CHILD = r'''
import sys, json
sys.path.insert(0, %r)
import memlens, torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
def step():
    model = nn.Sequential(nn.Linear(1000, 1000), nn.ReLU(), nn.Linear(1000, 1000)).cuda()
    net = DDP(model)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        net(torch.randn(16, 1000, device="cuda")).sum().backward()
        opt.step()
d = memlens.predict(step, gpu="H100", world_size=4, ranks="first")
t = d.predictions[0].trace
st = d.step_time()[0]
tt = d.timed_trace(0)
names = t.ops.set_index("op_id")["name"]
ar = st["ddp_all_reduces"]
import os, tempfile
from memlens.prediction.distributed.steptime import step_time
with tempfile.TemporaryDirectory() as tmp:       # the record travels with a saved trace
    t.save(os.path.join(tmp, "rank0.memlens"))
    again = step_time(memlens.load(os.path.join(tmp, "rank0.memlens")), 4, "H100")["ddp_all_reduces"] == ar
print("RESULT=" + json.dumps({"record": t.metadata["prediction"]["ddp"], "ar": ar, "again": again,
      "before_ready": [names[a["ready_op"] - 1] for a in ar], "after_end": [names[a["backward_end_op"]] for a in ar],
      "comm_ns": st["comm_ns"], "step_ns": st["step_ns"], "compute_ns": st["compute_ns"],
      "exposed": st["exposed_comm_ns"], "tt_end": int(tt.ops.end_ns.max()),
      "tt_ddp": tt.metadata["prediction"]["step_time"]["ddp_all_reduces"] == ar}))
'''


def test_a_predicted_ddp_step_times_its_buckets_and_rebuilds_them_after_the_first_pass():
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", CHILD % str(root)], capture_output=True, text=True,
                          timeout=900, cwd=root)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT=")]
    assert lines, proc.stderr[-3000:]
    r = json.loads(lines[-1][7:])
    rec = r["record"][0]
    w, b = 4 * 1000 * 1000, 4 * 1000
    assert rec["param_bytes"] == [w, b, w, b]
    # torch 2.13 without find_unused_parameters: one bucket at construction; rebuilt after the first pass in
    # gradient-ready order (last bias, last weight, first bias, first weight) with limits 1 MiB then 25 MiB:
    # 4,004,000 B closes the first bucket, the rest (4,004,000 B < 25 MiB) is the second
    assert rec["buckets"] == [[0, 1, 2, 3]] and rec["rebuilt_buckets"] == [[3, 2], [1, 0]]
    assert [(a["pass"], a["bytes"]) for a in r["ar"]] == [(0, 2 * (w + b)), (1, w + b), (1, w + b)]
    # each bucket is ready after the copy of its last gradient into it; backward ends before the optimizer
    assert set(r["before_ready"]) == {"aten::copy_"} and set(r["after_end"]) == {"aten::lift_fresh"}
    # ring on 4 ranks for each (the tree is slower at these sizes), rounded to ns per all-reduce
    by_hand = sum(round(ring_all_reduce_ns(x)) for x in (2 * (w + b), w + b, w + b))
    assert abs(r["comm_ns"] - by_hand) <= 3
    assert r["step_ns"] == r["compute_ns"] + r["exposed"] and r["exposed"] > 0
    assert r["tt_ddp"] and r["again"]


NO_SYNC = r'''
import sys, json
sys.path.insert(0, %r)
import memlens, torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
def step():
    model = nn.Sequential(nn.Linear(1000, 1000), nn.ReLU(), nn.Linear(1000, 1000)).cuda()
    net = DDP(model)
    opt = torch.optim.AdamW(model.parameters())
    with net.no_sync():            # gradient accumulation: this backward pass all-reduces nothing
        net(torch.randn(16, 1000, device="cuda")).sum().backward()
    net(torch.randn(16, 1000, device="cuda")).sum().backward()
    opt.step()
d = memlens.predict(step, gpu="H100", world_size=4, ranks="first")
print("RESULT=" + json.dumps([(a["pass"], a["bytes"]) for a in d.step_time()[0]["ddp_all_reduces"]]))
'''


def test_gradient_accumulation_under_no_sync_all_reduces_once():
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", NO_SYNC % str(root)], capture_output=True, text=True,
                          timeout=900, cwd=root)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT=")]
    assert lines, proc.stderr[-3000:]
    # one synchronised backward pass: the construction bucket (every parameter, 2 x (4,000,000 + 4,000) B) once
    assert json.loads(lines[-1][7:]) == [[0, 2 * (4_000_000 + 4_000)]]
