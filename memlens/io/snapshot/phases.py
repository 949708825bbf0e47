"""The phases of a run seen in a CUDA snapshot (forward, backward, optimizer step, zero_grad), the
phase of every allocator event, and the start of every model-level forward call.

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
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from memlens.io.snapshot.stacks import PHASE_NAMES, stack_facts

MIN_RUN = 3  # a run of fewer events between two runs of the same phase is absorbed by them
_OPTIMIZER_ANNOTATION = re.compile(r"^Optimizer\.step#|^optimizer\.step$")
_ZERO_GRAD_ANNOTATION = re.compile(r"^Optimizer\.zero_grad#")


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
        kind = ("optimizer_step" if _OPTIMIZER_ANNOTATION.search(name) else
                "zero_grad" if _ZERO_GRAD_ANNOTATION.search(name) else name)
        out.append({"name": kind, "start_ns": int(r.start_ns), "end_ns": int(r.end_ns), "source": "annotation",
                    "label": name})
    return out


def infer_phases(trace, stack_codes=None) -> tuple[list[dict], np.ndarray, pd.DataFrame]:
    """(phases, phase of each event row, stack facts). Phases are dicts ``name``, ``start_ns``, ``end_ns``
    (ns), ``source`` ("annotation" or "frames"), sorted by start; annotated ranges replace the inferred
    phases they overlap. `stack_codes`: see `memlens.io.snapshot.stacks.stack_facts`."""
    ev = trace.events
    facts = stack_facts(trace.stacks, stack_codes)
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
    by_time = np.argsort(t, kind="stable")
    t_sorted = t[by_time]
    for p in annotated:  # an annotation is the phase of every event inside it
        if p["name"] in PHASE_NAMES:
            lo_i, hi_i = np.searchsorted(t_sorted, [p["start_ns"], p["end_ns"]], side="left")[0], \
                np.searchsorted(t_sorted, p["end_ns"], side="right")
            labels[by_time[lo_i:hi_i]] = p["name"]
    # events without a phase take the phase before them (no stack: the autograd engine's thread records no
    # Python frames; a stack naming no phase: glue such as the loss) - except after an optimizer step or
    # zero_grad, where a stack naming no phase is the loop's own code (loading the next batch): outside
    before = pd.Series(labels).replace("", np.nan).ffill().fillna("").to_numpy(dtype=object)
    labels = labels.copy()
    labels[(labels == "") & (sid >= 0) & np.isin(before, ["optimizer_step", "zero_grad"])] = "outside"
    filled = pd.Series(labels).replace("", np.nan).ffill().fillna("").to_numpy(dtype=object)
    filled[filled == "outside"] = ""
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


def phase_at(t: np.ndarray, phases: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(name, end_ns) of the phase holding each time (the latest starting one), "" / -1 outside phases.
    O((n + phases) log phases)."""
    named = sorted((p for p in phases if p["name"] in PHASE_NAMES), key=lambda p: p["start_ns"])
    name = np.full(len(t), "", dtype=object)
    end = np.full(len(t), -1, dtype=np.int64)
    if not named or not len(t):
        return name, end
    starts = np.array([p["start_ns"] for p in named], dtype=np.int64)
    ends = np.array([p["end_ns"] for p in named], dtype=np.int64)
    names = np.array([p["name"] for p in named], dtype=object)
    k = np.searchsorted(starts, t, side="right") - 1
    ok = k >= 0
    kk = np.clip(k, 0, None)
    inside = ok & ((t < ends[kk]) | ((ends[kk] == starts[kk]) & (t == starts[kk])))
    name[inside] = names[kk[inside]]
    end[inside] = ends[kk[inside]]
    return name, end
