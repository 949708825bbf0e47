"""Pipeline step time (`memlens.prediction.distributed.pipeline_time`): stages joined on one modeled clock.

Hand-built schedules are checked to the nanosecond against hand-worked timelines and the textbook formulas
(GPipe and 1F1B: ``(M + S - 1)(F + B)`` with equal per-microbatch times and free transfers, bubble fraction
``(S - 1) / (M + S - 1)``); a real predicted pipeline (torch's schedules under the fake process group) is
checked against a stage-by-stage GPipe recurrence written here from the ops the test reads itself.
"""
from __future__ import annotations

import pytest

from memlens.prediction.distributed.pipeline_time import PipelineTimingError, p2p_ns, simulate
from _predict_cases import built_shim, interleaved_step, pipeline_step, run_child  # noqa: F401  (the shim fixture)


def gpipe_order(s: int, S: int, M: int) -> list:
    return [("F", m) for m in range(M)] + [("B", m) for m in range(M)]


def one_f_one_b_order(s: int, S: int, M: int) -> list:
    """torch's Schedule1F1B on stage s: min(M, S - s) warm-up forwards, then backward/forward pairs."""
    warm = min(M, S - s)
    order = [("F", m) for m in range(warm)]
    for b in range(M):
        order.append(("B", b))
        if warm + b < M:
            order.append(("F", warm + b))
    return order


def plans_for(order, S: int, M: int, F: int, B: int, prelude=0, gap=0) -> dict:
    """One rank per stage; each action waits on its neighbour's (activation from s - 1, gradient from
    s + 1); the bytes are the stage index + 1 (the transfer functions below read them)."""
    plans = {}
    for s in range(S):
        acts = []
        for k, m in order(s, S, M):
            recv = [[s - 1, 100]] if k == "F" and s > 0 else [[s + 1, 100]] if k == "B" and s < S - 1 else []
            acts.append({"kind": k, "stage": s, "mb": m, "start_op": 0, "end_op": 0,
                         "dur_ns": F if k == "F" else B, "gap_ns": gap, "recv": recv})
        plans[s] = {"rank": s, "prelude_ns": prelude, "actions": acts, "busy_ns": prelude + M * (F + B) + M * 2 * gap,
                    "own_step_ns": prelude + M * (F + B) + 2 * M * gap}
    return plans


@pytest.mark.parametrize("order", [gpipe_order, one_f_one_b_order])
@pytest.mark.parametrize("S,M,F,B", [(2, 3, 10, 20), (4, 4, 7, 13), (4, 8, 10, 10), (2, 1, 5, 9), (4, 16, 3, 11)])
def test_free_transfers_give_the_textbook_step_and_bubble(order, S, M, F, B):
    sim = simulate(plans_for(order, S, M, F, B), lambda nbytes, src, dst: 0)
    step = (M + S - 1) * (F + B)
    assert sim["pipeline_step_ns"] == step
    for s, r in sim["ranks"].items():
        assert r["busy_ns"] == M * (F + B)
        assert r["bubble_ns"] == (S - 1) * (F + B)                       # = step x (S - 1) / (M + S - 1)
        assert r["bubble_ns"] * (M + S - 1) == step * (S - 1)
        assert r["p2p_ns"] == 0 and r["p2p_bytes"] == 100 * M * ((s > 0) + (s < S - 1))
    # the first stage ends the step; stage s ends (S - 1 - s) x B earlier under GPipe (its last backward
    # needs only the stages after it)
    if order is gpipe_order:
        assert [sim["ranks"][s]["step_ns"] for s in range(S)] == [step - s * B for s in range(S)]
        assert [sim["ranks"][s]["wait_ns"] for s in range(S)] == [(S - 1) * F + (S - 1 - s) * B for s in range(S)]


def test_two_stage_1f1b_with_transfers_by_hand():
    """S = 2, M = 3, F = 10, B = 20, every transfer 3 ns; worked by hand:
    stage 0: F0 [0,10] F1 [10,20] | B0 waits for stage 1's B0 (ends 43) + 3 = 46: [46,66] | F2 [66,76] |
             B1 [76,96] (stage 1's B1 ends 73, + 3 = 76: no wait) | B2 waits 112 - 96: [112,132]
    stage 1: F0 waits 13: [13,23] | B0 [23,43] | F1 [43,53] (arrived 23) | B1 [53,73] |
             F2 waits 79 - 73: [79,89] | B2 [89,109]"""
    sim = simulate(plans_for(one_f_one_b_order, 2, 3, 10, 20), lambda nbytes, src, dst: 3)
    assert sim["pipeline_step_ns"] == 132
    r0, r1 = sim["ranks"][0], sim["ranks"][1]
    assert [(a["kind"], a["mb"], a["start_ns"], a["end_ns"]) for a in r0["actions"]] == [
        ("F", 0, 0, 10), ("F", 1, 10, 20), ("B", 0, 46, 66), ("F", 2, 66, 76), ("B", 1, 76, 96), ("B", 2, 112, 132)]
    assert [(a["kind"], a["mb"], a["start_ns"], a["end_ns"]) for a in r1["actions"]] == [
        ("F", 0, 13, 23), ("B", 0, 23, 43), ("F", 1, 43, 53), ("B", 1, 53, 73), ("F", 2, 79, 89), ("B", 2, 89, 109)]
    assert (r0["wait_ns"], r1["wait_ns"]) == (26 + 16, 13 + 6)
    assert (r0["step_ns"], r1["step_ns"]) == (132, 109)
    assert (r0["bubble_ns"], r1["bubble_ns"]) == (132 - 90, 132 - 90)
    assert (r0["p2p_ns"], r1["p2p_ns"]) == (9, 9)


@pytest.mark.parametrize("S,M,F,B,T", [(2, 4, 10, 20, 3), (4, 6, 9, 17, 5), (4, 8, 12, 12, 12)])
def test_gpipe_with_transfers_adds_two_per_stage_boundary(S, M, F, B, T):
    """GPipe with a transfer of T <= F, B per message: the forward wave crosses S - 1 links, the backward wave
    S - 1 more, so the step is (M + S - 1)(F + B) + 2 (S - 1) T."""
    sim = simulate(plans_for(gpipe_order, S, M, F, B), lambda nbytes, src, dst: T)
    assert sim["pipeline_step_ns"] == (M + S - 1) * (F + B) + 2 * (S - 1) * T


def test_messages_over_one_link_go_one_after_another():
    """GPipe, S = 2, M = 3, F = B = 1, transfers of 5 ns: the activations leave at 1, 2, 3 but the link takes
    them at [1,6], [6,11], [11,16]; stage 1 runs F at 6, 11, 16, its B's at 17..20; the gradients cross at
    [18,23], [23,28], [28,33]; stage 0's B's run at 23, 28, 33: the step ends at 34 (18 if the link carried
    them at once)."""
    sim = simulate(plans_for(gpipe_order, 2, 3, 1, 1), lambda nbytes, src, dst: 5)
    assert [a["start_ns"] for a in sim["ranks"][1]["actions"]] == [6, 11, 16, 17, 18, 19]
    assert [a["start_ns"] for a in sim["ranks"][0]["actions"]] == [0, 1, 2, 23, 28, 33]
    assert sim["pipeline_step_ns"] == 34


def test_prelude_and_gaps_run_on_their_rank():
    """Each rank first runs a 5 ns prelude, and 2 ns after every action (the loss, the send): GPipe S = 2,
    M = 2, F = 10, B = 20, free transfers. Stage 0: F [5,15] [17,27]; stage 1: F0 at 15 [15,25], F1 at
    max(27, 27) [27,37], B0 [39,59], B1 [61,81]; stage 0: B0 at 59 [59,79], B1 at max(81, 81) [81,101],
    then its last 2 ns: 103."""
    sim = simulate(plans_for(gpipe_order, 2, 2, 10, 20, prelude=5, gap=2), lambda nbytes, src, dst: 0)
    assert [a["start_ns"] for a in sim["ranks"][0]["actions"]] == [5, 17, 59, 81]
    assert [a["start_ns"] for a in sim["ranks"][1]["actions"]] == [15, 27, 39, 61]
    assert sim["pipeline_step_ns"] == 103 and sim["ranks"][1]["step_ns"] == 83


def test_a_receive_without_its_sender_is_a_clear_error():
    plans = plans_for(gpipe_order, 2, 2, 1, 1)
    plans[1]["actions"][0]["recv"] = [[7, 100]]
    with pytest.raises(PipelineTimingError, match="receives from rank 7"):
        simulate(plans, lambda nbytes, src, dst: 0)


def test_p2p_transfer_by_hand():
    from memlens.devicetime.gpus import gpu
    h = gpu("H100")
    assert h.gpus_per_node == 8
    assert p2p_ns(4096, 0, 1, h) == pytest.approx(1000 + 4096 / (0.8 * h.nvlink_bw) * 1e9)
    assert p2p_ns(4096, 7, 8, h) == pytest.approx(5000 + 4096 / (0.8 * h.network_bw) * 1e9)   # across nodes
    assert p2p_ns(4096, 3, 3, h) == 0


D, H, MB, N = 64, 256, 16, 4      # every stage Linear(D, H) -> ReLU -> Linear(H, D); N microbatches of MB rows

PIPELINE = pipeline_step(D, H, MB, N)     # step(schedule): one stage per rank (tests/_predict_cases.py)


def _real(schedule: str, S: int) -> dict:
    return run_child(PIPELINE + f"""
d = memlens.predict(lambda: step({schedule}), gpu="H100", world_size={S}, cublas_workspaces=False,
                    kernel_scratch=False)
t = d.step_time()
ops = {{r: [[int(i), n, int(s), int(e)] for i, n, s, e in zip(p.trace.ops.op_id, p.trace.ops.name,
        p.trace.ops.start_ns, p.trace.ops.end_ns)] for r, p in d.predictions.items()}}
tt = d.timed_trace(0)
result = {{"errors": d.errors, "ops": ops,
          "record": {{r: p.trace.metadata["prediction"]["pipeline"] for r, p in d.predictions.items()}},
          "time": {{r: {{k: v for k, v in x.items() if k not in ("schedule", "ddp_all_reduces")}}
                   for r, x in t.items()}},
          "schedule": {{r: [[int(i), str(st), int(s), int(e), int(w)] for i, st, s, e, w in zip(
              x["schedule"].op_id, x["schedule"].stream, x["schedule"].start_ns, x["schedule"].end_ns,
              x["schedule"].wait_ns)] for r, x in t.items()}},
          "timed_end": int(tt.ops.end_ns.max()), "timed_clock": tt.metadata["clock"]["kind"],
          "timed_step": tt.metadata["prediction"]["step_time"]["step_ns"]}}
""")


def _own_clock(ops):
    """E(p): the compute stream's time when every op with id < p has run, p2p ops taking no time (no
    collective in these traces: ops run back to back in id order)."""
    dur = {i: (0 if n in ("c10d::send", "c10d::recv_") else e - s) for i, n, s, e in ops}
    ids = sorted(dur)

    def done_by(p):
        return sum(dur[i] for i in ids if i < p)
    return done_by, sum(dur.values())


@pytest.mark.parametrize("S", [2, 4])
def test_real_gpipe_step_is_the_stage_by_stage_recurrence(S):
    r = _real("ScheduleGPipe", S)
    assert r["errors"] == {}
    from memlens.devicetime.gpus import gpu
    T = 1000 + MB * D * 4 / (0.8 * gpu("H100").nvlink_bw) * 1e9     # one fp32 activation or gradient, NVLink
    fwd_end = {}
    bwd_end = {}
    clock = {}
    parts = {}
    for s in range(S):
        done_by, total = _own_clock(r["ops"][str(s)])
        acts = sorted(r["record"][str(s)]["actions"], key=lambda a: a["start"])
        # torch's GPipe on every stage: all forwards, then all backwards, in microbatch order
        assert [(a["kind"], a["mb"]) for a in acts] == gpipe_order(s, S, N)
        starts = [done_by(a["start"]) for a in acts]
        ends = [done_by(a["end"]) for a in acts]
        after = starts[1:] + [total]                     # gap: to the next action's start, the last: epilogue
        parts[s] = (starts, ends, after)
        t = starts[0]
        for k in range(N):                               # forwards: wait for stage s - 1's activation
            begin = max(t, fwd_end[s - 1, k] + T) if s else t
            fwd_end[s, k] = begin + ends[k] - starts[k]
            t = fwd_end[s, k] + after[k] - ends[k]
        clock[s] = t
    for s in reversed(range(S)):                         # backwards: wait for stage s + 1's gradient
        t = clock[s]
        starts, ends, after = parts[s]
        for k in range(N, 2 * N):
            m = k - N
            begin = max(t, bwd_end[s + 1, m] + T) if s < S - 1 else t
            bwd_end[s, m] = begin + ends[k] - starts[k]
            t = bwd_end[s, m] + after[k] - ends[k]
        clock[s] = t
    step = max(clock.values())
    times = r["time"]
    assert times["0"]["pipeline_step_ns"] == pytest.approx(step, abs=S * 2 * N)    # ns rounding per action
    for s in range(S):
        x = times[str(s)]
        assert x["step_ns"] == pytest.approx(clock[s], abs=S * 2 * N)
        assert x["busy_ns"] == _own_clock(r["ops"][str(s)])[1] == x["own_step_ns"]
        assert x["step_ns"] == x["own_step_ns"] + x["wait_ns"]
        assert x["bubble_ns"] == x["pipeline_step_ns"] - x["busy_ns"]
        # receives: N activations (not on the first stage) and N gradients (not on the last), MB x D fp32
        assert x["p2p_bytes"] == N * MB * D * 4 * ((s > 0) + (s < S - 1))
        assert x["p2p_ns"] == N * round(T) * ((s > 0) + (s < S - 1))     # each transfer in whole ns
    assert r["timed_clock"] == "modeled" and r["timed_end"] == times["0"]["step_ns"] == r["timed_step"]


def test_real_1f1b_runs_torch_order_and_the_first_stage_waits_most():
    S = 4
    r = _real("Schedule1F1B", S)
    assert r["errors"] == {}
    for s in range(S):
        acts = sorted(r["record"][str(s)]["actions"], key=lambda a: a["start"])
        assert [(a["kind"], a["mb"]) for a in acts] == one_f_one_b_order(s, S, N)
        recv = r["record"][str(s)]["recvs"]
        assert sorted(p for x in recv if x["kind"] == "F" for p, _ in x["peers"]) == ([s - 1] * N if s else [])
        assert sorted(p for x in recv if x["kind"] == "B" for p, _ in x["peers"]) == (
            [s + 1] * N if s < S - 1 else [])
    times = r["time"]
    step = max(times[str(s)]["step_ns"] for s in range(S))
    assert all(times[str(s)]["pipeline_step_ns"] == step for s in range(S))
    # a rank's actions never overlap and start no earlier than their input's sender ended + the transfer
    ends = {}
    for s in range(S):
        acts = times[str(s)]["pipeline_actions"]
        assert all(a["end_ns"] <= b["start_ns"] for a, b in zip(acts, acts[1:]))
        for a in acts:
            ends[s, a["kind"], a["mb"]] = a
    from memlens.devicetime.gpus import gpu
    T = 1000 + MB * D * 4 / (0.8 * gpu("H100").nvlink_bw) * 1e9
    for (s, k, m), a in ends.items():
        src = (s - 1, "F", m) if k == "F" else (s + 1, "B", m)
        if src in ends:
            assert a["start_ns"] >= ends[src]["end_ns"] + T - 1


# ---- the shifted per-rank schedule against hand-made slot tables --------------------------------------------
# Which microbatch each rank runs at each slot, worked by hand with every forward and backward one slot long
# and free transfers (a forward on rank s waits for rank s - 1's forward of that microbatch, a backward for
# rank s + 1's backward; a rank runs its own actions in torch's order), 2 stages, 4 microbatches.
GPIPE_SLOTS_2x4 = [  # slot: (rank 0, rank 1)
    ("F0", None), ("F1", "F0"), ("F2", "F1"), ("F3", "F2"), (None, "F3"),
    (None, "B0"), ("B0", "B1"), ("B1", "B2"), ("B2", "B3"), ("B3", None)]
ONE_F_ONE_B_SLOTS_2x4 = [
    ("F0", None), ("F1", "F0"), (None, "B0"), ("B0", "F1"), ("F2", "B1"),
    ("B1", "F2"), ("F3", "B2"), ("B2", "F3"), (None, "B3"), ("B3", None)]


def unit_slots(order, S: int, M: int) -> list:
    """The slot table of `order` (S ranks, M microbatches) with unit-length actions and free transfers:
    each action in the first slot after its rank's previous action and after its sender's action."""
    done, table = {}, []
    todo = {s: list(order(s, S, M)) for s in range(S)}
    while any(todo.values()):
        row = [None] * S
        for s in range(S):
            if not todo[s]:
                continue
            kind, m = todo[s][0]
            sender = (s - 1, "F", m) if kind == "F" else (s + 1, "B", m) if s < S - 1 else (s, "F", m)
            if (sender[0] < 0 or sender in done) and done.get(sender, -1) < len(table):
                row[s] = f"{kind}{m}"
        for s, name in enumerate(row):
            if name:
                done[(s, name[0], int(name[1:]))] = len(table)
                todo[s].pop(0)
        table.append(tuple(row))
    return table


def test_the_slot_tables_by_hand_are_the_unit_recurrence():
    assert unit_slots(gpipe_order, 2, 4) == GPIPE_SLOTS_2x4
    assert unit_slots(one_f_one_b_order, 2, 4) == ONE_F_ONE_B_SLOTS_2x4


def _shifted_actions(r: dict, s: int) -> list:
    """(kind, mb, start, end) ns of rank s's actions read from its shifted schedule (the joined clock): an
    action runs from its first compute op's start to the end of its last compute op."""
    comp = sorted((i, b, e) for i, stream, b, e, _ in r["schedule"][str(s)] if stream == "compute")
    out = []
    for a in r["record"][str(s)]["actions"]:
        mine = [(b, e) for i, b, e in comp if a["start"] <= i < a["end"]]
        out.append((a["kind"], a["mb"], min(b for b, _ in mine), max(e for _, e in mine)))
    return sorted(out, key=lambda x: x[2])


@pytest.mark.parametrize("schedule, S", [("ScheduleGPipe", 2), ("Schedule1F1B", 2), ("ScheduleGPipe", 4),
                                         ("Schedule1F1B", 4)])
def test_real_shifted_schedule_runs_the_slot_table(schedule, S):
    """The per-rank schedule shifted onto the joined clock, compared action by action: each rank runs the
    slot table's actions in its order, and each starts exactly when the later of its rank's previous action
    (plus the rank's own gap between them) and its sender's action plus one transfer lets it, walking the
    table slot by slot (a recurrence on the ranks' own op times, read from their unshifted ops)."""
    order = gpipe_order if schedule == "ScheduleGPipe" else one_f_one_b_order
    table = unit_slots(order, S, N)
    if S == 2:
        assert table == (GPIPE_SLOTS_2x4 if schedule == "ScheduleGPipe" else ONE_F_ONE_B_SLOTS_2x4)
    r = _real(schedule, S)
    assert r["errors"] == {}
    from memlens.devicetime.gpus import gpu
    T = round(1000 + MB * D * 4 / (0.8 * gpu("H100").nvlink_bw) * 1e9)
    got = {s: _shifted_actions(r, s) for s in range(S)}
    for s in range(S):
        assert [f"{k}{m}" for k, m, _, _ in got[s]] == [row[s] for row in table if row[s]]
    # expected starts: the rank's own timeline (ops back to back, p2p free) delayed by the waits
    own = {}
    for s in range(S):
        done_by, total = _own_clock(r["ops"][str(s)])
        acts = sorted(r["record"][str(s)]["actions"], key=lambda a: a["start"])
        starts = [done_by(a["start"]) for a in acts] + [total]
        own[s] = {f"{a['kind']}{a['mb']}": (starts[k], done_by(a["end"]) - starts[k], starts[k + 1] - done_by(a["end"]))
                  for k, a in enumerate(acts)}
    clock = {s: None for s in range(S)}
    end = {}
    for row in table:
        for s, name in enumerate(row):
            if not name:
                continue
            first, dur, gap = own[s][name]
            ready = first if clock[s] is None else clock[s]
            kind, m = name[0], int(name[1:])
            sender = (s - 1, f"F{m}") if kind == "F" and s > 0 else (s + 1, f"B{m}") if kind == "B" and s < S - 1 \
                else None
            begin = max(ready, end[sender] + T) if sender else ready
            end[s, name] = begin + dur
            clock[s] = begin + dur + gap
    for s in range(S):
        for k, m, b, e in got[s]:
            assert b == pytest.approx(end[s, f"{k}{m}"] - own[s][f"{k}{m}"][1], abs=2 * N * S), (s, k, m)
    waits = {s: sum(w for *_, w in r["schedule"][str(s)]) for s in range(S)}
    assert waits == {s: r["time"][str(s)]["wait_ns"] for s in range(S)}


@pytest.mark.parametrize("schedule", ["ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"])
def test_real_interleaved_schedules_wait_exactly_for_their_sender(schedule):
    """2 ranks x 2 stages (rank r runs stages r and r + 2), torch's interleaved schedules (zero bubble: input
    gradient "I" and weight gradient "W" apart): every action that waited starts exactly when its input
    arrived (its sender's end + one transfer, NVLink), and one that did not wait starts no earlier."""
    r = run_child(PIPELINE + interleaved_step(schedule) + """
d = memlens.predict(step_interleaved, gpu="H100", world_size=2, cublas_workspaces=False, kernel_scratch=False)
t = d.step_time()
result = {"errors": d.errors, "actions": {r: x["pipeline_actions"] for r, x in t.items()},
          "steps": {r: [x["step_ns"], x["pipeline_step_ns"], x["own_step_ns"], x["wait_ns"]] for r, x in t.items()}}
""")
    assert r["errors"] == {}
    from memlens.devicetime.gpus import gpu
    T = 1000 + MB * D * 4 / (0.8 * gpu("H100").nvlink_bw) * 1e9
    acts = {(a["stage"], a["kind"], a["mb"]): a for x in r["actions"].values() for a in x}
    kinds = {k for _, k, _ in acts}
    assert kinds == ({"F", "B"} if schedule == "ScheduleInterleaved1F1B" else {"F", "I", "W"})
    assert len(acts) == 4 * N * len(kinds)                  # 4 stages x N microbatches per kind
    grad = "B" if "B" in kinds else "I"
    waited = 0
    for (s, k, m), a in acts.items():
        src = (s - 1, "F", m) if k == "F" and s > 0 else (s + 1, grad, m) if k == grad and s < 3 else None
        if src is None:
            assert a["wait_ns"] == 0
            continue
        arrive = acts[src]["end_ns"] + T
        if a["wait_ns"] > 0:
            waited += 1
            assert a["start_ns"] == pytest.approx(arrive, abs=2)
        else:
            assert a["start_ns"] >= arrive - 2
    assert waited > 0
    for step, whole, own, wait in r["steps"].values():
        assert step == own + wait and whole == max(x[0] for x in r["steps"].values())


def test_a_second_step_waits_for_the_second_steps_sender():
    """Two GPipe steps, S = 2, M = 2, F = 10, B = 20, free transfers. Step 1: stage 0 F [0,10] [10,20], stage
    1 F [10,20] [20,30], B [30,50] [50,70], stage 0 B [50,70] [70,90]; stage 0 ends at 90, stage 1 at
    70. Step 2: stage 0 F0 [90,100] F1 [100,110]; stage 1 F0 waits for 100: [100,110], F1 [110,120], B0
    [120,140], B1 [140,160]; stage 0 B0 waits for 140: [140,160], B1 [160,180]."""
    one = plans_for(gpipe_order, 2, 2, 10, 20)
    plans = {}
    for s, p in one.items():
        acts = [{**a, "it": it} for it in (0, 1) for a in p["actions"]]
        plans[s] = {**p, "actions": acts, "busy_ns": 2 * p["busy_ns"], "own_step_ns": 2 * p["own_step_ns"]}
    sim = simulate(plans, lambda nbytes, src, dst: 0)
    assert [a["start_ns"] for a in sim["ranks"][0]["actions"]] == [0, 10, 50, 70, 90, 100, 140, 160]
    assert [a["start_ns"] for a in sim["ranks"][1]["actions"]] == [10, 20, 30, 50, 100, 110, 120, 140]
    assert sim["pipeline_step_ns"] == 180 and sim["ranks"][1]["step_ns"] == 160
