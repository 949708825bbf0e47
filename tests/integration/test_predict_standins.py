"""memlens.predict on ordinary training scripts: reading a fake tensor's value (``loss.item()``, ``f"{loss:.4f}"``,
``bool(t)``, ``.tolist()``, ``torch.equal``) returns a stand-in instead of raising, control flow follows the
stand-ins (a healthy run's: no NaN, finite norms), and the result names the source lines that read them. The
memory of a loop that logs its loss, clips by norm and checks for NaN equals that of the same loop without
those lines, to the byte (reads allocate nothing on the GPU). Predictions run in a child (tests/_predict_cases.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from _predict_cases import ROOT, built_shim, run_child  # noqa: F401  (built_shim: the module fixture)

LOOP = """
import math
import torch
def train(log):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seen = []
    for step in range(3):
        x = torch.randn(64, 256, device="cuda")
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if log:
            if torch.isnan(loss).any() or not torch.isfinite(norm):
                seen.append("nan")
                continue                                   # a healthy run never skips its step
            seen.append((loss.item(), float(norm), f"{loss:.3f}", bool(loss > 100), math.log(loss.item()),
                         loss.detach().reshape(1).tolist(), torch.equal(x, x)))
            print(f"step {step} loss {loss.item():.4f}", loss)
        opt.step()
    return seen
"""


def test_training_loop_that_logs_predicts_like_one_that_does_not():
    r = run_child(LOOP + """
seen = []
p_log = memlens.predict(lambda: seen.extend(train(True)), gpu="H100")
p_plain = memlens.predict(lambda: train(False), gpu="H100")
sizes = lambda p: sorted(int(s) for s in p.trace.blocks.loc[p.trace.blocks["device"] == "cuda:0", "size"])
result = {"seen": seen, "log": [p_log.peak_allocated, p_log.peak_reserved], "log_sizes": sizes(p_log),
          "plain": [p_plain.peak_allocated, p_plain.peak_reserved], "plain_sizes": sizes(p_plain),
          "lines": p_log.standin_lines, "plain_lines": p_plain.standin_lines, "note": p_log.standin_note,
          "notes": p_log.trace.metadata["notes"], "summary_lines": p_log.summary()["standin_lines"]}
""")
    # every step ran (no "nan" branch): loss 1.0, norm 1.0 (float stand-ins), "1.000", not > 100, log(1) = 0,
    # tolist of one value, torch.equal of a tensor with itself
    assert r["seen"] == [[1.0, 1.0, "1.000", False, 0.0, [1.0], True]] * 3
    # the same peaks, to the byte: reading values allocates nothing; the checks' own one-value results
    # (isnan, any, isfinite, the comparison: 512-byte blocks, as on a GPU) are the only extra blocks
    assert r["log"] == r["plain"]
    from collections import Counter
    extra = Counter(r["log_sizes"]) - Counter(r["plain_sizes"])
    assert sum(Counter(r["plain_sizes"]).values()) > 20 and not Counter(r["plain_sizes"]) - Counter(r["log_sizes"])
    assert set(extra) == {512}, extra
    assert r["plain_lines"] == {} and r["log"][0] > 0
    # the lines that read values (the child's line numbers: 4 lines of imports, then LOOP), each counted per
    # read over 3 steps: the NaN check (isnan.any, isfinite: 2), the tuple's first line (loss.item, float,
    # format, bool, math.log: 5) and its second (tolist, equal: 2), the print (loss.item: 1)
    lines = {line.rsplit(":", 1)[1]: n for line, n in r["lines"].items()}
    assert all(line.startswith("<string>:") for line in r["lines"]), r["lines"]
    assert lines == {"20": 6, "23": 15, "24": 6, "25": 3}, lines
    assert r["summary_lines"] == r["lines"]
    assert r["note"] in r["notes"] and "30 reads" in r["note"] and "<string>:23 (15x)" in r["note"]


def test_standin_values_follow_the_code():
    r = run_child("""
def step():
    x = torch.randn(8, 8, device="cuda")
    counter = torch.zeros((), device="cuda")
    got = [counter.item()]                      # a constant the code made: its value
    counter += 1                                # changed in place: back to the default stand-in
    got.append(counter.item())
    got.append(torch.full((), 7.0, device="cuda").item())
    got.append(bool(torch.isinf(x).any() | torch.isnan(x).any()))
    got.append(bool((~torch.isfinite(x)).any()))
    got.append(bool(torch.isfinite(x).all()))
    got.append((x.argmax(dim=1) == 3).sum().item())     # integers: 1
    got.append(torch.tensor(3.5).item())                 # a real constant keeps its real value
    scaler = torch.amp.GradScaler("cuda")
    w = torch.nn.Parameter(torch.randn(8, device="cuda"))
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    scaler.scale((w * 2).sum()).backward()
    scaler.step(opt)                                     # found_inf stays 0.0: the step is taken
    got.append("momentum_buffer" in opt.state[w])
    return got
got = []
p = memlens.predict(lambda: got.extend(step()), gpu="H100")
result = {"got": got, "lines": len(p.standin_lines)}
""")
    assert r["got"] == [0.0, 1.0, 7.0, False, False, True, 1, 3.5, True]
    assert r["lines"] >= 6


def test_cli_predicts_a_script_that_logs_its_loss(tmp_path):
    logging = tmp_path / "train_logging.py"
    logging.write_text(textwrap.dedent(LOOP) + "train(True)\n")
    plain = tmp_path / "train_plain.py"
    plain.write_text(textwrap.dedent(LOOP) + "train(False)\n")
    out = {}
    for script in (logging, plain):
        proc = subprocess.run([sys.executable, "-m", "memlens", "predict", "--gpu", "H100", "--json", "--", "python",
                               str(script)], capture_output=True, text=True, cwd=ROOT, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[script.name] = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    s_log, s_plain = out["train_logging.py"], out["train_plain.py"]
    assert s_log["peak_allocated"] == s_plain["peak_allocated"] > 0
    assert s_log["peak_reserved"] == s_plain["peak_reserved"]
    # the script's own lines (the child's 20, 23, 24 and 25 less its 4 lines of imports), named by its path
    assert s_log["standin_lines"] == {f"{logging}:{n}": k for n, k in ((16, 6), (19, 15), (20, 6), (21, 3))}
    assert s_plain["standin_lines"] == {}


def test_shapes_that_depend_on_values_follow_the_stand_in_mask():
    r = run_child("""
import torch._subclasses.fake_tensor as ft
shapes = {}
def step():
    x = torch.randn(64, 128, device="cuda", requires_grad=True)
    labels = torch.randint(0, 10, (64,), device="cuda")
    keep = labels != -100                                 # a healthy mask: every element true
    picked = x[keep]
    shapes["picked"] = list(picked.shape)
    shapes["none"] = list(x[torch.isnan(x)].shape)        # no NaN: nothing picked
    shapes["nonzero"] = list(torch.nonzero(keep).shape)
    shapes["where"] = [list(t.shape) for t in torch.where(labels > -1)]
    shapes["masked_select"] = list(x.masked_select(x.isfinite()).shape)
    picked.sum().backward()
p = memlens.predict(step, gpu="H100")
made = p.trace.blocks.loc[p.trace.blocks.device == "cuda:0", "requested_size"].tolist()
result = {"shapes": shapes, "made": made, "lines": sorted(p.standin_lines)}
""")
    s = r["shapes"]
    assert s["picked"] == [64, 128] and s["none"] == [0] and s["nonzero"] == [64, 1]
    assert s["where"] == [[64]] and s["masked_select"] == [64 * 128]
    # what CUDA allocates for x[keep]: nonzero's int64 (64, 1) indices, then the (64, 128) fp32 rows
    made = r["made"]
    assert 64 * 8 in made and made.count(64 * 128 * 4) >= 3   # x, picked, x's gradient
    # the child's lines (4 lines of imports first): picked, none, nonzero, where, masked_select; and x[keep]'s
    # backward (index_put_ with the mask, on autograd's device thread)
    assert r["lines"] == ["(backward)"] + [f"<string>:{n}" for n in (12, 14, 15, 16, 17)]
