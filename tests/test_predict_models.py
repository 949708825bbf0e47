"""memlens.predict on the models people write: `copy.deepcopy` of modules, nn.TransformerEncoder/Decoder,
`torch.utils.checkpoint`, HuggingFace `transformers` models built from a config, torchvision models; a run
that raises gets no verdict.

The reference for the peaks is a real run of the same step on the CPU, recorded by torch's own profiler
(``profile_memory=True``: every allocation and free of c10's CPU allocator, in order). The prediction is
made without the GPU-only extras (cuBLAS workspaces, CUDA kernels' own temporaries) so that both count the
same tensors; its sizes are rounded up to the caching allocator's 512 bytes, the profiler's are not. Parameter,
gradient and optimizer-state bytes are worked out by hand from the model's shapes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from test_predict import ROOT, built_shim, run_child  # noqa: F401  (built_shim: the module fixture)

CPU_REFERENCE = """
import copy, warnings
import torch.nn as nn
from torch.profiler import profile, ProfilerActivity

def cpu_peak(step):
    # the real CPU run's peak of live bytes in c10's CPU allocator, from the profiler's memory events
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step("cpu")
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for _, nbytes in sorted(events, key=lambda e: e[0]):
        live += nbytes
        peak = max(peak, live)
    return peak

def predicted(step):
    with memlens.predict(gpu="H100", cublas_workspaces=False, kernel_scratch=False) as p:
        step("cuda")
    return p

def figures(step):
    p = predicted(step)
    cuda = p.trace.blocks[p.trace.blocks.device == "cuda:0"]
    cat = cuda.groupby("category").requested_size.sum()
    return {"predicted": p.peak_allocated, "reference": cpu_peak(step),
            "param_bytes": int(cat.get("parameter", 0)), "opt_state": int(cat.get("optimizer_state", 0))}

def adamw_step(make_model, make_batch, loss_of):
    # one training step: fp32 model, AdamW (per-parameter path, as on the CPU), backward, step
    def step(device):
        torch.manual_seed(0)
        model = make_model().to(device)
        opt = torch.optim.AdamW(model.parameters(), foreach=False)
        loss_of(model, make_batch(device)).backward()
        opt.step()
    return step
"""

# |predicted - reference| / reference: the prediction rounds each block up to 512 bytes and leaves out the
# CPU step counters of AdamW (they live on the host); measured on these models: < 0.001 %
TOLERANCE = 0.001


def check_against_cpu(r: dict, n_params: int, name: str) -> None:
    assert r["param_bytes"] == 4 * n_params, name
    # AdamW: exp_avg and exp_avg_sq per parameter, fp32
    assert r["opt_state"] == 2 * 4 * n_params, name
    # after the step params, grads and both moments are alive at once
    assert r["predicted"] >= 4 * 4 * n_params, name
    assert abs(r["predicted"] - r["reference"]) <= TOLERANCE * r["reference"], (name, r)


def linear(i: int, o: int) -> int:
    return i * o + o


def encoder_layer_params(d: int, ff: int) -> int:
    # self-attention in_proj (3d x d + 3d) and out_proj, the feed-forward pair, two LayerNorms
    return linear(d, 3 * d) + linear(d, d) + linear(d, ff) + linear(ff, d) + 2 * 2 * d


def test_user_deepcopy_of_a_module_inside_the_prediction():
    r = run_child(CPU_REFERENCE + """
twins = {}
def step(device):
    torch.manual_seed(0)
    layer = nn.Linear(1024, 1024, device=device)
    twin = copy.deepcopy(layer)      # the user's own copy: new parameters, the same values
    if device == "cuda":
        twins.update(same_mode=twin.weight.fake_mode is layer.weight.fake_mode, device=str(twin.weight.device),
                     shared=twin.weight is layer.weight, is_param=isinstance(twin.weight, nn.Parameter))
    x = torch.randn(256, 1024, device=device)
    (layer(x) + twin(x)).pow(2).mean().backward()
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    p = predicted(step)
    warnings.warn("the user's own warning")
cuda = p.trace.blocks[p.trace.blocks.device == "cuda:0"]
result = {"twins": twins, "param_bytes": int(cuda[cuda.category == "parameter"].requested_size.sum()),
          "predicted": p.peak_allocated, "reference": cpu_peak(step),
          "warnings": [str(w.message)[:60] for w in seen]}
""")
    assert r["twins"] == {"same_mode": True, "device": "cuda:0", "shared": False, "is_param": True}
    n = linear(1024, 1024)
    assert r["param_bytes"] == 2 * 4 * n          # the copy owns its own parameters
    # the backward's peak: both layers' params and grads, the input and both outputs
    assert r["predicted"] >= 4 * 4 * n
    assert abs(r["predicted"] - r["reference"]) <= TOLERANCE * r["reference"], r
    # torch's FakeTensor data_ptr warning (deepcopy reads the pointer) is not shown; the user's own warnings are
    assert r["warnings"] == ["the user's own warning"]


def test_the_data_ptr_warning_exists_outside_a_prediction():
    """The control for the test above: the same deepcopy under a plain FakeTensorMode warns (once a process),
    so the silence inside a prediction is the prediction's filter, and the filter is gone after the block."""
    r = run_child("""
import copy, warnings
from torch._subclasses.fake_tensor import FakeTensorMode
with memlens.predict(gpu="H100"):
    inside = [str(f[1].pattern) for f in warnings.filters if f[1] is not None]
after = [str(f[1].pattern) for f in warnings.filters if f[1] is not None]
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    with FakeTensorMode():
        copy.deepcopy(torch.nn.Linear(4, 4))
result = {"seen": sum("data pointer of FakeTensor" in str(w.message) for w in seen),
          "filter_inside": any("data pointer of FakeTensor" in f for f in inside),
          "filter_after": any("data pointer of FakeTensor" in f for f in after)}
""")
    assert r == {"seen": 1, "filter_inside": True, "filter_after": False}


def test_transformer_encoder_and_decoder_match_a_real_cpu_run():
    r = run_child(CPU_REFERENCE + """
enc = adamw_step(lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True), 2),
                 lambda d: torch.randn(8, 32, 256, device=d), lambda m, x: m(x).pow(2).mean())
dec = adamw_step(lambda: nn.TransformerDecoder(nn.TransformerDecoderLayer(256, 4, 1024, dropout=0.0, batch_first=True), 2),
                 lambda d: (torch.randn(8, 32, 256, device=d), torch.randn(8, 16, 256, device=d)),
                 lambda m, x: m(*x).pow(2).mean())
result = {"encoder": figures(enc), "decoder": figures(dec)}
""")
    d, ff = 256, 1024
    # nn.TransformerEncoder deep-copies its layer num_layers times (the failure this test guards against)
    check_against_cpu(r["encoder"], 2 * encoder_layer_params(d, ff), "encoder")
    # a decoder layer adds cross-attention (in_proj + out_proj) and a third LayerNorm
    decoder_layer = encoder_layer_params(d, ff) + linear(d, 3 * d) + linear(d, d) + 2 * d
    check_against_cpu(r["decoder"], 2 * decoder_layer, "decoder")


def test_activation_checkpointing_reentrant_and_not():
    r = run_child(CPU_REFERENCE + """
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
    def forward(self, x):
        return x + self.f(x)

class Net(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.reentrant = reentrant
    def forward(self, x):
        for b in self.blocks:
            x = b(x) if self.reentrant is None else checkpoint(b, x, use_reentrant=self.reentrant)
        return x

result = {str(mode): figures(adamw_step(lambda mode=mode: Net(mode),
                                        lambda d: torch.randn(16, 128, 512, device=d, requires_grad=True),
                                        lambda m, x: m(x).pow(2).mean()))
          for mode in (None, False, True)}
""")
    n = 4 * (linear(512, 2048) + linear(2048, 512))
    for mode in ("None", "False", "True"):
        check_against_cpu(r[mode], n, f"use_reentrant={mode}")
    # without checkpointing each block keeps its first Linear's output and GELU's output (16*128 tokens of 2048
    # floats each) until backward; with it, only the block's input. The checkpointed peaks come at the
    # optimizer step instead (params + grads + two moments: 16 bytes a parameter), so they are at least that
    # and the plain run's is higher by more than one block's saved activations
    saved_per_block = 2 * 16 * 128 * 2048 * 4
    for mode in ("False", "True"):
        assert r[mode]["predicted"] >= 16 * n, mode
        assert r["None"]["predicted"] - r[mode]["predicted"] >= saved_per_block, mode


def _has(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def _predict_cli(script, *extra):
    return subprocess.run([sys.executable, "-m", "memlens", "predict", "--gpu", "H100", *extra, "--", "python",
                           str(script)], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_cli_failed_script_exits_nonzero_with_no_verdict(tmp_path):
    work = textwrap.dedent("""
        import sys, torch
        model = torch.nn.Linear(256, 256).cuda()
        model(torch.randn(8, 256, device="cuda")).sum().backward()
    """)
    raises = tmp_path / "raises.py"
    raises.write_text(work + "raise ValueError('bad batch in the script')\n")
    exits = tmp_path / "exits.py"
    exits.write_text(work + "sys.exit(3)\n")
    clean_exit = tmp_path / "clean_exit.py"
    clean_exit.write_text(work + "sys.exit(0)\n")
    for script, said in ((raises, "ValueError: bad batch in the script"), (exits, "exited with 3")):
        for extra in ((), ("--json",)):
            proc = _predict_cli(script, *extra)
            assert proc.returncode == 1, (script.name, extra, proc.stderr[-2000:])
            # no verdict at all: no peaks, no "fits", no JSON
            assert "peak" not in proc.stdout and "fits" not in proc.stdout and "{" not in proc.stdout, proc.stdout
            assert said in proc.stderr and "no prediction" in proc.stderr, proc.stderr[-2000:]
    # sys.exit(0) is a script that completed: it gets its prediction
    proc = _predict_cli(clean_exit, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json
    s = json.loads(proc.stdout[proc.stdout.index("{"):])
    # the weight and its gradient (256*256 fp32 each) at least
    assert s["fits"] is True and s["peak_allocated"] >= 2 * 256 * 256 * 4


def test_api_failed_code_raises_and_has_no_verdict():
    r = run_child("""
import memlens.predict as mp
def step():
    model = torch.nn.Linear(256, 256).cuda()
    model(torch.randn(8, 256, device="cuda")).sum().backward()
    raise ValueError("bad batch in the step")
try:
    memlens.predict(step, gpu="H100")
    propagated = None
except ValueError as exc:
    propagated = [str(exc), list(getattr(exc, "__notes__", []))]
p = memlens.predict(gpu="H100")
try:
    with p:
        step()
except ValueError:
    pass
answers = {}
for name, read in (("peak_allocated", lambda: p.peak_allocated), ("fits", lambda: p.fits()),
                   ("oom", lambda: p.oom), ("summary", lambda: p.summary())):
    try:
        answers[name] = repr(read())
    except mp.PredictionFailed as exc:
        answers[name] = "PredictionFailed: " + str(exc)
result = {"propagated": propagated, "answers": answers, "failure": p.failure,
          "partial_trace_blocks": int((p.trace.blocks.device == "cuda:0").sum())}
""")
    assert r["propagated"][0] == "bad batch in the step"
    assert any("no prediction" in note for note in r["propagated"][1])
    assert r["failure"] == "ValueError: bad batch in the step"
    for name, answer in r["answers"].items():
        assert answer.startswith("PredictionFailed: ") and "ValueError: bad batch in the step" in answer, name
    # what ran up to the error is kept for inspection: weight, bias, input, output, grads...
    assert r["partial_trace_blocks"] >= 4
