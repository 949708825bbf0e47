"""memlens.predict on what a user's code does besides training: a script or a step that raises or exits
non-zero gets no verdict (the CLI exits 1 with the error and no peaks, fits or JSON; the API re-raises with a
note, and every answer of the failed prediction raises PredictionFailed while the partial trace is kept),
while a script that exits 0 is predicted; and a script that saves a checkpoint with torch.save is predicted,
the checkpoint's structure (shapes, dtypes) written without adding a block or moving the peak. Predictions run
in a child process (tests/_predict_cases.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from _predict_cases import ROOT, built_shim, run_child  # noqa: F401  (built_shim: the module fixture)


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
import memlens.prediction as mp
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


def test_a_script_that_saves_a_checkpoint_is_predicted(tmp_path):
    """torch.save of fake tensors fails in plain torch; inside a prediction it writes the checkpoint's
    structure (shapes, dtypes) without the bytes, and allocates nothing on the (modelled) GPU, as a real
    save, which copies to the host, does not."""
    ckpt = tmp_path / "ckpt.pt"
    r = run_child(f"""
def step(save):
    model = torch.nn.Linear(1024, 512).cuda()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(64, 1024, device="cuda")).sum().backward()
    opt.step()
    if save:
        torch.save({{"model": model.state_dict(), "opt": opt.state_dict()}}, {str(ckpt)!r})
peaks = [memlens.predict(lambda: step(save), gpu="H100").peak_allocated for save in (False, True)]
blocks = [len(memlens.predict(lambda: step(save), gpu="H100").trace.blocks) for save in (False, True)]
loaded = torch.load({str(ckpt)!r}, map_location="cpu", weights_only=True)
result = {{"peaks": peaks, "blocks": blocks, "weight": list(loaded["model"]["weight"].shape),
          "exp_avg_sq": list(loaded["opt"]["state"][0]["exp_avg_sq"].shape),
          "dtype": str(loaded["model"]["bias"].dtype)}}
""")
    assert r["weight"] == [512, 1024] and r["exp_avg_sq"] == [512, 1024] and r["dtype"] == "torch.float32"
    # the save adds no block and leaves the peak where it was
    assert r["blocks"][0] == r["blocks"][1] and r["peaks"][0] == r["peaks"][1]
    # weight, bias, their grads and both AdamW moments at least
    assert r["peaks"][0] >= 4 * 4 * (1024 * 512 + 512)
