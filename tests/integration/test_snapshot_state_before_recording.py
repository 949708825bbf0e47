"""Blocks alive before the recording began, whose allocation stacks only the snapshot's final state keeps, go
through the same rules as blocks allocated inside the trace: optimizer state by its frames (a user's own
optimizer's ``step``, torch's ``_init_group``), the phase its frames name, and the user's own rules."""
from __future__ import annotations

import pickle

import pytest

import memlens
from memlens.analysis.peak import peak_breakdown
from memlens.io.safe_pickle import load_pickle

MODULE = "/x/torch/nn/modules/module.py"
P1, P2 = 8192, 2048
SEG = 0x100000


def _frames(*frames):
    return [{"filename": f, "line": line, "name": n} for n, f, line in frames]


INIT = _frames(("__init__", "/x/torch/nn/modules/linear.py", 100), ("build", "lab/model.py", 5))
FWD = _frames(("forward", "lab/model.py", 20), ("_call_impl", MODULE, 1), ("main", "lab/train.py", 30))
# a hand-written AdamW's lazy state: torch.zeros_like(p) inside its `step`, in the user's training file
USER_STEP = _frames(("at::zeros_like", "", 0), ("step", "lab/train.py", 61), ("main", "lab/train.py", 90))
# torch's AdamW: the state made in _init_group under torch/optim
TORCH_STEP = _frames(("_init_group", "/x/torch/optim/adamw.py", 150), ("step", "/x/torch/optim/adamw.py", 200),
                     ("main", "lab/train.py", 90))

# what the final state holds that the trace never allocated: (address, size, frames, what it holds by hand)
BEFORE = [
    (SEG + 0x0000, P1, INIT, "parameter"), (SEG + 0x2000, P2, INIT, "parameter"),
    (SEG + 0x9000, P1, "step", "optimizer_state"), (SEG + 0xB000, P1, "step", "optimizer_state"),  # exp_avg(_sq)
    (SEG + 0xD000, P2, "step", "optimizer_state"), (SEG + 0xE000, P2, "step", "optimizer_state"),
]
KEPT_ODD = (SEG + 0x13000, 777)  # the step made it and keeps it; the size of no parameter: not state


def _snapshot(step_frames, began_in_step: bool = False) -> dict:
    """A snapshot whose recording began after the first optimizer step (or, `began_in_step`, inside it):
    parameters and the step's state are only in the final state (`BEFORE`, with the 777-byte block the step
    keeps); the trace holds a forward (a P1 activation alive at the end, a 512-byte temporary). Begun inside
    the step, the trace first frees a P1-sized block the step made before recording (its temporary), then
    the loop's own code makes the next batch (4096 bytes), before the forward."""
    ev, t = [], [0]

    def add(action, addr, size, frames):
        for a in ([action, "free_completed"] if action == "free_requested" else [action]):
            t[0] += 1
            ev.append({"action": a, "addr": addr, "size": size, "stream": 0, "time_us": t[0],
                       "frames": frames if a != "free_completed" else []})

    if began_in_step:
        add("free_requested", SEG + 0x10000, P1, step_frames)
        add("alloc", SEG + 0x14000, 4096, _frames(("main", "lab/train.py", 25)))
    add("alloc", SEG + 0x3000, P1, FWD)
    add("alloc", SEG + 0x5000, 512, FWD)
    add("free_requested", SEG + 0x5000, 512, FWD)
    blocks = [{"address": a, "size": s, "requested_size": s, "state": "active_allocated",
               "frames": step_frames if f == "step" else f} for a, s, f, _ in BEFORE]
    blocks.append({"address": KEPT_ODD[0], "size": KEPT_ODD[1], "requested_size": KEPT_ODD[1],
                   "state": "active_allocated", "frames": step_frames})
    blocks.append({"address": SEG + 0x3000, "size": P1, "requested_size": P1, "state": "active_allocated",
                   "frames": FWD})
    if began_in_step:
        blocks.append({"address": SEG + 0x14000, "size": 4096, "requested_size": 4096,
                       "state": "active_allocated", "frames": _frames(("main", "lab/train.py", 25))})
    segment = {"device": 0, "address": SEG, "total_size": 1 << 20, "stream": 0, "segment_type": "large",
               "blocks": blocks}
    return {"segments": [segment], "device_traces": [ev]}


def _load(tmp_path, snapshot, name="s.pickle"):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snapshot))
    return memlens.load(path)


def _by_addr(trace) -> dict:
    b = trace.blocks
    return {int(a): (str(c), str(r)) for a, c, r in zip(b["addr"], b["category"], b["category_rule"])}


@pytest.mark.parametrize("began_in_step", [False, True])
def test_user_optimizer_state_made_before_recording(tmp_path, began_in_step):
    trace = _load(tmp_path, _snapshot(USER_STEP, began_in_step))
    got = _by_addr(trace)
    for addr, _, _, expected in BEFORE:
        assert got[addr][0] == expected, (hex(addr), got[addr])
    state_rules = {got[a][1] for a, _, _, e in BEFORE if e == "optimizer_state"}
    assert len(state_rules) == 1 and next(iter(state_rules)).startswith("made by an optimizer's code")
    assert got[KEPT_ODD[0]][0] != "optimizer_state"
    assert got[SEG + 0x3000][0] == "activation"
    # the peak (the end): 2 * (P1 + P2) bytes of state, and nothing of the step's state unknown
    peak = peak_breakdown(trace)["cuda:0"]
    by = dict(zip(peak.by_category["category"], peak.by_category["bytes"]))
    assert by["optimizer_state"] == 2 * (P1 + P2)
    assert by.get("unknown", 0) == KEPT_ODD[1] + (4096 if began_in_step else 0)  # and the batch: nothing says


def test_torch_optimizer_state_made_before_recording_has_its_phase(tmp_path):
    trace = _load(tmp_path, _snapshot(TORCH_STEP))
    b = trace.blocks.set_index("addr")
    for addr, _, _, expected in BEFORE:
        assert b.loc[addr, "category"] == expected
        if expected == "optimizer_state":
            assert b.loc[addr, "phase"] == "optimizer_step"
            assert b.loc[addr, "category_rule"] == "allocated in the optimizer step and alive after it"


def test_user_rules_see_blocks_made_before_recording(tmp_path):
    user = _load(tmp_path, _snapshot(USER_STEP), "user.pickle")
    mine = memlens.categorize(user, [{"category": "moments", "function": "^step$"}, {"category": "@builtin"}])
    got = _by_addr(mine)
    step_made = [a for a, _, f, _ in BEFORE if f == "step"] + [KEPT_ODD[0]]
    assert all(got[a][0] == "moments" for a in step_made)
    assert got[SEG][0] == "parameter"
    torch_made = _load(tmp_path, _snapshot(TORCH_STEP), "torch.pickle")
    by_phase = _by_addr(memlens.categorize(torch_made, [("opt", "phase", "^optimizer_step$"), ("@builtin",)]))
    assert all(by_phase[a][0] == "opt" for a in step_made)
    assert by_phase[SEG + 0x3000][0] == "activation"


def _unknown_and_state(trace) -> tuple[float, int]:
    pb = peak_breakdown(trace)["cuda:0"]
    by = dict(zip(pb.by_category["category"], pb.by_category["bytes"]))
    return by.get("unknown", 0) / pb.peak_bytes, by.get("optimizer_state", 0)


def test_real_step_whose_recording_began_inside_it(shared, tmp_path):
    # cs336's training step (a user AdamW in optimizer.py) with every torch/optim frame and Optimizer
    # annotation removed, and the recording begun halfway through its optimizer step: the state that step
    # made before that point is known only by the final state's stacks (the user's `step` frames)
    path = shared("snapshots/cs336_wedsonlin_medium_128_training.pickle")
    _, full_state = _unknown_and_state(memlens.load(path))
    raw = load_pickle(path)

    def drop_torch_optim(frames):
        return [f for f in frames if "torch/optim/" not in str(f["filename"]).replace("\\", "/")]

    steps = [a["time_us"] for a in raw["external_annotations"] if a["name"].startswith("Optimizer.step")]
    middle = sum(steps) // 2
    events = raw["device_traces"][0]
    raw["device_traces"][0] = [dict(e, frames=drop_torch_optim(e.get("frames") or []))
                               for e in events if e["time_us"] >= middle]
    for seg in raw["segments"]:
        for blk in seg["blocks"]:
            blk["frames"] = drop_torch_optim(blk.get("frames") or [])
    raw["external_annotations"] = [a for a in raw["external_annotations"] if not a["name"].startswith("Optimizer.")]
    cut = len(events) - len(raw["device_traces"][0])
    assert 1000 < cut < len(events) - 1000  # the cut drops part of the step's events, not all
    twin = _load(tmp_path, raw, "began_mid_step.pickle")
    b = twin.blocks
    made_before = b["allocated_before"].astype(bool) & b["stack_id"].notna() & b["free_ns"].isna()
    assert int(b.loc[made_before, "size"].sum()) > 2**30  # a GiB of state made before the recording, with stacks
    unknown, state = _unknown_and_state(twin)
    assert unknown <= 0.02 and state >= 0.95 * full_state
