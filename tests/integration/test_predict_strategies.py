"""memlens.predict_strategies: each strategy applied by memlens with torch's own APIs, its per-rank sharded
state checked against sharding arithmetic done by hand here (FSDP2 padded shards, DDP's full replica and bucket,
ZeroRedundancyOptimizer's greedy partition, ZeRO-2's flat padded buffer), each row's model states against the
ZeRO paper's formulas at 2, 8 and 64 ranks, and activation checkpointing's saving computed by hand.

Each prediction runs in a child process that imports memlens before torch (see tests/_predict_cases.py).
"""
from __future__ import annotations

import math

import pytest

from _predict_cases import FSDP_SCRIPT_STEP, built_shim, run_child  # noqa: F401  (the shim fixture)

WORLD = 4
IN, HID, BLOCKS = 63, 510, 3        # 510 and 63 rows do not divide by 4: FSDP2 pads to ceil(rows / 4)
# one block's parameters: Linear(63, 510) weight, bias; Linear(510, 63) weight, bias
BLOCK_SHAPES = [(HID, IN), (HID,), (IN, HID), (IN,)]
BATCH = 4096

MODEL = f"""
import torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear({IN}, {HID}), nn.ReLU(), nn.Linear({HID}, {IN}))
                                    for _ in range({BLOCKS}))
    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
def step(model, opt):
    model(torch.randn({BATCH}, {IN}, device="cuda")).sum().backward()
    opt.step()
def held(p):
    b = p.trace.blocks
    b = b[(b.device == "cuda:0") & b.free_ns.isna()]
    return {{c: sorted(g.requested_size.tolist()) for c, g in b.groupby("category")}}
"""


def fp32(shape) -> int:
    return 4 * math.prod(shape)


def test_strategy_table_matches_the_sharding_arithmetic():
    r = run_child(MODEL + f"""
df, preds = memlens.predict_strategies(Net, step, world_sizes=({WORLD},),
                                       strategies=("ddp", "fsdp2", "fsdp2+ac", "zero1", "zero2", "fsdp2+noreshard"),
                                       return_predictions=True)
result = {{"rows": df.to_dict("records"), "held": {{s: held(d.predictions[0]) for (s, w), d in preds.items()}}}}
""")
    rows = {row["strategy"]: row for row in r["rows"]}
    assert list(rows) == ["ddp", "fsdp2", "fsdp2+ac", "zero1", "zero2", "fsdp2+noreshard"]
    assert all(row["error"] is None and row["fits"] and row["world_size"] == WORLD for row in rows.values())
    shapes = BLOCK_SHAPES * BLOCKS
    full = [fp32(s) for s in shapes]
    padded = [4 * math.ceil(s[0] / WORLD) * math.prod(s[1:]) for s in shapes]
    block_padded = [sum(padded[i:i + 4]) for i in range(0, len(padded), 4)]
    # ZeroRedundancyOptimizer: largest first, each to the rank with the fewest elements so far (first on ties)
    sizes, mine = [0] * WORLD, []
    for s in sorted(shapes, key=math.prod, reverse=True):
        r_min = sizes.index(min(sizes))
        sizes[r_min] += math.prod(s)
        if r_min == 0:
            mine.append(fp32(s))
    shard = math.ceil(sum(math.prod(s) for s in shapes) / WORLD)
    expect = {
        # DDP: the full replica, its gradients, AdamW's two states per parameter, one bucket of every gradient
        "ddp": (sum(full), sum(full), 2 * sum(full)),
        # FSDP2: padded shards; one reduce-scatter output per block; rank 0's local shards are full padded rows
        "fsdp2": (sum(padded), sum(block_padded), 2 * sum(padded)),
        "fsdp2+ac": (sum(padded), sum(block_padded), 2 * sum(padded)),
        "zero1": (sum(full), sum(full), 2 * sum(mine)),
        # ZeRO-2: one flat buffer of every parameter, padded to a multiple of N; rank 0's slice of it
        "zero2": (4 * shard * WORLD, 4 * shard, 2 * 4 * shard),
        "fsdp2+noreshard": (sum(padded), sum(block_padded), 2 * sum(padded)),
    }
    for s, (param, grad, state) in expect.items():
        got = (rows[s]["parameter_bytes"], rows[s]["gradient_bytes"], rows[s]["optimizer_state_bytes"])
        assert got == (param, grad, state), s
    assert sorted(r["held"]["fsdp2"]["parameter"]) == sorted(padded)
    assert sorted(r["held"]["fsdp2"]["gradient"]) == sorted(block_padded)
    # DDP's one bucket (torch 2.13: a single bucket before the first rebuild) holds every gradient's bytes
    assert r["held"]["ddp"]["autograd_detail"] == [sum(full)]
    assert r["held"]["zero1"]["autograd_detail"] == [sum(full)]
    peak = {s: rows[s]["peak_allocated"] for s in rows}
    assert peak["fsdp2+ac"] < peak["fsdp2"] <= peak["ddp"] and peak["zero1"] <= peak["ddp"]


def test_activation_checkpointing_saves_the_hidden_activations_of_all_but_one_block():
    r = run_child(MODEL + f"""
df = memlens.predict_strategies(Net, step, world_sizes=({WORLD},), strategies=("fsdp2", "fsdp2+ac"))
result = df.to_dict("records")
""")
    no_ac, ac = r
    # Without checkpointing each block keeps its ReLU output (BATCH x HID fp32, saved by ReLU and by the second
    # Linear; the first Linear's output is freed once ReLU has run) until its backward. With checkpointing each
    # block keeps only its input; at the start of backward the last block is recomputed, so the peak holds one
    # block's hidden activation instead of BLOCKS of them. Parameters are the same shards in both.
    hidden = 4 * BATCH * HID
    assert no_ac["peak_allocated"] - ac["peak_allocated"] == (BLOCKS - 1) * hidden
    # activations dominate this model: the saving is larger than all its parameters' bytes
    assert (BLOCKS - 1) * hidden > 4 * BLOCKS * sum(math.prod(s) for s in BLOCK_SHAPES)


RANKS_SCRIPT = """
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
dist.init_process_group("nccl")
""" + FSDP_SCRIPT_STEP + "dist.destroy_process_group()\n"


def test_cli_report_has_one_run_per_predicted_rank_with_the_predicted_peaks(tmp_path):
    import json
    import os
    import re
    import subprocess
    import sys

    from memlens.units import format_bytes
    from _predict_cases import ROOT
    script = tmp_path / "train.py"
    script.write_text(RANKS_SCRIPT)
    html_path = tmp_path / "ranks.html"
    proc = subprocess.run([sys.executable, "-m", "memlens", "predict", "--gpu", "H100", "--world-size", "4", "--json",
                           "--report", str(html_path), "--", "python", str(script)], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert s["report"] == str(html_path)
    html = html_path.read_text()
    status = json.loads(re.search(r'id="memlens-report-status">(.*?)</script>', html, re.S).group(1))
    # 256/512 rows divide by 4: ranks 0 and 3 run and allocate alike, rank 0 stands for ranks 1 and 2
    assert status["runs"] == ["rank 0", "rank 3"]
    assert html.count('class="memlens-run"') == 2
    assert "rank 0 stands for ranks 1, 2" in html
    assert "Predicted, not measured" in html and "modeled GPU clock" in html
    assert "memlens-ranks-" not in html  # the ranks lived in a deleted directory: no path there is named
    table = html[html.index('id="runs"'):html.index('class="memlens-run"')]
    for r in (0, 3):
        row = s["ranks"][r]
        assert row["ran"] and row["peak_allocated"] > 0
        assert format_bytes(row["peak_allocated"]) in table and format_bytes(row["peak_reserved"]) in table


def test_report_peaks_equal_the_prediction_per_rank(tmp_path):
    r = run_child(f"""
import pathlib
pathlib.Path({str(tmp_path / 'train.py')!r}).write_text({RANKS_SCRIPT!r})
from memlens.reporting.predicted_ranks import build_predicted_ranks_report
d = memlens.predict({str(tmp_path / 'train.py')!r}, gpu="H100", world_size=4)
rep = build_predicted_ranks_report(d, directory={str(tmp_path)!r})
gpu = rep.peaks[rep.peaks.device == "cuda:0"]
result = {{"report": [[int(a), int(b), int(c)] for a, b, c in zip(gpu["rank"], gpu["allocated_bytes"], gpu["reserved_bytes"])],
          "predicted": [[x.rank, x.peak_allocated, x.peak_reserved] for x in d.results if x.ran]}}
""")
    assert r["report"] == r["predicted"] and len(r["report"]) == 2


def test_max_batch_per_strategy_equals_brute_force_and_a_failing_strategy_gives_a_row():
    r = run_child("""
import torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(1024, 1024) for _ in range(2))
    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x
def step(model, opt, n):
    model(torch.randn(256 * n, 1024, device="cuda")).sum().backward()
    opt.step()
CAP = 800_000_000
brute = [bool(memlens.predict_strategies(Net, step, capacity=CAP, world_sizes=(2,), strategies=("ddp",),
                                          batch=n).fits[0]) for n in range(1, 10)]
df = memlens.predict_strategies(Net, step, capacity=CAP, world_sizes=(2,), strategies=("ddp", "fsdp2"), batch=1,
                                max_batch=True, layers=lambda model: [])
result = {"brute": brute, "rows": df.to_dict("records")}
""")
    brute = r["brute"]
    # the largest n whose every smaller size fits too (max_batch bisects on sizes that fit monotonically)
    expected = next((n for n in range(len(brute), 0, -1) if all(brute[:n])), 0)
    assert 0 < expected < len(brute)
    ddp, fsdp2 = r["rows"]
    assert ddp["strategy"] == "ddp" and ddp["error"] is None and ddp["max_batch"] == expected
    # layers= gave no blocks: that strategy's row carries the error, the others still ran
    assert fsdp2["strategy"] == "fsdp2" and "no repeated blocks" in fsdp2["error"]
    assert math.isnan(fsdp2["peak_allocated"]) and fsdp2["fits"] is None


def test_world_sizes_and_given_layers_shard_by_the_arithmetic_and_unknown_strategies_are_refused():
    r = run_child(MODEL + """
df = memlens.predict_strategies(Net, step, world_sizes=(2, 4), strategies=("fsdp2",),
                                layers=lambda model: list(model.layers))
try:
    memlens.predict_strategies(Net, step, strategies=("tp+fsdp2",))
    refused = None
except memlens.errors.InputError as exc:
    refused = str(exc)
result = {"rows": df[["world_size", "parameter_bytes", "error"]].to_dict("records"), "refused": refused}
""")
    shapes = BLOCK_SHAPES * BLOCKS
    for row, world in zip(r["rows"], (2, 4)):
        assert row["world_size"] == world and row["error"] is None
        assert row["parameter_bytes"] == sum(4 * math.ceil(s[0] / world) * math.prod(s[1:]) for s in shapes)
    assert "tp+fsdp2" in r["refused"] and "world_size" in r["refused"]


# 64 equal weights whose rows divide by 64: every partition (ZeroRedundancyOptimizer's per parameter, ZeRO-2's flat
# slice, FSDP2's rows) is exactly Psi / N at N = 2, 8 and 64, so the ZeRO paper's formulas hold to the byte.
EVEN_MODEL = """
import torch.nn as nn
class Even(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(*[nn.Linear(64, 64, bias=False) for _ in range(8)])
                                    for _ in range(8))
    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
def build():
    return Even().to(DTYPE)
def step(model, opt):
    model(torch.randn(32, 64, device="cuda", dtype=DTYPE)).sum().backward()
    opt.step()
"""
PSI = 64 * 64 * 64


def zero_paper_states(strategy: str, psi: int, n: int, b: int, k: int) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer state) bytes per rank, Rajbhandari et al. 2020 Fig. 1 with b bytes per
    parameter and gradient element and k optimizer bytes per element (the paper's mixed precision: b = 2,
    k = 12; here the model's own dtype and AdamW's two states in it: k = 2 b)."""
    return {"ddp": (b * psi, b * psi, k * psi),
            "zero1": (b * psi, b * psi, k * psi // n),
            "zero2": (b * psi, b * psi // n, k * psi // n),
            "fsdp2": (b * psi // n, b * psi // n, k * psi // n),             # ZeRO-3
            "fsdp2+noreshard": (b * psi // n, b * psi // n, k * psi // n)}[strategy]


@pytest.mark.parametrize("world, dtype", [(2, "float32"), (8, "float32"), (64, "float32"), (8, "bfloat16")])
def test_each_row_holds_the_zero_papers_model_states(world, dtype):
    strategies = ("ddp", "zero1", "zero2", "fsdp2", "fsdp2+noreshard")
    r = run_child(f"DTYPE = torch.{dtype}\n" + EVEN_MODEL + f"""
df = memlens.predict_strategies(build, step, world_sizes=({world},), strategies={strategies})
result = df[["strategy", "parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "error"]].to_dict("records")
""")
    b = 4 if dtype == "float32" else 2
    for row in r:
        assert row["error"] is None, row
        got = (row["parameter_bytes"], row["gradient_bytes"], row["optimizer_state_bytes"])
        assert got == zero_paper_states(row["strategy"], PSI, world, b, 2 * b), row["strategy"]
    # the paper's totals: DDP 2 b + k = 16 Psi at fp32, ZeRO-2 b Psi + (b + k) Psi / N
    totals = {row["strategy"]: row["parameter_bytes"] + row["gradient_bytes"] + row["optimizer_state_bytes"]
              for row in r}
    assert totals["ddp"] == 4 * b * PSI and totals["zero2"] == b * PSI + 3 * b * PSI // world
