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
3b. ``parameter``: made by model construction (a torch.nn module's ``__init__``, ``Module.to`` / ``_apply``,
    weight init or state-dict / checkpoint loading frames) and alive to the end; ``optimizer_state``:
    made under a function that builds an optimizer (Megatron's ``get_megatron_optimizer``...).
4. ``gradient``: allocated under autograd's AccumulateGrad, or in the backward pass and alive when it ends.
5. ``temporary`` (backward): allocated in the backward pass and freed within it.
6. ``activation``: allocated in the forward pass and alive when it ends (saved for backward, or outputs).
7. ``temporary`` (forward): allocated in the forward pass and freed within it.
8. ``input``: allocated outside any phase by a copy to the device (``to`` / ``copy_``), before a forward.
9. Structure, for blocks alive before recording without a stack, of a size at which the recording made
   gradients or optimizer state (each parameter has a gradient and, with Adam, two state tensors of its
   size): released by the optimizer step -> ``optimizer_state`` (the previous step's state, replaced out of
   place); released by zero_grad or the backward pass -> ``gradient``; alive to the end -> ``parameter``,
   one per gradient of that size made in the step (or per pair of state tensors), the rest
   ``optimizer_state``. Which of several same-size blocks alive to the end is the parameter is a guess by
   address: the bytes per category are right, the individual assignment may not be.
10b. ``parameter`` (forward-only): a recording with a forward pass and no backward / optimizer step: alive
    before and after recording, no stack (the model's weights and buffers).
11. ``activation`` (free stack): allocation unseen, freed by the autograd engine (a saved tensor released
    by backward); ``temporary`` when freed in the forward or optimizer step.
12. ``unknown``: nothing says.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

MIN_RUN = 3  # a run of fewer events between two runs of the same phase is absorbed by them
PHASE_NAMES = ("forward", "backward", "optimizer_step", "zero_grad")
_OPTIMIZER_ANNOTATION = re.compile(r"^Optimizer\.step#|^optimizer\.step$")
_ZERO_GRAD_ANNOTATION = re.compile(r"^Optimizer\.zero_grad#")
_COPY_OPS = {"to", "_to_copy", "copy_", "_copy_from", "pin_memory", "empty_strided", "empty", "to_dtype_layout",
             "to_device", "to_dtype", "to_other", "copy", "clone", "contiguous", "from_blob"}
_WORKSPACE = ("cublas", "cudnn", "CUDABlasHandle", "getCurrentCUDABlasHandle", "cublasLt", "workspace")


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def stack_facts(stacks: pd.DataFrame | None, codes=None) -> pd.DataFrame:
    """Per stack_id: ``phase`` (a name of `PHASE_NAMES` or ""), ``accumulate_grad``, ``workspace``,
    ``setup`` (what model / optimizer construction makes, outside backward / optimizer step / zero_grad:
    "parameter" for Module.to / _apply, a torch.nn module's constructor, a constructor run under
    ``with torch.device(...)``, weight init or loading; "optimizer_state" under a function that builds an
    optimizer; else ""), ``model_key`` (outermost module forward function and its caller, "" outside a
    module call) and ``model_line`` (line executing in that forward, -1 when none).

    Vectorised: each distinct frame name / file name is tested once, and per-stack answers are reductions
    over the frames of each stack (big snapshots have hundreds of thousands of stacks). `codes` (a
    `memlens.io.snapshot_frames.StackCodes` of these rows, from the importer) saves factorizing the
    name and filename columns again."""
    cols = ("stack_id", "phase", "accumulate_grad", "workspace", "setup", "model_key", "model_line")
    if stacks is None or len(stacks) == 0:
        return pd.DataFrame({c: [] for c in cols})
    st = stacks if _sorted_by_stack_and_depth(stacks) else stacks.sort_values(["stack_id", "depth"], kind="stable")
    ids = st["stack_id"].to_numpy(dtype=np.int64)
    n = len(ids)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(ids)) + 1])
    ends = np.append(starts[1:], n)
    if codes is not None and st is stacks:
        name_codes, name_u, file_codes, file_u = codes.name_codes, codes.names, codes.file_codes, codes.files
    else:
        name_codes, name_u = pd.factorize(_as_str_objects(st["name"]))
        file_codes, file_u = pd.factorize(_as_str_objects(st["filename"]))
    if codes is not None:  # all str already, and maybe with their Arrow array
        names = _Distinct(name_u, codes.plain_names)
    else:
        names = _Distinct([str(x) for x in name_u])
    files = _Distinct([_norm(str(f)) for f in file_u])
    name_u, file_u = names.values, files.values
    lines = st["line"].to_numpy(dtype=np.int64)

    def by_name(pred, kernel):
        return names.test(pred, kernel)[name_codes]

    def by_file(pred, kernel):
        return files.test(pred, kernel)[file_codes]

    def any_(mask):  # per stack: does any of its frames match
        return np.logical_or.reduceat(mask, starts)

    def has(text):
        return lambda a: pc.match_substring(a, text)

    def either(*kernels):
        return lambda a: _any_of(a, kernels)

    def equals(*values):
        return lambda a: pc.is_in(a, value_set=pa.array(values, pa.string()))

    def suffix(text):
        return lambda a: pc.ends_with(a, text)

    is_py = by_file(lambda f: f.endswith(".py"), suffix(".py"))
    module_py = by_file(lambda f: f.endswith("torch/nn/modules/module.py"), suffix("torch/nn/modules/module.py"))
    optim_file = by_file(lambda f: "/torch/optim/" in f or f.startswith("torch/optim/"),
                         either(has("/torch/optim/"), lambda a: pc.starts_with(a, "torch/optim/")))
    zero = by_name(lambda x: x == "zero_grad", equals("zero_grad"))
    call = by_name(lambda x: x in ("_call_impl", "_wrapped_call_impl"),
                   equals("_call_impl", "_wrapped_call_impl")) & module_py
    engine = by_name(lambda x: "torch::autograd::Engine::" in x or "AccumulateGrad" in x,
                     either(has("torch::autograd::Engine::"), has("AccumulateGrad")))
    py_backward = by_name(lambda x: x in ("backward", "_engine_run_backward"),
                          equals("backward", "_engine_run_backward")) & by_file(
        lambda f: "/torch/autograd/" in f or f.endswith("torch/_tensor.py"),
        either(has("/torch/autograd/"), suffix("torch/_tensor.py")))
    in_optim = any_(optim_file)
    phase = np.select(
        [in_optim & any_(zero & by_file(lambda f: "/optim/" in f, has("/optim/"))), in_optim, any_(zero),
         any_(engine) | any_(py_backward), any_(call)],
        ["zero_grad", "optimizer_step", "zero_grad", "backward", "forward"], "").astype(object)

    builds_optimizer = any_(is_py & by_name(
        lambda x: "optimizer" in x.lower() and x not in ("step", "zero_grad"),
        lambda a: pc.and_(pc.match_substring(pc.ascii_lower(a), "optimizer"),
                          pc.invert(equals("step", "zero_grad")(a)))))
    init = by_name(lambda x: x == "__init__", equals("__init__"))
    device_file = by_file(lambda f: f.endswith("torch/utils/_device.py"), suffix("torch/utils/_device.py"))
    under_device = any_(is_py & device_file) & any_(is_py & init)
    makes_weights = (any_(module_py & by_name(lambda x: x in ("_apply", "convert", "to", "cuda", "to_empty"),
                                              equals("_apply", "convert", "to", "cuda", "to_empty")))
                     | any_(by_file(lambda f: "/torch/nn/modules/" in f, has("/torch/nn/modules/")) & init)
                     | any_(by_file(lambda f: f.endswith("torch/nn/parameter.py"), suffix("torch/nn/parameter.py")))
                     | any_(is_py & by_name(lambda x: _WEIGHT_NAMES.search(x),
                                            lambda a: pc.match_substring_regex(a, _WEIGHT_NAMES.pattern))))
    skip = np.isin(phase, ["backward", "optimizer_step", "zero_grad"])
    setup = np.select([skip, builds_optimizer, under_device | makes_weights], ["", "optimizer_state", "parameter"],
                      "").astype(object)

    # outermost module call: the last _call_impl frame (frames are innermost first); the model's forward is
    # the nearest Python frame inside it (not module.py), its caller the nearest Python frame outside it
    idx = np.arange(n, dtype=np.int64)
    outer = np.maximum.reduceat(np.where(call, idx, -1), starts)
    last_inner = np.maximum.accumulate(np.where(is_py & ~module_py, idx, -1))
    next_py = np.minimum.accumulate(np.where(is_py, idx, n)[::-1])[::-1]
    keys = np.full(len(starts), "", dtype=object)
    model_line = np.full(len(starts), -1, dtype=np.int64)
    for k in np.flatnonzero(outer > starts):
        o, a, b = int(outer[k]), int(starts[k]), int(ends[k])
        inner = int(last_inner[o - 1])
        if inner < a:
            continue
        caller = int(next_py[o + 1]) if o + 1 < b else n
        where = f"{file_u[file_codes[caller]]}:{lines[caller]}" if caller < b else ""
        keys[k] = f"{file_u[file_codes[inner]]}:{name_u[name_codes[inner]]}<-{where}"
        model_line[k] = lines[inner]
    return pd.DataFrame({
        "stack_id": ids[starts], "phase": phase, "accumulate_grad": any_(by_name(lambda x: "AccumulateGrad" in x, has("AccumulateGrad"))),
        "workspace": any_(by_name(lambda x: any(w in x for w in _WORKSPACE),
                                  lambda a: _any_of(a, [has(w) for w in _WORKSPACE]))), "setup": setup,
        "model_key": keys, "model_line": model_line})


def _sorted_by_stack_and_depth(stacks: pd.DataFrame) -> bool:
    """True when rows are already in (stack_id, depth) order with no repeated pair (as importers write
    them), so that the stable sort would only copy the same rows."""
    ids = stacks["stack_id"].to_numpy(dtype=np.int64)
    depth = stacks["depth"].to_numpy(dtype=np.int64)
    step_id, step_depth = np.diff(ids), np.diff(depth)
    return bool(np.all((step_id > 0) | ((step_id == 0) & (step_depth > 0))))


def _as_str_objects(column: pd.Series) -> np.ndarray:
    """The column as an object array of Python str. A column that already holds only str is used as it
    is: pandas' ``astype(str)`` would copy every string into Arrow and back (for a snapshot with
    millions of frames, seconds and hundreds of MB)."""
    values = column.to_numpy(dtype=object)
    if pd.api.types.infer_dtype(values, skipna=False) == "string":
        return values
    return column.astype(str).to_numpy(dtype=object)


class _Distinct:
    """Distinct strings, each tested once per predicate: the plain ones (ASCII without a newline: nearly all
    frame names and files) by Arrow's compiled kernels, the rest (other characters, a lone surrogate Arrow
    cannot hold, a newline where Python's ``$`` and RE2's differ) by the same predicate in Python, so the
    answers are those of the Python predicate for every string."""

    def __init__(self, values, plain_arrow: tuple | None = None):
        """`values`: a list or object array of str; `plain_arrow`: (bool per value: plain, Arrow string array of
        the plain values in order), when the caller has them (the compiled snapshot reader builds them)."""
        self.values = values
        if plain_arrow is not None:
            plain, self._arrow = plain_arrow
        else:
            joined = "\0".join(values)  # one C-speed look at all of them first: usually every one is plain
            if joined.isascii() and "\n" not in joined:
                plain = np.ones(len(values), dtype=bool)
            else:
                plain = np.fromiter((v.isascii() and "\n" not in v for v in values), dtype=bool,
                                    count=len(values))
        self._plain_at = np.flatnonzero(plain)
        self._other_at = np.flatnonzero(~plain)
        if plain_arrow is None:
            self._arrow = pa.array(values if len(self._other_at) == 0 else [values[i] for i in self._plain_at],
                                   type=pa.string())

    def test(self, pred, kernel) -> np.ndarray:
        """bool per value: ``pred(value)``, computed by ``kernel`` (Arrow array -> bool array) where it can."""
        out = np.zeros(len(self.values), dtype=bool)
        if len(self._plain_at):
            out[self._plain_at] = np.asarray(kernel(self._arrow).to_numpy(zero_copy_only=False), dtype=bool)
        for i in self._other_at:
            out[i] = bool(pred(self.values[i]))
        return out


def _any_of(arrow_values, kernels):
    result = kernels[0](arrow_values)
    for k in kernels[1:]:
        result = pc.or_(result, k(arrow_values))
    return result


_WEIGHT_NAMES = re.compile(r"(^|_)(init_weights?|init_weight_list|create_weights|reset_parameters|"
                           r"load_state_dict|_load_from_state_dict|from_pretrained|load_checkpoint)($|_)")


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
    phases they overlap. `stack_codes`: see `stack_facts`."""
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


def _phase_at(t: np.ndarray, phases: list[dict]) -> tuple[np.ndarray, np.ndarray]:
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
    setup = fact("setup", "").astype(object)
    assign((setup == "parameter") & np.isinf(free_t), "parameter",
           "made by model construction, weight init/loading or Module.to (stack) and never freed")
    assign(setup == "optimizer_state", "optimizer_state", "made while building the optimizer (stack)")
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
        addr = b["addr"].to_numpy("float64", na_value=0)

        def mark(rows, category, why):
            mask = np.zeros(n, dtype=bool)
            mask[rows] = True
            assign(mask, category, why)

        for s, rows in pd.Series(np.flatnonzero(before)).groupby(size[before]):
            if s not in partner_sizes.index:
                continue
            rows = rows.to_numpy()
            g, o = int(grads.get(s, 0)), int(states.get(s, 0))
            # what happened to them says most: the optimizer step replacing them (the previous step's state,
            # updated out of place), zero_grad / backward releasing them (the previous step's gradients)
            fate = free_phase[rows]
            mark(rows[fate == "optimizer_step"], "optimizer_state" if o else "gradient",
                 "alive before recording, no stack, released by the optimizer step that re-creates blocks of its "
                 "size (the previous step's " + ("optimizer state)" if o else "gradients)"))
            mark(rows[np.isin(fate, ["zero_grad", "backward"])], "gradient",
                 "alive before recording, no stack, released by zero_grad / the backward pass (the previous "
                 "step's gradients)")
            alive = rows[np.isinf(free_t[rows])]
            # alive throughout: one parameter per gradient of its size made in the step (or, without
            # gradients, per pair of Adam state tensors); beyond that, state kept by the optimizer
            n_params = min(len(alive), g if g else (o // 2 if o >= 2 else o) or len(alive))
            order = alive[np.argsort(addr[alive], kind="stable")]
            mark(order[:n_params], "parameter", "alive before and after recording, no stack, the size of a "
                 "gradient / optimizer state made in the step (each parameter has such partners)")
            mark(order[n_params:], "optimizer_state" if o or not g else "gradient",
                 "alive before and after recording, no stack, beyond the parameters of its size (which of the "
                 "same-size blocks is which is a guess by address)")

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
    return pd.DataFrame({"category": cat, "category_rule": rule, "phase": alloc_phase})


def tell_story(trace, stack_codes=None) -> None:
    """Give a snapshot trace its phases (``metadata["phases"]``, ``metadata["model_calls"]``) and every block a
    ``category``, ``category_rule`` and ``phase``, in place. Categories already decided by the source (other
    than "unknown") are kept. `stack_codes`: see `stack_facts`."""
    phases, event_phase, facts = infer_phases(trace, stack_codes)
    trace.metadata["phases"] = phases
    trace.metadata["phases_from_frames"] = bool(len(facts) and (facts["phase"] != "").any())
    trace.metadata["model_calls"] = model_calls(trace, facts)
    cats = categorize(trace, phases, event_phase, facts)
    b = trace.blocks
    keep = b["category"].astype(str).ne("unknown").to_numpy() if "category" in b.columns else np.zeros(len(b), bool)
    b["category"] = np.where(keep, b["category"].to_numpy(dtype=object), cats["category"].to_numpy())
    b["category_rule"] = np.where(keep, "recorded by the source", cats["category_rule"].to_numpy())
    b["phase"] = cats["phase"].to_numpy()
