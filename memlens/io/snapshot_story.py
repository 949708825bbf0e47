"""What a CUDA snapshot's stacks say: the phase of every event, the phases of the run, and what each block holds.

A snapshot records no tensor roles, but its stacks and annotations tell them.

Phases. ``external_annotations`` (record_function ranges such as ``Optimizer.step#AdamW.step`` and
``Optimizer.zero_grad#AdamW.zero_grad``, and user ranges) are phases as recorded. Every event with a stack
also gets a phase from its frames: a frame under ``torch/optim/`` (the optimizer's ``step`` wrapper, or
``zero_grad``) is the optimizer step (or zero_grad); autograd engine frames (``torch::autograd::Engine``,
``torch.autograd.backward``) are the backward pass; a module call (``torch/nn/modules/module.py``
``_call_impl``) is the forward pass. Consecutive events of one phase form a run; short interruptions
(fewer than `MIN_RUN` events between two runs of the same phase) are absorbed. Annotated ranges win over
inferred ones where they overlap.

Model calls. In a forward pass, the line executing in the outermost module's ``forward`` advances through
its body; a new call starts when that line goes back (or the call site outside the model changes). A
layer loop keeps that line on the loop, so repeating layers are never taken for repeated calls.

Categories (REFERENCE section 4's names plus ``workspace``), each with the rule that decided it
(``category_rule``), first match wins:

1. ``optimizer_state``: allocated in the optimizer step and alive when it ends (AdamW ``exp_avg`` ...).
2. ``temporary`` (optimizer): allocated in the optimizer step and freed within it.
3. ``workspace``: a cuBLAS / cuDNN frame on the stack.
4. ``gradient``: allocated under autograd's AccumulateGrad, or in the backward pass and alive when it ends.
5. ``temporary`` (backward): allocated in the backward pass and freed within it.
6. ``activation``: allocated in the forward pass and alive when it ends (saved for backward, or outputs).
7. ``temporary`` (forward): allocated in the forward pass and freed within it.
8. ``input``: allocated outside any phase by a copy to the device (``to`` / ``copy_``), before a forward.
9. ``parameter`` (structure): alive before recording, no stack, with a same-size block that is a gradient
   or optimizer state (each parameter has a gradient and, with Adam, two state tensors of its size); the
   number of parameters of a size is half the state tensors of that size (Adam), else the gradients.
10. ``gradient`` / ``optimizer_state`` (structure): alive before recording with no stack, of a parameter's
    size, beyond the parameters' count (the previous step's gradients, the optimizer's state). Which of
    the same-size blocks is which is a guess by address order: the bytes per category are right, the
    individual assignment may not be.
10b. ``parameter`` (forward-only): a recording with a forward pass and no backward / optimizer step: alive
    before and after recording, no stack (the model's weights and buffers).
11. ``activation`` (free stack): allocation unseen, freed by the autograd engine (a saved tensor released
    by backward); ``temporary`` when freed in the forward or optimizer step.
12. ``unknown``: nothing says.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

MIN_RUN = 3  # a run of fewer events between two runs of the same phase is absorbed by them
PHASE_NAMES = ("forward", "backward", "optimizer_step", "zero_grad")
_OPTIMIZER_ANNOTATION = r"^Optimizer\.step#|^optimizer\.step$"
_ZERO_GRAD_ANNOTATION = r"^Optimizer\.zero_grad#"
_COPY_OPS = {"to", "_to_copy", "copy_", "_copy_from", "pin_memory", "empty_strided", "empty"}
_WORKSPACE = ("cublas", "cudnn", "CUDABlasHandle", "getCurrentCUDABlasHandle", "cublasLt", "workspace")


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def stack_facts(stacks: pd.DataFrame | None) -> pd.DataFrame:
    """Per stack_id: ``phase`` (a name of `PHASE_NAMES` or ""), ``accumulate_grad``, ``workspace``,
    ``model_key`` (outermost module forward function and its caller, "" outside a module call) and
    ``model_line`` (line executing in that forward, -1 when none)."""
    cols = {"stack_id": [], "phase": [], "accumulate_grad": [], "workspace": [], "model_key": [], "model_line": []}
    if stacks is None or len(stacks) == 0:
        return pd.DataFrame(cols)
    st = stacks.sort_values(["stack_id", "depth"], kind="stable")
    for sid, frames in st.groupby("stack_id", sort=True):
        names = frames["name"].astype(str).tolist()
        files = [_norm(f) for f in frames["filename"].astype(str).tolist()]
        lines = frames["line"].tolist()
        phase, accumulate, workspace = "", False, False
        in_optim = any("/torch/optim/" in f or f.startswith("torch/optim/") for f in files)
        if in_optim:
            phase = "zero_grad" if any(n == "zero_grad" for n, f in zip(names, files) if "/optim/" in f) \
                else "optimizer_step"
        elif any(n == "zero_grad" for n in names):
            phase = "zero_grad"
        elif any("torch::autograd::Engine::" in n or "AccumulateGrad" in n for n in names) or any(
                n in ("backward", "_engine_run_backward") and ("/torch/autograd/" in f or f.endswith("torch/_tensor.py"))
                for n, f in zip(names, files)):
            phase = "backward"
        elif any(n in ("_call_impl", "_wrapped_call_impl") and f.endswith("torch/nn/modules/module.py")
                 for n, f in zip(names, files)):
            phase = "forward"
        accumulate = any("AccumulateGrad" in n for n in names)
        workspace = any(any(w in n for w in _WORKSPACE) for n in names)
        key, line = "", -1
        # outermost module call: the last _call_impl frame (frames are innermost first); the model's forward is
        # the first Python frame inside it, its caller the first Python frame outside it
        call = [i for i, (n, f) in enumerate(zip(names, files))
                if n in ("_call_impl", "_wrapped_call_impl") and f.endswith("torch/nn/modules/module.py")]
        if call:
            outer = max(call)
            inner = next((i for i in range(outer - 1, -1, -1) if files[i].endswith(".py")
                          and not files[i].endswith("torch/nn/modules/module.py")), None)
            caller = next((i for i in range(outer + 1, len(names)) if files[i].endswith(".py")), None)
            if inner is not None:
                key = f"{files[inner]}:{names[inner]}<-" + (f"{files[caller]}:{lines[caller]}" if caller is not None else "")
                line = int(lines[inner])
        cols["stack_id"].append(int(sid))
        cols["phase"].append(phase)
        cols["accumulate_grad"].append(accumulate)
        cols["workspace"].append(workspace)
        cols["model_key"].append(key)
        cols["model_line"].append(line)
    return pd.DataFrame(cols)


def _smooth(labels: np.ndarray) -> np.ndarray:
    """Absorb runs shorter than `MIN_RUN` that lie between two runs of the same label."""
    if len(labels) == 0:
        return labels
    change = np.flatnonzero(labels[1:] != labels[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.append(change, len(labels))
    out = labels.copy()
    for k in range(1, len(starts) - 1):
        if ends[k] - starts[k] < MIN_RUN and labels[starts[k - 1]] == labels[starts[k + 1]]:
            out[starts[k]:ends[k]] = labels[starts[k - 1]]
    return out


def _runs(t_ns: np.ndarray, labels: np.ndarray, t_end: int, source: str) -> list[dict]:
    """Consecutive runs of equal non-empty labels as phases: each starts at its first event and ends where
    the next run starts (the last at `t_end`)."""
    keep = labels != ""
    t, lab = t_ns[keep], labels[keep]
    if len(lab) == 0:
        return []
    change = np.flatnonzero(lab[1:] != lab[:-1]) + 1
    starts = np.concatenate([[0], change])
    out = []
    for k, s in enumerate(starts):
        end = int(t[starts[k + 1]]) if k + 1 < len(starts) else int(max(t_end, t[-1]))
        out.append({"name": str(lab[s]), "start_ns": int(t[s]), "end_ns": end, "source": source})
    return out


def _annotation_phases(ops: pd.DataFrame) -> list[dict]:
    if ops is None or len(ops) == 0 or "kind" not in ops.columns:
        return []
    ann = ops[ops["kind"].astype(str) == "annotation"]
    out = []
    for r in ann.itertuples(index=False):
        name = str(r.name)
        kind = ("optimizer_step" if pd.Series([name]).str.contains(_OPTIMIZER_ANNOTATION).iloc[0] else
                "zero_grad" if pd.Series([name]).str.contains(_ZERO_GRAD_ANNOTATION).iloc[0] else name)
        out.append({"name": kind, "start_ns": int(r.start_ns), "end_ns": int(r.end_ns), "source": "annotation",
                    "label": name})
    return out


def infer_phases(trace) -> tuple[list[dict], np.ndarray, pd.DataFrame]:
    """(phases, phase of each event row, stack facts). Phases are dicts ``name``, ``start_ns``, ``end_ns``
    (ns), ``source`` ("annotation" or "frames"), sorted by start; annotated ranges replace the inferred
    phases they overlap."""
    ev = trace.events
    facts = stack_facts(trace.stacks)
    annotated = _annotation_phases(trace.ops)
    _, hi = trace.time_span_ns()
    if ev is None or len(ev) == 0:
        return sorted(annotated, key=lambda p: p["start_ns"]), np.empty(0, dtype=object), facts
    sid = pd.array(ev["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    phase_of = pd.Series(facts["phase"].to_numpy(dtype=object), index=facts["stack_id"].to_numpy())
    labels = np.full(len(ev), "", dtype=object)
    has = sid >= 0
    if len(facts):
        labels[has] = phase_of.reindex(sid[has]).fillna("").to_numpy(dtype=object)
    t = ev["t_ns"].to_numpy(dtype=np.int64)
    for p in annotated:  # an annotation is the phase of every event inside it
        if p["name"] in PHASE_NAMES:
            labels[(t >= p["start_ns"]) & (t <= p["end_ns"])] = p["name"]
    # events without a phase (no stack, or no telling frame) take the phase around them
    filled = pd.Series(labels).replace("", np.nan).ffill().fillna("").to_numpy(dtype=object)
    smooth = _smooth(filled)
    inferred = _runs(t, smooth, hi, "frames")
    spans = [(p["start_ns"], p["end_ns"]) for p in annotated if p["name"] in PHASE_NAMES]
    inferred = [p for p in inferred if not any(p["start_ns"] >= s and p["end_ns"] <= e for s, e in spans)]
    phases = sorted(inferred + annotated, key=lambda p: (p["start_ns"], p["end_ns"]))
    return phases, smooth, facts


def model_calls(trace, facts: pd.DataFrame) -> list[int]:
    """Start times (ns) of the model-level forward calls seen in the allocations' stacks (see the module
    docstring); [] when the stacks show no module call."""
    b = trace.blocks
    sid = pd.array(b["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    seen = (sid >= 0) & b["alloc_ns"].notna().to_numpy()
    if not seen.any() or not len(facts):
        return []
    f = facts.set_index("stack_id")
    rows = np.flatnonzero(seen)
    order = np.lexsort((b["alloc_seq"].fillna(-1).to_numpy(np.int64)[rows],
                        b["alloc_ns"].to_numpy("float64", na_value=0)[rows]))
    rows = rows[order]
    key = f["model_key"].reindex(sid[rows]).fillna("").to_numpy(dtype=object)
    line = f["model_line"].reindex(sid[rows]).fillna(-1).to_numpy(dtype=np.int64)
    inside = key != ""
    key, line, rows = key[inside], line[inside], rows[inside]
    if len(rows) == 0:
        return []
    t = b["alloc_ns"].to_numpy("float64", na_value=0)[rows].astype(np.int64)
    new = np.concatenate([[True], (key[1:] != key[:-1]) | (line[1:] < line[:-1])])
    return t[new].tolist()


def _phase_at(t: np.ndarray, phases: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(name, end_ns) of the phase holding each time (the latest starting one), "" / -1 outside phases."""
    name = np.full(len(t), "", dtype=object)
    end = np.full(len(t), -1, dtype=np.int64)
    for p in sorted((p for p in phases if p["name"] in PHASE_NAMES), key=lambda p: p["start_ns"]):
        inside = (t >= p["start_ns"]) & (t < p["end_ns"]) if p["end_ns"] > p["start_ns"] else (t == p["start_ns"])
        name[inside] = p["name"]
        end[inside] = p["end_ns"]
    return name, end


def categorize(trace, phases: list[dict], event_phase: np.ndarray, facts: pd.DataFrame) -> pd.DataFrame:
    """Columns ``category``, ``category_rule`` and ``phase`` (the phase the block was allocated in) for
    every row of ``trace.blocks``, by the rules of the module docstring."""
    b = trace.blocks
    n = len(b)
    cat = np.full(n, "unknown", dtype=object)
    rule = np.full(n, "nothing in the file says", dtype=object)
    decided = np.zeros(n, dtype=bool)

    def assign(mask, category, why):
        mask = mask & ~decided
        cat[mask] = category
        rule[mask] = why
        decided[mask] = True

    sid = pd.array(b["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    f = facts.set_index("stack_id") if len(facts) else None

    def fact(col, default):
        if f is None:
            return np.full(n, default)
        return f[col].reindex(sid).fillna(default).to_numpy()

    # the phase of each block's alloc (and of its free) from the event rows
    alloc_phase = np.full(n, "", dtype=object)
    free_phase = np.full(n, "", dtype=object)
    ev = trace.events
    if ev is not None and len(ev) and len(event_phase) == len(ev) and "block_id" in ev.columns:
        bid = pd.array(ev["block_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
        action = ev["action"].to_numpy(dtype=object)
        pos = pd.Index(b["block_id"].to_numpy()).get_indexer(bid)
        ok = (bid >= 0) & (pos >= 0)
        a = ok & (action == "alloc")
        alloc_phase[pos[a]] = event_phase[a]
        fr = ok & np.isin(action, ["free_requested", "free_completed"])
        # the request's phase (the first free row of a block) is when the program let go of it
        first = pd.Series(np.flatnonzero(fr)).groupby(pos[fr]).first()
        free_phase[first.index.to_numpy()] = event_phase[first.to_numpy()]
        ev_sid = pd.array(ev["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
        free_sid = np.full(n, -1, dtype=np.int64)
        free_sid[first.index.to_numpy()] = ev_sid[first.to_numpy()]
    else:
        free_sid = np.full(n, -1, dtype=np.int64)
    alloc_t = b["alloc_ns"].to_numpy("float64", na_value=np.nan)
    free_t = b["free_ns"].to_numpy("float64", na_value=np.inf)
    _, hi = trace.time_span_ns()
    # the end of the phase run each block was allocated in
    phase_end = np.full(n, -1.0)
    seen = ~np.isnan(alloc_t)
    if seen.any():
        _, end = _phase_at(alloc_t[seen].astype(np.int64), phases)
        phase_end[seen] = end
    outlives = free_t >= np.where(phase_end < 0, np.inf, phase_end)
    outlives |= np.isinf(free_t)
    op = b["op"].astype(str).to_numpy() if "op" in b.columns else np.full(n, "")

    in_opt = alloc_phase == "optimizer_step"
    assign(in_opt & outlives, "optimizer_state", "allocated in the optimizer step and alive after it")
    assign(in_opt, "temporary", "allocated and freed within the optimizer step")
    assign(alloc_phase == "zero_grad", "temporary", "allocated in zero_grad")
    assign(fact("workspace", False).astype(bool) & (sid >= 0), "workspace", "cuBLAS / cuDNN frame on the stack")
    assign(fact("accumulate_grad", False).astype(bool) & (sid >= 0), "gradient",
           "allocated under autograd's AccumulateGrad")
    in_bwd = alloc_phase == "backward"
    assign(in_bwd & outlives, "gradient", "allocated in the backward pass and alive after it")
    assign(in_bwd, "temporary", "allocated and freed within the backward pass")
    in_fwd = alloc_phase == "forward"
    assign(in_fwd & outlives, "activation", "allocated in the forward pass and alive after it")
    assign(in_fwd, "temporary", "allocated and freed within the forward pass")
    assign(seen & (alloc_phase == "") & np.isin(op, list(_COPY_OPS)), "input",
           "copied to the device outside any phase")

    # structure: blocks alive before recording, without a stack
    before = b["allocated_before"].to_numpy(dtype=bool) & (sid < 0) & ~decided
    size = b["size"].to_numpy(dtype=np.int64)
    partner = np.isin(cat, ["gradient", "optimizer_state"])
    if before.any() and partner.any():
        partner_sizes = pd.Series(size[partner]).value_counts()
        grads = pd.Series(size[cat == "gradient"]).value_counts()
        states = pd.Series(size[cat == "optimizer_state"]).value_counts()
        for s, rows in pd.Series(np.flatnonzero(before)).groupby(size[before]):
            if s not in partner_sizes.index:
                continue
            rows = rows.to_numpy()
            g, o = int(grads.get(s, 0)), int(states.get(s, 0))
            # Adam-like optimizers keep two state tensors per parameter, SGD with momentum one: the state
            # count (or else the gradient count) of a size is the number of parameters of that size
            n_params = min(len(rows), max(1, o // 2 if o >= 2 else (o or g)))
            order = rows[np.argsort(b["addr"].to_numpy("float64", na_value=0)[rows], kind="stable")]
            mask = np.zeros(n, dtype=bool)
            mask[order[:n_params]] = True
            assign(mask, "parameter", "alive before recording, no stack, the size of a gradient / optimizer state")
            rest = order[n_params:]
            if len(rest):
                n_grad = len(rest) if o == 0 else min(len(rest), n_params) if g else 0
                mask = np.zeros(n, dtype=bool)
                mask[rest[:n_grad]] = True
                assign(mask, "gradient", "alive before recording beyond the parameters of its size (gradients)")
                mask = np.zeros(n, dtype=bool)
                mask[rest[n_grad:]] = True
                assign(mask, "optimizer_state",
                       "alive before recording beyond the parameters and gradients of its size (optimizer state)")

    # a recording with no backward pass and no optimizer step (inference): what was alive before recording,
    # has no stack and is still alive at the end is the model's weights
    if not any(p["name"] in ("backward", "optimizer_step") for p in phases) and any(
            p["name"] == "forward" for p in phases):
        assign(b["allocated_before"].to_numpy(dtype=bool) & (sid < 0) & np.isinf(free_t), "parameter",
               "alive before and after a forward-only recording, no stack (model weights)")

    # allocation unseen: the free's stack tells what the block was
    free_in_bwd = (free_phase == "backward") & ~decided
    assign(free_in_bwd & np.isnan(alloc_t), "activation", "alloc unseen; freed by the backward pass (saved tensor)")
    assign(np.isnan(alloc_t) & np.isin(free_phase, ["forward", "optimizer_step", "zero_grad"]),
           "temporary", "alloc unseen; freed in the forward pass or optimizer step")
    del free_sid
    return pd.DataFrame({"category": cat, "category_rule": rule, "phase": alloc_phase})


def tell_story(trace) -> None:
    """Give a snapshot trace its phases (``metadata["phases"]``, ``metadata["model_calls"]``) and every block a
    ``category``, ``category_rule`` and ``phase``, in place. Categories already decided by the source (other
    than "unknown") are kept."""
    phases, event_phase, facts = infer_phases(trace)
    trace.metadata["phases"] = phases
    trace.metadata["phases_from_frames"] = bool(len(facts) and (facts["phase"] != "").any())
    trace.metadata["model_calls"] = model_calls(trace, facts)
    cats = categorize(trace, phases, event_phase, facts)
    b = trace.blocks
    keep = b["category"].astype(str).ne("unknown").to_numpy() if "category" in b.columns else np.zeros(len(b), bool)
    b["category"] = np.where(keep, b["category"].to_numpy(dtype=object), cats["category"].to_numpy())
    b["category_rule"] = np.where(keep, "recorded by the source", cats["category_rule"].to_numpy())
    b["phase"] = cats["phase"].to_numpy()
