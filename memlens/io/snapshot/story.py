"""What a CUDA snapshot's stacks say about each block: its category (the role of the tensor it held), the rule
that decided it, and the phase it was allocated in.

A snapshot records no tensor roles, but its stacks and annotations tell them: what each stack's frames say
is `memlens.io.snapshot.stacks`, the phases of the run (and of every event) and the model calls are
`memlens.io.snapshot.phases`; `tell_story` puts them together and applies the rules below.

Categories (parameter, buffer, gradient, activation, optimizer_state, input, temporary, unknown, plus
``workspace``), each with the rule that decided it
(``category_rule``), first match wins:

1. ``optimizer_state``: allocated in the optimizer step and alive when it ends (AdamW ``exp_avg`` ...).
2. ``temporary`` (optimizer): allocated in the optimizer step and freed within it.
3. ``workspace``: a cuBLAS / cuDNN frame on the stack.
3k. ``kv_cache``: made by a Python function named for a key/value cache (vLLM's ``_allocate_kv_cache``, a
    ``KVCache`` class's methods, ``past_key_values``): inference state, neither activation nor parameter.
3a. ``optimizer_state`` (optimizer code): made by an optimizer's code that no phase marks (the user's own
    AdamW, any file, any caller), parameter-sized and outliving that code's run of events
    (`memlens.io.snapshot.optimizer`); ``temporary``: made by that code and freed within its run of events.
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
11b. ``temporary`` (pending free): the final allocator state lists the block as ``active_pending_free``
    (``active_awaiting_free``): the program freed it, and the caching allocator holds its bytes until the
    work queued on the streams that used it completes (``record_stream``, frees across streams). No live
    tensor owns it any more; every stronger rule above still wins.
12. ``unknown``: nothing says.

A block is freed when the program asked for it (its ``free_requested`` entry), also when the allocator still
held it at the end (pending free): "alive after" a phase means the program still held it.

Blocks alive before recording that the final state gives an allocation stack go through the same rules:
they were allocated in the phase their frames name, by the code their frames name (rule 3a counts them as
made before every event of the trace), and are alive after it (only the final state gives them a stack).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.io.snapshot.optimizer import optimizer_state_in_step, optimizer_temporaries
from memlens.io.snapshot.phases import MIN_RUN, infer_phases, model_calls, phase_at  # noqa: F401  (MIN_RUN re-exported)
from memlens.io.snapshot.segments import PENDING_FREE_STATES
from memlens.io.snapshot.stacks import PHASE_NAMES, stack_facts  # noqa: F401  (re-exported: the story's inputs)

_COPY_OPS = {"to", "_to_copy", "copy_", "_copy_from", "pin_memory", "empty_strided", "empty", "to_dtype_layout",
             "to_device", "to_dtype", "to_other", "copy", "clone", "contiguous", "from_blob"}


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
        # (the smallest row per block, by an in-place minimum: no sort or groupby of every free row)
        first = np.full(n, len(fr), dtype=np.int64)
        np.minimum.at(first, pos[fr], np.flatnonzero(fr))
        has_free = first < len(fr)
        free_phase[has_free] = event_phase[first[has_free]]
        if f is not None and f["optimizer_code"].any():
            # released by an optimizer's own code (a user's step that no phase marks): the optimizer step
            ev_sid = pd.array(ev["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1) \
                if "stack_id" in ev.columns else np.full(len(ev), -1, dtype=np.int64)
            by_code = f["optimizer_code"].astype(bool).reindex(ev_sid).fillna(False).to_numpy(dtype=bool)
            released = np.zeros(n, dtype=bool)
            released[has_free] = by_code[first[has_free]]
            free_phase[released] = "optimizer_step"
    alloc_t = b["alloc_ns"].to_numpy("float64", na_value=np.nan)
    free_t = b["free_ns"].to_numpy("float64", na_value=np.inf)
    if "free_requested_ns" in b.columns:  # freed by the program, still pending in the allocator: freed then
        free_t = np.where(np.isinf(free_t), b["free_requested_ns"].to_numpy("float64", na_value=np.inf), free_t)
    _, hi = trace.time_span_ns()
    # the end of the phase run each block was allocated in
    phase_end = np.full(n, -1.0)
    seen = ~np.isnan(alloc_t)
    if seen.any():
        _, end = phase_at(alloc_t[seen].astype(np.int64), phases)
        phase_end[seen] = end
    # alive before recording with an allocation stack (only the final state gives one, so alive at the end):
    # allocated in the phase its frames name, and alive after it
    told = b["allocated_before"].to_numpy(dtype=bool) & ~seen & (sid >= 0)
    alloc_phase[told] = fact("phase", "").astype(object)[told]
    outlives = free_t >= np.where(phase_end < 0, np.inf, phase_end)
    outlives |= np.isinf(free_t)
    op = b["op"].astype(str).to_numpy() if "op" in b.columns else np.full(n, "")

    in_opt = alloc_phase == "optimizer_step"
    assign(in_opt & outlives, "optimizer_state", "allocated in the optimizer step and alive after it")
    assign(in_opt, "temporary", "allocated and freed within the optimizer step")
    assign(alloc_phase == "zero_grad", "temporary", "allocated in zero_grad")
    assign(fact("workspace", False).astype(bool) & (sid >= 0), "workspace", "cuBLAS / cuDNN frame on the stack")
    if f is not None and "kv_cache" in f.columns:
        assign(fact("kv_cache", False).astype(bool) & (sid >= 0), "kv_cache",
               "made by a function named for a key/value cache (_allocate_kv_cache, KVCache, past_key_values)")
    setup = fact("setup", "").astype(object)
    size = b["size"].to_numpy(dtype=np.int64)
    if f is not None and f["optimizer_code"].any():
        params = ((setup == "parameter") & np.isinf(free_t)) | (b["allocated_before"].to_numpy(dtype=bool) & (sid < 0))
        grads = fact("accumulate_grad", False).astype(bool) & (sid >= 0)
        state = optimizer_state_in_step(trace, f["optimizer_code"].astype(bool), [params, grads])
        assign(state, "optimizer_state", "made by an optimizer's code (frames: step, _init_group, adam, optimizer "
               "file ...), parameter-sized, alive after that code ran")
        assign(optimizer_temporaries(trace, f["optimizer_code"].astype(bool)), "temporary",
               "made and freed within a run of an optimizer's code (frames: step, _init_group, adam ...)")
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
    assign(pending_free(trace), "temporary", "freed by the program, held by the allocator until its streams' "
           "queued work completes (pending free)")
    return pd.DataFrame({"category": cat, "category_rule": rule, "phase": alloc_phase})


def pending_free(trace) -> np.ndarray:
    """Per row of ``trace.blocks``: whether the final allocator state (``trace.segment_blocks``, linked by
    ``block_id``) lists the block as pending free. All False without a final state."""
    b = trace.blocks
    sb = getattr(trace, "segment_blocks", None)
    if sb is None or not len(sb) or "block_id" not in sb.columns:
        return np.zeros(len(b), dtype=bool)
    pending = sb["state"].isin(PENDING_FREE_STATES).to_numpy() & sb["block_id"].notna().to_numpy()
    ids = sb["block_id"].to_numpy(dtype=np.float64, na_value=np.nan)[pending]
    return b["block_id"].isin(ids.astype(np.int64)).to_numpy()


def tell_story(trace, stack_codes=None) -> None:
    """Give a snapshot trace its phases (``metadata["phases"]``, ``metadata["model_calls"]``) and every block a
    ``category``, ``category_rule`` and ``phase``, in place. Categories already decided by the source (other
    than "unknown") are kept. `stack_codes`: see `memlens.io.snapshot.stacks.stack_facts`."""
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
