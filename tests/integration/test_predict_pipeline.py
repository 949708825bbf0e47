"""memlens.predict(world_size=S) on pipeline-parallel code (torch.distributed.pipelining): torch's own GPipe and
1F1B schedules run per stage rank under the fake process group; each stage's peak is checked to the byte
against a reference written here from the schedules' semantics.

Each prediction runs in a child process (see tests/_predict_cases.py).
"""
from __future__ import annotations

import pytest

from _predict_cases import built_shim, interleaved_step, pipeline_step, run_child  # noqa: F401  (the shim fixture)

# every stage: Linear(D, H, bias=False) -> ReLU -> Linear(H, D, bias=False); microbatches of M rows; fp32
D, H, M = 64, 2048, 16
S, N = 4, 6            # stages (= ranks), microbatches
F = 4                  # bytes per fp32 element
LOSS = 512             # a 4-byte loss scalar (or its backward seed) as the caching allocator rounds it

# what a child reads back (the rank table's rows, the ReLU outputs' lifetimes), after the stage step of
# tests/_predict_cases.py
READERS = """
def rows(d):
    return [[x.rank, x.ran, x.stands_for, x.stages, x.peak_allocated, x.peak_reserved, x.fits, x.oom, x.error]
            for x in d.results]
def relu_lives(p):
    b = p.trace.blocks
    b = b[(b.device == "cuda:0") & (b.op == "aten::relu")]
    import pandas as pd
    return [[int(a), None if pd.isna(f) else int(f)] for a, f in zip(b.alloc_seq, b.free_seq)]
"""
PIPELINE_STEP = pipeline_step(D, H, M, N) + READERS


def in_flight(schedule: str, stage: int, b: int) -> int:
    """Microbatches whose forward has run and whose backward has not, when backward `b` starts on `stage`.
    GPipe: every forward first. 1F1B: torch's warm-up runs min(N, S - stage) forwards, then one forward
    after each backward."""
    done = N if schedule == "gpipe" else min(N, min(N, S - stage) + b)
    return done - b


def expected_peak(schedule: str, stage: int) -> int:
    """The stage's peak allocated bytes, from what torch's schedule keeps alive (reference for the test).

    W: one weight; A: one microbatch's ReLU output (saved for backward); O: one microbatch's stage output,
    receive buffer or input gradient. Alive throughout: parameters (2W); gradients (2W, from the first
    backward on); ``PipelineStage``'s receive buffers, made up front for every microbatch (N x O for
    activations on every stage but the first, N x O for gradients on every stage but the last); the user's
    batch (first stage) or target (last stage), N x O. Per microbatch in flight: A + O (the ReLU output and
    the stage output kept for its backward); on the last stage A, its outputs are all kept (N x O by the end,
    for merging), with one loss each and one backward seed. On every stage but the first, an input gradient
    stays alive until its send is waited (NCCL's stash): 1F1B waits each backward's send before the next,
    so one (O) is alive during the next backward; GPipe waits on them only after its last backward, so
    backward b holds b of them.
    Backward transients (autograd's order for Linear -> ReLU -> Linear): the first backward makes W2's
    gradient (W), the ReLU output's gradient (A) and the ReLU input's (A), then frees the first A and the
    microbatch's ReLU output and makes W1's gradient (W), then (not on the first stage) the input gradient
    (O); a later backward's W2 gradient (W) is added into ``.grad`` and freed before the ReLU input's
    gradient is made, so its peak is W + A above what is alive."""
    W, A, O = H * D * F, M * H * F, M * D * F
    first, last = stage == 0, stage == S - 1
    fixed = 2 * W + (0 if first else N * O) + (0 if last else N * O) + (N * O if first or last else 0)
    peaks = []
    for b in range(N):
        k = in_flight(schedule, stage, b)
        live = fixed + (2 * W if b else 0)
        if last:
            outputs = N if schedule == "gpipe" else b + 1
            live += k * A + outputs * (O + LOSS) + LOSS
        else:
            live += k * (A + O)
        if b and not first:
            live += O if schedule == "1f1b" else b * O
        peaks.append(live + (max(W + 2 * A, 2 * W + (0 if first else O)) if b == 0 else W + A))
    return max(peaks)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_stage_runs_and_its_peak_is_what_the_schedule_keeps_alive(schedule):
    assert H * D > M * H + M * D      # W > A + O: the sizes the reference's transient order assumes
    cls = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}[schedule]
    r = run_child(PIPELINE_STEP + f"""
d = memlens.predict(lambda: step({cls}), gpu="H100", world_size={S}, cublas_workspaces=False, kernel_scratch=False)
result = {{"rows": rows(d), "symmetry": d.symmetry, "strategies": sorted(d.strategies), "errors": d.errors,
          "relu": {{r: relu_lives(p) for r, p in d.predictions.items()}}, "notes": d.notes}}
""")
    assert r["errors"] == {} and r["strategies"] == ["pp"] and r["symmetry"].startswith("pipeline stages")
    assert not [n for n in r["notes"] if "pipeline" in n]
    # every stage rank ran (none stands for another) and says its stage
    assert [row[:4] for row in r["rows"]] == [[s, True, s, [s]] for s in range(S)]
    assert [row[4] for row in r["rows"]] == [expected_peak(schedule, s) for s in range(S)]
    assert all(row[6] is True and row[7] is None for row in r["rows"])
    # activations in flight: the most ReLU outputs alive at once (allocation order) is the schedule's depth,
    # N for GPipe, S - stage for 1F1B
    for stage in range(S):
        lives = r["relu"][str(stage)]
        most = max(sum(1 for a, f in lives if a <= t and (f is None or f > t)) for t, _ in lives)
        assert most == (N if schedule == "gpipe" else S - stage), stage


def test_hand_numbers_for_one_stage():
    """The reference itself, spelt out for 1F1B's first stage: W = 524,288, A = 131,072, O = 4,096 bytes."""
    # parameters and gradients 2 x 2 x 524,288; gradient receive buffers and the batch 2 x 6 x 4,096;
    # 4 microbatches in flight x (131,072 + 4,096); the second backward's W2 gradient and ReLU-output gradient
    assert expected_peak("1f1b", 0) == 2_097_152 + 49_152 + 540_672 + 524_288 + 131_072 == 3_342_336
    # GPipe's last stage: 5 ReLU outputs in flight at the second backward, 6 outputs and losses, one seed, the
    # first backward's input gradient (its send not waited yet)
    assert expected_peak("gpipe", S - 1) == (2_097_152 + 49_152 + 655_360 + 6 * (4_096 + 512) + 512 + 655_360
                                            + 4_096)


def test_gpipe_minus_1f1b_per_stage_against_the_standard_analysis():
    """The standard analysis says GPipe holds N microbatches' activations and 1F1B min(N, S - s) on stage s, so
    GPipe - 1F1B = (N - (S - s)) x one microbatch's activation (here A + O: the ReLU output and the stage output
    kept for backward). The predicted difference is smaller, by blocks named here, computed in closed form (not
    from `expected_peak`'s walk through the backwards):

    - GPipe's peak is not at the end of its forwards but in its second backward: the first backward made the
      gradients (2 W, more than one microbatch's A + O) and freed one microbatch, so N - 1 are in flight then;
      1F1B's peak is in its second backward too, with S - s in flight (its warm-up ran S - s forwards, then one
      forward after each backward). So N - 1 - (S - s) microbatches, not N - (S - s).
    - On every stage but the first, an unwaited send keeps its input gradient (O) alive: 1F1B's previous
      backward's, into the next backward; GPipe waits on its sends only at the end, so at its second backward
      it holds one too: no difference from them at the peaks.
    - The last stage keeps every microbatch's output under both schedules (torch merges them for `step`'s
      return), so only the ReLU outputs (A) differ; 1F1B's peak there is its last backward, one microbatch in
      flight against GPipe's N - 1 at its second: (N - 2) A.
    So the difference is one microbatch (A + O) below the standard analysis on every stage but the last,
    A + 5 O below it there."""
    r = run_child(PIPELINE_STEP + f"""
peaks = {{}}
for name, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
    d = memlens.predict(lambda: step(cls), gpu="H100", world_size={S}, cublas_workspaces=False,
                        kernel_scratch=False)
    peaks[name] = [x.peak_allocated for x in d.results]
result = peaks
""")
    A, O = M * H * F, M * D * F
    diff = [g - f for g, f in zip(r["gpipe"], r["1f1b"])]
    by_hand = [(N - 1 - (S - s)) * (A + O) for s in range(S - 1)] + [(N - 2) * A]
    assert diff == by_hand == [135_168, 270_336, 405_504, 524_288]
    standard = [(N - (S - s)) * (A + O) for s in range(S)]
    assert [st - d for st, d in zip(standard, diff)] == [A + O, A + O, A + O, A + 5 * O]


def test_the_first_stage_that_does_not_fit_is_named():
    """1F1B: the first stage holds the most in flight; with capacity between its need and the last stage's,
    only the first stages fail, each naming the op that would not fit."""
    r = run_child(pipeline_step(16, 65536, 64, 6) + READERS + f"""
loose = memlens.predict(lambda: step(Schedule1F1B), gpu="H100", world_size={S}, cuda_context=0, nccl_bytes=0)
need = [x.device_bytes_needed for x in loose.results]
cap = (need[0] + need[-1]) // 2
tight = memlens.predict(lambda: step(Schedule1F1B), gpu="H100", capacity=cap, world_size={S}, cuda_context=0,
                        nccl_bytes=0)
result = {{"need": need, "reserved": [x.peak_reserved for x in loose.results], "cap": cap,
          "tight": [[x.fits, x.oom] for x in tight.results], "fits": tight.fits()}}
""")
    need, cap = r["need"], r["cap"]
    assert need == r["reserved"]                      # no CUDA context, no NCCL allowance: reserved only
    assert need == sorted(need, reverse=True) and need[0] > need[-1]   # fewer in flight further down
    for (fits, oom), n in zip(r["tight"], need):
        assert fits == (n <= cap)
        assert (oom is None) == fits
        if oom:
            assert "aten::" in oom
    assert r["fits"] is False


def test_a_stage_without_shapes_is_refused_clearly():
    r = run_child(PIPELINE_STEP + f"""
d = memlens.predict(lambda: step(ScheduleGPipe, static=False), gpu="H100", world_size=2)
result = {{"fits": d.fits(), "errors": d.errors, "ran": sorted(d.predictions)}}
""")
    assert r["fits"] is None and r["ran"] == [0, 1]
    for rank in ("0", "1"):
        assert "PipelineShapesNeeded" in r["errors"][rank] and "input_args" in r["errors"][rank]


def test_cli_pipeline_script_prints_one_row_per_stage(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from _predict_cases import ROOT
    script = tmp_path / "train_pp.py"
    # the stage step of the tests above, as a script: one process per rank under torch's launcher
    script.write_text(pipeline_step(D, H, M, N) + 'dist.init_process_group("nccl")\nstep(Schedule1F1B)\n'
                      'dist.destroy_process_group()\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "memlens", "predict", "--gpu", "H100", "--world-size", str(S),
                           "--strategy", "pp", "--no-kernel-scratch", "--json", "--report", str(tmp_path / "r.html"),
                           "--", "python", str(script)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert s["strategies"] == ["pp"] and s["strategy_error"] is None
    assert [(r["rank"], r["ran"], r["stages"]) for r in s["ranks"]] == [(k, True, [k]) for k in range(S)]
    # the script keeps nothing after its step; cuBLAS's modelled workspaces (on by default) only add bytes, the
    # same on every stage, so the differences between stages are the reference's
    peaks = [r["peak_allocated"] for r in s["ranks"]]
    ref = [expected_peak("1f1b", k) for k in range(S)]
    assert [p - peaks[-1] for p in peaks] == [x - ref[-1] for x in ref]
    page = (tmp_path / "r.html").read_text()
    assert "rank 0: stage 0; rank 1: stage 1; rank 2: stage 2; rank 3: stage 3" in page
    # the step time joins the stages on one clock (tests/integration/test_predict_pipeline_time.py): each stage receives N
    # activations (not the first) and N gradients (not the last) of M x D fp32
    t = s["step_time"]
    assert [t[str(k)]["p2p_bytes"] for k in range(S)] == [N * M * D * F * ((k > 0) + (k < S - 1)) for k in range(S)]
    assert all(t[str(k)]["step_ns"] == t[str(k)]["own_step_ns"] + t[str(k)]["wait_ns"] for k in range(S))
    assert {t[str(k)]["pipeline_step_ns"] for k in range(S)} == {max(t[str(k)]["step_ns"] for k in range(S))}


def test_interleaved_schedule_two_stages_per_rank_holds_both_stages_state():
    """ScheduleInterleaved1F1B, 2 ranks x 2 stages (rank r runs stages r and r + 2): after the step each rank
    still holds, by hand, both stages' parameters and gradients and their receive buffers."""
    r = run_child(PIPELINE_STEP + interleaved_step("ScheduleInterleaved1F1B") + f"""
d = memlens.predict(step_interleaved, gpu="H100", world_size=2, cublas_workspaces=False, kernel_scratch=False)
def held(p):
    b = p.trace.blocks
    return int(b[(b.device == "cuda:0") & b.free_ns.isna()].requested_size.sum())
result = {{"rows": rows(d), "held": {{r: held(p) for r, p in d.predictions.items()}}, "errors": d.errors}}
""")
    W, O = H * D * F, M * D * F
    assert r["errors"] == {}
    assert [row[:4] for row in r["rows"]] == [[0, True, 0, [0, 2]], [1, True, 1, [1, 3]]]
    # two stages' parameters and gradients (2 x 2W each); receive buffers per microbatch: stage 0 gradients,
    # stages 1 and 2 activations and gradients, stage 3 activations; the last stage keeps its N outputs
    assert r["held"]["0"] == 8 * W + (1 + 2) * N * O
    assert r["held"]["1"] == 8 * W + (2 + 1) * N * O + N * O


def test_a_stage_whose_inputs_need_no_gradient_is_noted():
    """A real run would hang (stage 0 waits for a gradient stage 1 never sends); the fake group completes the
    receive, so the prediction says so instead of passing silently."""
    r = run_child(PIPELINE_STEP.replace("requires_grad_(rank > 0)", "requires_grad_(False)") + """
d = memlens.predict(lambda: step(ScheduleGPipe), gpu="H100", world_size=2, ranks="first")
result = {"notes": d.notes, "errors": d.errors, "symmetry": d.symmetry, "ran": [x.ran for x in d.results]}
""")
    assert r["errors"] == {}
    # ranks="first" would let rank 0 stand for all; pipeline stages differ, so every rank runs anyway
    assert r["ran"] == [True, True] and r["symmetry"].endswith("(ranks='first' overridden)")
    assert [n for n in r["notes"] if n.startswith("pipeline stage")] == [
        "pipeline stage 1: none of its input_args requires grad, so its backward sends no gradient to stage 0, "
        "whose gradient receive would wait for ever in a real run; give input_args that require grad as the "
        "previous stage's output does"]
