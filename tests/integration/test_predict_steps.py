"""A step function predicted once creates its optimizer state after its activations are freed, so its peak is
below the steady state's. memlens.predict(step) runs the step a second time when the first call left new
blocks alive and reports each call's peak (the last one the steady state); ``steps=N`` chooses; a step that
leaves nothing behind runs once. Predictions run in a child (tests/_predict_cases.py).
"""
from __future__ import annotations

import pytest

from _predict_cases import built_shim, run_child  # noqa: F401  (built_shim: the module fixture)

MLP_ADAMW = """
state, calls = {}, []
def build():
    state["model"] = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                         torch.nn.Linear(4096, 1024)).cuda()
    state["opt"] = torch.optim.AdamW(state["model"].parameters())
def step():
    calls.append(1)
    model, opt = state["model"], state["opt"]
    model(torch.randn(4096, 1024, device="cuda")).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
def fresh():
    state.clear(); calls.clear()
"""


def test_one_step_predicts_the_steady_state_like_two_explicit_steps():
    r = run_child(MLP_ADAMW + """
sizes = lambda p: sorted(p.trace.blocks.loc[p.trace.blocks.device == "cuda:0", "size"].tolist())
def once():
    if not state:
        build()
    step()
fresh(); auto = memlens.predict(once, gpu="H100"); auto_calls = len(calls)
fresh(); two = memlens.predict(lambda: (build(), step(), step()), gpu="H100", steps=1)
fresh(); one = memlens.predict(lambda: (build(), step()), gpu="H100", steps=1)
fresh(); three = memlens.predict(once, gpu="H100", steps=3); three_calls = len(calls)
result = {"auto": [auto.peak_allocated, auto.peak_reserved], "two": [two.peak_allocated, two.peak_reserved],
          "same_blocks": sizes(auto) == sizes(two), "auto_calls": auto_calls, "three_calls": three_calls,
          "auto_steps": auto.step_peaks, "one_steps": one.step_peaks, "three_steps": three.step_peaks,
          "one_peak": one.peak_allocated, "auto_note": auto.steps_note, "one_note": one.steps_note,
          "notes": auto.trace.metadata["notes"], "summary": auto.summary()["step_peaks"],
          "param_bytes": sum(p.numel() * 4 for p in state["model"].parameters())}
""")
    # the one-step function ran twice and predicts exactly what two explicit steps predict
    assert r["auto_calls"] == 2 and r["auto"] == r["two"] and r["same_blocks"]
    first, steady = r["auto_steps"]
    assert steady["peak_allocated"] == r["auto"][0]
    # the steady step holds AdamW's two moments (fp32, one per parameter element) on top of the first step's
    # peak, which comes before the first opt.step() made them: 2 x 8,393,728 x 4 bytes
    assert r["param_bytes"] == (1024 * 4096 * 2 + 4096 + 1024) * 4
    assert steady["peak_allocated"] - first["peak_allocated"] == 2 * r["param_bytes"]
    # steps=1: the first step's peak, said to be one step only
    assert r["one_steps"] == [first] and r["one_peak"] == first["peak_allocated"]
    assert r["one_note"].startswith("one step only") and "steps=None" in r["one_note"]
    # steps=3: three calls; the second and third are alike
    assert r["three_calls"] == 3 and len(r["three_steps"]) == 3
    assert r["three_steps"][1]["peak_allocated"] == r["three_steps"][2]["peak_allocated"]
    assert r["auto_note"] in r["notes"] and "steady-state peak (step 2)" in r["auto_note"]
    assert r["summary"] == r["auto_steps"]


def test_a_step_that_keeps_nothing_runs_once():
    r = run_child(MLP_ADAMW + """
def local_step():
    build()
    step()
    state.clear()          # the model and its optimizer go with the step
fresh(); p = memlens.predict(local_step, gpu="H100")
result = {"calls": len(calls), "left": p.first_step_left_bytes, "steps": p.step_peaks, "note": p.steps_note,
          "peak": p.peak_allocated}
""")
    assert r["calls"] == 1 and r["left"] == 0 and r["note"] is None
    assert r["steps"] == [{"step": 1, "peak_allocated": r["peak"], "peak_reserved": r["steps"][0]["peak_reserved"]}]


@pytest.mark.parametrize("steps", [0, -1, 1.5, True, "2"])
def test_steps_must_be_a_positive_count(steps):
    from memlens.errors import InputError
    from memlens.prediction.steps import check_steps
    with pytest.raises(InputError, match="steps must be a positive number"):
        check_steps(steps)
