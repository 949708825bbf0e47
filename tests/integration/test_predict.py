"""memlens.predict: fake-cuda predictions of GPU memory as a user meets them, checked against arithmetic.

A training step's blocks (parameters, optimizer state, cuBLAS workspaces by GPU) and peaks, fits/OOM and
max_batch, the `memlens predict` CLI, the import-order error, memlens.fake on an existing model, the shim
claiming a device only inside a prediction, held-out models (a CNN with BatchNorm, a GQA model with tied
embeddings), autocast's cast cache, the fast cache key changing nothing, and the predicted trace feeding
`memlens swap` and `memlens plan`. Kernel choice and kernel scratch memory are in test_predict_cuda_kernels.py.
Each prediction runs in a child process that imports memlens before torch, as users must on a CPU-only
build (the fake-CUDA shim has to be in place before torch initialises); the test process's own torch was
imported long before (tests/_predict_cases.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from _predict_cases import ROOT, built_shim, run_child  # noqa: F401  (the shim fixture)

MLP = """
import torch.nn as nn
def step(batch, gpu="H100", capacity=None):
    with memlens.predict(gpu=gpu, capacity=capacity) as p:
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
        opt = torch.optim.AdamW(model.parameters(), foreach=False)
        x = torch.randn(batch, 1024, device="cuda")
        model(x).pow(2).mean().backward()
        opt.step()
    return p
"""


def test_training_step_blocks_and_workspaces():
    r = run_child(MLP + """
p = step(256)
b = p.trace.blocks
cuda = b[b.device == "cuda:0"]
params = cuda[cuda.category == "parameter"]
ws = cuda[cuda.op.str.startswith("cublas_workspace")]
p2 = step(256, gpu="A100")
ws2 = p2.trace.blocks[p2.trace.blocks.op.str.startswith("cublas_workspace")]
result = {"param_bytes": int(params.requested_size.sum()), "ws": ws["size"].tolist(), "ws_a100": ws2["size"].tolist(),
          "peak": p.peak_allocated, "reserved": p.peak_reserved, "devices": sorted(b.device.unique().tolist()),
          "opt_state": int(cuda[cuda.category == "optimizer_state"].requested_size.sum()),
          "clock": p.trace.metadata["clock"]["kind"], "sizes_rounded": bool((cuda["size"] % 512 == 0).all())}
""")
    n_params = 1024 * 4096 + 4096 + 4096 * 1024 + 1024
    assert r["param_bytes"] == 4 * n_params
    # exp_avg and exp_avg_sq per parameter (the CPU step counters are not on the GPU)
    assert r["opt_state"] == 2 * 4 * n_params
    # one workspace for the forward's thread and one for autograd's device thread: 32 MiB on sm90, 8,320 KiB before
    assert r["ws"] == [32 << 20, 32 << 20]
    assert r["ws_a100"] == [8519680, 8519680]
    # at least params + grads + both moments + the workspaces are alive at the end
    assert r["peak"] >= 4 * 4 * n_params + 2 * (32 << 20)
    assert r["reserved"] >= r["peak"]
    assert r["devices"] == ["cpu", "cuda:0"] or r["devices"] == ["cuda:0"]
    assert r["sizes_rounded"]
    # the predicted trace is on the modeled clock of the GPU (memlens.retime), not the CPU's
    assert r["clock"] == "modeled"


def test_fits_oom_and_max_batch():
    r = run_child(MLP + """
p = step(256)
need = p.device_bytes_needed
small = p.fits(need - 64 * 2**20)
oom = step(256, capacity=need - 64 * 2**20).oom
def stepper(n):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    model(torch.randn(n, 1024, device="cuda")).pow(2).mean().backward(); opt.step()
cap = step(4096).device_bytes_needed
mb = memlens.max_batch(stepper, capacity=cap, gpu="H100", low=1024)
result = {"fits_big": p.fits(need + 2**20), "fits_small": small, "oom": str(oom) if oom else None,
          "oom_op": oom.op if oom else None, "max": mb["max"], "tried": {str(k): v for k, v in mb["tried"].items()}}
""")
    assert r["fits_big"] is True
    assert r["fits_small"] is False
    assert r["oom"] and "OOM" in r["oom"] and r["oom_op"]
    tried = {int(k): v for k, v in r["tried"].items()}
    # batch 4096 needs exactly `cap`, so it fits; the answer fits and the next size tried above it does not
    assert r["max"] >= 4096
    assert all(v > tried[4096] for n, v in tried.items() if n > r["max"])


def test_a_with_block_after_an_early_backward_gives_the_ways_out():
    # torch first and a backward before memlens: autograd's engine has no fake-GPU thread, and a `with` block
    # cannot move to a child process (a step function would: tests/integration/test_predict_import_order.py)
    code = ("import torch\nx = torch.ones(2, requires_grad=True)\nx.sum().backward()\nimport memlens\n"
            "try:\n    memlens.predict(gpu='H100').__enter__()\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}).stdout
    assert "ShimError" in out and "memlens predict" in out and "before memlens was imported" in out


def test_cli_predict_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        model = torch.nn.Linear(2048, 2048, bias=False).cuda()
        model(torch.randn(512, 2048, device="cuda")).sum().backward()
        print("done", torch.cuda.is_available())
    """))
    out = tmp_path / "pred.memlens"
    proc = subprocess.run([sys.executable, "-m", "memlens", "predict", "--gpu", "H100", "--json", "--out", str(out),
                           "--", "python", str(script)], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(proc.stdout[proc.stdout.index("{"):])
    weight = 2048 * 2048 * 4
    # at the peak (the weight gradient's GEMM): weight, its gradient, the saved input (4 MiB), two cuBLAS
    # workspaces; the output (4 MiB) is not saved by sum's backward, so it is gone; the rest is scalars
    expected = 2 * weight + 512 * 2048 * 4 + 2 * (32 << 20)
    assert expected <= s["peak_allocated"] <= expected + 4096
    assert s["fits"] is True and out.exists()


def test_fake_moves_an_existing_model_without_allocating():
    r = run_child("""
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))  # real, CPU
with memlens.predict(gpu="H100", model=model) as p:
    memlens.fake(model)
    model(torch.randn(16, 512, device="cuda")).sum().backward()
b = p.trace.blocks
cuda = b[b.device == "cuda:0"]
result = {"device": str(model[0].weight.device), "fake": type(model[0].weight).__name__,
          "param_bytes": int(cuda.loc[cuda.category == "parameter", "requested_size"].sum()),
          "grad_bytes": int(cuda.loc[cuda.category == "gradient", "requested_size"].sum())}
""")
    n = 512 * 2048 + 2048 + 2048 * 512 + 512
    assert r["device"] == "cuda:0" and r["fake"] == "FakeTensor"
    assert r["param_bytes"] == 4 * n
    assert r["grad_bytes"] == 4 * n


def test_shim_reports_the_device_only_during_a_prediction():
    r = run_child("""
before = torch.accelerator.is_available()
x = torch.randn(4, 4, requires_grad=True); (x * 2).sum().backward()   # a CPU backward before any prediction
with memlens.predict(gpu="H100") as p:
    inside = torch.accelerator.is_available()
    m = torch.nn.Linear(256, 256).cuda(); m(torch.randn(8, 256, device="cuda")).sum().backward()
result = {"before": before, "inside": inside, "after": torch.accelerator.is_available(),
          "cuda_available_after": torch.cuda.is_available()}
""")
    # importing memlens first must not make a CPU-only torch claim a GPU outside predictions
    assert r == {"before": False, "inside": True, "after": False, "cuda_available_after": False}


HELD_OUT = """
import torch.nn as nn, torch.nn.functional as F
class CNN(nn.Module):   # convolutions, BatchNorm (running stats, num_batches_tracked), pooling
    def __init__(s):
        super().__init__()
        s.f = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
                            nn.AdaptiveAvgPool2d(1))
        s.head = nn.Linear(128, 10)
    def forward(s, x):
        return s.head(s.f(x).flatten(1))
class GQA(nn.Module):   # grouped-query attention (8 query heads, 2 key/value heads), tied embeddings
    def __init__(s, v=1000, d=256, h=8, kv=2, layers=2):
        super().__init__()
        s.emb = nn.Embedding(v, d); s.h, s.kv = h, kv
        s.q = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(layers))
        s.kvp = nn.ModuleList(nn.Linear(d, 2 * d * kv // h, bias=False) for _ in range(layers))
        s.o = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(layers))
        s.norm = nn.LayerNorm(d)
        s.head = nn.Linear(d, v, bias=False)
        s.head.weight = s.emb.weight
    def forward(s, ids):
        x = s.emb(ids); b, t, d = x.shape; hd = d // s.h
        for q, kv, o in zip(s.q, s.kvp, s.o):
            qq = q(x).view(b, t, s.h, hd).transpose(1, 2)
            k, v = kv(x).view(b, t, 2, s.kv, hd).permute(2, 0, 3, 1, 4).unbind(0)
            a = F.scaled_dot_product_attention(qq, k, v, is_causal=True, enable_gqa=True)
            x = x + o(a.transpose(1, 2).reshape(b, t, d))
        return s.head(s.norm(x))
def train(name, steps=2, **options):
    with memlens.predict(gpu="H100", **options) as p:
        if name == "cnn":
            m = CNN().cuda()
            x = torch.randn(32, 3, 64, 64, device="cuda"); y = torch.randint(0, 10, (32,), device="cuda")
        else:
            m = GQA().cuda()
            x = torch.randint(0, 1000, (4, 128), device="cuda"); y = torch.randint(0, 1000, (4, 128), device="cuda")
        opt = torch.optim.AdamW(m.parameters())
        for _ in range(steps):
            out = m(x)
            F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
            opt.step(); opt.zero_grad()
        with torch.inference_mode():
            m(x)
    return p
"""


def test_held_out_models_keep_the_invariants():
    """A CNN with BatchNorm and a GQA model with tied embeddings (not the fixtures the code was tuned on):
    invariants that hold whatever the model, with the byte counts worked out by hand."""
    r = run_child(HELD_OUT + """
out = {}
for name in ("cnn", "gqa"):
    p = train(name)
    ctx = p.gpu.cuda_context
    cuda = p.trace.blocks[p.trace.blocks.device == "cuda:0"]
    below = p.oom_at(p.peak_allocated + ctx - 1)
    out[name] = {"peak": p.peak_allocated, "reserved": p.peak_reserved,
                 "param_bytes": int(cuda[cuda.category == "parameter"].requested_size.sum()),
                 "fits_at_reserved": p.fits(p.peak_reserved + ctx),
                 "oom_below": bool(below), "oom_op": below.op if below else "",
                 "oom_need": (below.allocated + below.size) if below else 0, "cap": p.peak_allocated - 1}
result = out
""")
    # parameters by hand (fp32): conv 3*64*9+64, bn 2*64, conv 64*128*9+128, bn 2*128, linear 128*10+10
    cnn_params = 3 * 64 * 9 + 64 + 2 * 64 + 64 * 128 * 9 + 128 + 2 * 128 + 128 * 10 + 10
    # embedding (tied with the head: counted once), per layer q, kv (2 * 256 * 2/8 * 256) and o, LayerNorm
    gqa_params = 1000 * 256 + 2 * (256 * 256 + 2 * 256 * 64 + 256 * 256) + 2 * 256
    for name, n in (("cnn", cnn_params), ("gqa", gqa_params)):
        f = r[name]
        assert f["param_bytes"] == 4 * n, name
        # params + grads + AdamW's two moments are all alive after the first step (fp32)
        assert f["peak"] >= 4 * n * 4, name
        assert f["reserved"] >= f["peak"], name
        # the allocator replay never needs more than the peak it reported
        assert f["fits_at_reserved"], name
        # one byte less than the peak allocated (plus the CUDA context) cannot hold the run
        assert f["oom_below"] and f["oom_op"], name


def test_autocast_weight_casts_are_cached_once_and_freed_at_exit():
    """torch.autocast("cuda", bf16) casts a weight once per autocast region, however often it is used, and
    drops the cast when the region exits (torch's autocast cast cache); the prediction must show that."""
    r = run_child("""
import torch.nn as nn
class Twice(nn.Module):          # the same 512x512 weight used twice in one forward
    def __init__(s):
        super().__init__()
        s.lin = nn.Linear(512, 512, bias=False); s.out = nn.Linear(512, 8, bias=False)
    def forward(s, x):
        return s.out(s.lin(torch.relu(s.lin(x))))
with memlens.predict(gpu="H100", clock="host") as p:
    m = Twice().cuda(); x = torch.randn(64, 512, device="cuda")
    for _ in range(2):
        with torch.autocast("cuda", torch.bfloat16):
            y = m(x)
        y.float().sum().backward()
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        z = m(x)
    last_inside = z.untyped_storage().nbytes()
    marker = torch.empty(7, device="cuda")
b = p.trace.blocks
b = b[b.device == "cuda:0"].sort_values("alloc_ns")
casts = b[(b.op == "aten::_to_copy") & (b.requested_size == 512 * 512 * 2)]
z_block = b[(b.op == "aten::mm") & (b.requested_size == 64 * 8 * 2)].iloc[-1]
marker_block = b[b.requested_size == 28].iloc[-1]
result = {"casts": len(casts), "last_cast_free": int(casts.free_ns.iloc[-1]),
          "z_alloc": int(z_block.alloc_ns), "marker_alloc": int(marker_block.alloc_ns),
          "train_casts_freed": bool(casts.free_ns.iloc[:2].notna().all())}
""")
    # three autocast regions (two training forwards, one no_grad forward): one bf16 copy of the weight each
    assert r["casts"] == 3
    # the training casts die once backward has used them; the no_grad cast dies when its region exits:
    # after the region's last op, before the first allocation after it
    assert r["train_casts_freed"]
    assert r["z_alloc"] < r["last_cast_free"] < r["marker_alloc"]


def test_fast_cache_key_changes_nothing():
    """memlens.prediction.fastkey builds FakeTensorMode's cache keys faster; with torch's own keys the
    predicted blocks (sizes, ops, categories, order) and peaks must be identical."""
    r = run_child(HELD_OUT + """
out = {}
for fast in (True, False):
    p = train("gqa", fast_cache_key=fast)
    b = p.trace.blocks
    out[str(fast)] = {"blocks": [[int(s), o, c] for s, o, c in zip(b.requested_size, b.op, b.category)],
                      "peaks": [p.peak_allocated, p.peak_reserved]}
result = out
""")
    assert len(r["True"]["blocks"]) > 100
    assert r["True"] == r["False"]


def test_predicted_trace_works_with_swap_and_plan(tmp_path):
    """The predicted trace is as usable as a recorded one: `memlens swap` and `memlens plan` run on it and
    see the same peak the prediction reports."""
    path = tmp_path / "pred.memlens"
    r = run_child(MLP + f"""
p = step(512)
p.trace.save({str(path)!r})
result = {{"peak": p.peak_allocated}}
""")
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    figures = {}
    for name, args in (("swap", ["swap", "--gpu", "H100", "--json"]), ("plan", ["plan", "--time-limit", "1", "--json"])):
        proc = subprocess.run([sys.executable, "-m", "memlens", *args, str(path)], capture_output=True, text=True,
                              cwd=ROOT, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        figures[name] = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert figures["swap"]["peak_before"] == r["peak"]
    assert figures["swap"]["peak_after"] <= figures["swap"]["peak_before"]
    assert figures["plan"]["max_live"] == r["peak"]
    assert figures["plan"]["height"] >= figures["plan"]["max_live"]
