"""Optimizer state that a snapshot's stacks point to although no ``torch/optim`` frame or annotation marks an
optimizer step: an optimizer written in the user's own code (a copy of torch's AdamW in ``optimizer.py``, a
zeroth-order estimator keeping Adam-like moments), called from anywhere.

Two facts must agree (either alone is too weak: ``step`` is also what training loops are called, and
activations can have a weight's size):

1. The stack is optimizer code: a frame under ``torch/optim/``, a function named like an optimizer's
   internals (``step``, ``_init_group``, ``_single_tensor_adam``, ``_multi_tensor_adamw``, ``_fused_*``, a
   name with ``adam``/``sgd``/``lion``/... as a word), or a file named like one (``optimizer.py``,
   ``my_adamw.py``, ``adam_forward.py``), with no module call or autograd engine frame on the stack (a
   forward or backward pass run from inside a ``step``).
2. The block is parameter-sized: its size is that of a parameter (a block made by model construction,
   a gradient, or a block alive before recording without a stack), at most `MAX_STATE_PER_PARAMETER` state
   blocks per parameter of that size (Adam's two moments, AMSGrad's third, a master copy). Without any
   parameter in the file, a size that optimizer code made at two or more places (exp_avg and exp_avg_sq
   lines) is a partner size.

And it must outlive the run of optimizer-code events it was made in (temporaries of the step are freed
within it; state stays, or is replaced by the next step). A block alive before recording whose allocation
stack is optimizer code has that stack from the snapshot's final state: it is alive at the end, so it
outlived the run it was made in.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

MAX_STATE_PER_PARAMETER = 4
_VOCAB = r"adamw?|adamax|nadam|radam|sgd|lion|lamb|lars|adagrad|adadelta|adafactor|rmsprop|sophia|shampoo|muon"
# function names of optimizer internals (torch's and copies of them); ASCII classes so that Python's `re`
# and Arrow's RE2 agree on every plain string
OPTIMIZER_FUNCTION = re.compile(
    r"(?i)^(step|_init_group|_single_tensor_[A-Za-z0-9_]+|_multi_tensor_[A-Za-z0-9_]+|_fused_[A-Za-z0-9_]+)$"
    rf"|(^|_)({_VOCAB})(_|$)")
# file names of optimizer code (the last path component)
OPTIMIZER_FILE = re.compile(r"(?i)(^|/)[^/]*(optim|adam|sgd|adagrad|adafactor|rmsprop|shampoo|sophia|muon)[^/]*$")


def optimizer_code(by_name, by_file, any_, phase: np.ndarray) -> np.ndarray:
    """bool per stack: the stack is optimizer code (module docstring, fact 1). `by_name` / `by_file` test a
    (predicate, Arrow kernel) pair on the frames' names / files, `any_` reduces a frame mask per stack and
    `phase` is each stack's phase fact (`memlens.io.snapshot.stacks.stack_facts`)."""
    import pyarrow.compute as pc

    names = by_name(lambda x: OPTIMIZER_FUNCTION.search(x) is not None,
                    lambda a: pc.match_substring_regex(a, OPTIMIZER_FUNCTION.pattern))
    files = by_file(lambda f: OPTIMIZER_FILE.search(f) is not None or "/torch/optim/" in f
                    or f.startswith("torch/optim/"),
                    lambda a: pc.or_(pc.or_(pc.match_substring_regex(a, OPTIMIZER_FILE.pattern),
                                            pc.match_substring(a, "/torch/optim/")),
                                     pc.starts_with(a, "torch/optim/")))
    return any_(names | files) & np.isin(phase, ["", "optimizer_step"])


def optimizer_state_in_step(trace, stack_is_code: pd.Series, references: list[np.ndarray]) -> np.ndarray:
    """bool per row of ``trace.blocks``: state made by optimizer code (module docstring). `stack_is_code`:
    bool per stack_id (`optimizer_code`); `references`: bool masks over the blocks, each a set of
    parameter-sized blocks (made by model construction or alive before recording without a stack; the
    gradients): the parameters of a size are as many as the largest set has of it. Blocks alive before
    recording count with the stack the final state gives them, as made before everything in the trace."""
    b = trace.blocks
    n = len(b)
    sid = pd.array(b["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    code = stack_is_code.reindex(sid).fillna(False).to_numpy(dtype=bool) & (sid >= 0)
    size = b["size"].to_numpy(dtype=np.int64)
    alloc_t = b["alloc_ns"].to_numpy("float64", na_value=np.nan)
    free_t = b["free_ns"].to_numpy("float64", na_value=np.inf)
    before = np.isnan(alloc_t) & (b["allocated_before"].to_numpy(dtype=bool) if "allocated_before" in b.columns
                                  else np.zeros(n, dtype=bool))
    made = code & (~np.isnan(alloc_t) | before)
    if not made.any():
        return np.zeros(n, dtype=bool)
    candidates = made & (free_t > _run_end(trace, stack_is_code, made, alloc_t, before))
    alloc_t = np.where(before, -np.inf, alloc_t)  # made before the recording: before everything in it
    counts = [pd.Series(size[m]).value_counts() for m in references if m.any()]
    if counts:
        per_size = pd.concat(counts, axis=1).max(axis=1)
        limit = per_size.reindex(size).fillna(0).to_numpy(dtype=np.int64) * MAX_STATE_PER_PARAMETER
        # at most MAX_STATE_PER_PARAMETER state blocks per parameter of each size, the earliest made
        rows = np.flatnonzero(candidates & (limit > 0))
        rows = rows[np.argsort(alloc_t[rows], kind="stable")]
        nth = pd.Series(size[rows]).groupby(size[rows]).cumcount().to_numpy()
        out = np.zeros(n, dtype=bool)
        out[rows[nth < limit[rows]]] = True
        return out
    # no parameter known: a size made by optimizer code at two or more places
    places = pd.DataFrame({"size": size[candidates], "stack": sid[candidates]}).groupby("size")["stack"].nunique()
    return candidates & np.isin(size, places.index[places >= 2].to_numpy())


def optimizer_temporaries(trace, stack_is_code: pd.Series) -> np.ndarray:
    """bool per row of ``trace.blocks``: blocks an optimizer's code (`stack_is_code`, per stack_id) allocated
    inside the trace and that were freed before that code's run of events ended (the step's temporaries,
    what an optimizer step that no phase marks makes and frees)."""
    b = trace.blocks
    sid = pd.array(b["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    alloc_t = b["alloc_ns"].to_numpy("float64", na_value=np.nan)
    free_t = b["free_ns"].to_numpy("float64", na_value=np.inf)
    made = stack_is_code.reindex(sid).fillna(False).to_numpy(dtype=bool) & (sid >= 0) & ~np.isnan(alloc_t)
    if not made.any():
        return made
    return made & (free_t <= _run_end(trace, stack_is_code, made, alloc_t, np.zeros(len(b), dtype=bool)))


def _run_end(trace, stack_is_code: pd.Series, made: np.ndarray, alloc_t: np.ndarray,
             before: np.ndarray) -> np.ndarray:
    """Per block made by optimizer code (`made`), the time (ns) of the last event of the run of
    optimizer-code events its allocation belongs to: events in order, a run broken by an event whose stack
    is not optimizer code (events without a stack, such as a free's completion, do not break it and count
    in it). Without an event table, or for a block whose alloc event is not in it, the allocation time
    itself. A block alive before recording (`before`): -inf (only the final state gives such a block a
    stack, so it outlives everything)."""
    b = trace.blocks
    out = np.where(made & ~before, alloc_t, -np.inf)
    ev = trace.events
    if ev is None or len(ev) == 0 or "block_id" not in ev.columns or "stack_id" not in ev.columns:
        return np.where(made, out, -np.inf)
    ev_sid = pd.array(ev["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    flag = stack_is_code.reindex(ev_sid).fillna(False).to_numpy(dtype=bool) & (ev_sid >= 0)
    run = np.cumsum((ev_sid >= 0) & ~flag)  # events between two breaking events share a run
    t = ev["t_ns"].to_numpy(dtype=np.int64)
    # a run lasts to its last event, stackless ones included: the completion of a free its code requested
    # (stackless) comes after the request, so the step's last temporary was freed within the run
    end = pd.Series(np.where(flag | (ev_sid < 0), t, np.iinfo(np.int64).min)).groupby(run).max()
    ev_end = end.reindex(run).to_numpy(dtype=np.int64)
    bid = pd.array(ev["block_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    alloc = (ev["action"].astype(str).to_numpy() == "alloc") & (bid >= 0) & flag
    pos = pd.Index(b["block_id"].to_numpy()).get_indexer(bid[alloc])
    ok = pos >= 0
    out[pos[ok]] = np.maximum(ev_end[alloc][ok], alloc_t[pos[ok]])
    return np.where(made, out, -np.inf)
