"""Corrections for where autograd on fake tensors allocates differently from a real CUDA run.

Fake tensors are tensor subclasses, and autograd treats subclasses conservatively: where a real run writes
into a dying tensor, the fake run allocates a new one. Two such places are corrected, both by *folding*:
the op's output block is merged into the operand the real run would have written into (that operand's
lifetime is extended to the output's free, the output's accesses are re-pointed, the output block is
dropped). An operand qualifies only if it is on the GPU, has the output's size, has no later access and is
freed before the next op starts (the engine held its last reference).

- **Gradient accumulation** (torch/csrc/autograd/input_buffer.cpp ``accumulate``): with two gradients for one
  tensor, the engine computes ``old.add_(new)`` (or ``new.add_(old)``) when it holds the last reference to a
  dense non-subclass tensor; with fake tensors always ``old + new``. Seen in the trace as an ``aten::add`` in
  the backward phase whose operands were both made in backward, one of them by an earlier backward node
  (the buffered gradient, tried first).
- **Scatter-into-zeros backward formulas** (``value_selecting_reduction_backward`` for max/min with ``dim``,
  ``index_backward`` for advanced indexing such as an embedding lookup ``weight[ids]``, slice/select
  backward): on real tensors ``zeros(...).scatter_(...)`` / ``.index_put_(...)`` / ``.copy_()`` in place; the
  subclass branch calls the out-of-place variant. Seen as ``aten::scatter`` / ``index_put`` /
  ``slice_scatter`` ... in backward whose ``self`` operand was made in the same backward node.

Not corrected (the notes say so): reshape vs view under subclasses and AccumulateGrad's copy-or-steal of a
parameter's first gradient.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

ACCUMULATE_OPS = frozenset({"aten::add", "aten::add.Tensor"})
# backward formulas that write into fresh zeros in place on real tensors and out of place on subclasses
# (torch/csrc/autograd/FunctionsManual.cpp: value_selecting_reduction_backward, index_backward,
# slice/select backward, ... all branch on isTensorSubclassLike)
SCATTER_OPS = frozenset({"aten::scatter", "aten::scatter_add", "aten::index_put", "aten::index_add",
                         "aten::masked_scatter", "aten::slice_scatter", "aten::select_scatter",
                         "aten::diagonal_scatter", "aten::as_strided_scatter"})


def fold_in_place(trace) -> dict:
    """Apply both folds (see module docstring) to `trace`'s tables in place; returns counts per kind."""
    ops, blocks, acc = trace.ops, trace.blocks, trace.accesses
    counts = {"accumulate_in_place": 0, "scatter_in_place": 0}
    if len(ops) == 0 or len(blocks) == 0:
        return counts
    bwd = ops[(ops["phase"] == "backward") & ops["name"].isin(ACCUMULATE_OPS | SCATTER_OPS)]
    if len(bwd) == 0:
        return counts
    starts = np.sort(ops["start_ns"].to_numpy())
    op_seq = dict(zip(ops["op_id"].to_numpy(), ops["autograd_seq"].to_numpy()))
    op_phase = dict(zip(ops["op_id"].to_numpy(), ops["phase"].to_numpy()))
    bid = blocks["block_id"].to_numpy()
    size = dict(zip(bid, blocks["size"].to_numpy()))
    on_gpu = dict(zip(bid, blocks["device"].str.startswith("cuda").to_numpy()))
    made_by = dict(zip(bid, blocks["alloc_op_id"].to_numpy(dtype="float64", na_value=np.nan)))
    free_ns = dict(zip(bid, blocks["free_ns"].to_numpy(dtype="float64", na_value=np.nan)))
    free_seq = dict(zip(bid, blocks["free_seq"].to_numpy(dtype="float64", na_value=np.nan)))
    made = blocks[blocks["alloc_op_id"].isin(bwd["op_id"])]
    out_of = made.groupby("alloc_op_id")["block_id"].first().to_dict()
    sub = acc[acc["op_id"].isin(bwd["op_id"]) & ~acc["is_write"]]
    reads_of = sub.groupby("op_id", sort=False)["block_id"].apply(lambda s: list(dict.fromkeys(s))).to_dict()
    last_access = acc.groupby("block_id")["op_id"].max().to_dict()
    remap: dict[int, int] = {}

    def resolve(b):
        while b in remap:
            b = remap[b]
        return b

    for op_id, name, t0, seq in zip(bwd["op_id"].to_numpy(), bwd["name"].to_numpy(), bwd["start_ns"].to_numpy(),
                                    bwd["autograd_seq"].to_numpy()):
        out = out_of.get(op_id)
        ins = [resolve(b) for b in reads_of.get(op_id, [])]
        if out is None or not ins or not on_gpu.get(out, False):
            continue
        makers = [made_by.get(b, np.nan) for b in ins]
        seqs = [op_seq.get(int(m)) if not np.isnan(m) else None for m in makers]
        if name in ACCUMULATE_OPS:
            if len(ins) != 2 or any(np.isnan(m) or op_phase.get(int(m)) != "backward" for m in makers):
                continue
            earlier = [b for b, q in zip(ins, seqs) if q != seq]
            if not earlier:                               # the buffered gradient comes from an earlier node
                continue
            kind, tries = "accumulate_in_place", earlier + [b for b in ins if b not in earlier]
        else:
            zeros = [b for b, q in zip(ins, seqs) if q == seq and size.get(b) == size[out]]
            if not zeros:                                 # scatter into zeros made in this node
                continue
            kind, tries = "scatter_in_place", zeros[:1]
        nxt = np.searchsorted(starts, t0, side="right")
        next_start = starts[nxt] if nxt < len(starts) else np.inf
        for b in tries:
            f = free_ns.get(b, np.nan)
            if (size.get(b) != size[out] or not on_gpu.get(b, False) or np.isnan(f) or f > next_start
                    or last_access.get(b, -1) > op_id):
                continue
            free_ns[b], free_seq[b] = free_ns[out], free_seq[out]
            last_access[b] = last_access.get(out, op_id)
            remap[out] = b
            counts[kind] += 1
            break
    if not remap:
        return counts
    keep = ~blocks["block_id"].isin(list(remap))
    new_blocks = blocks[keep].copy()
    ids = new_blocks["block_id"].to_numpy()
    for col, values in (("free_ns", free_ns), ("free_seq", free_seq)):
        arr = np.array([values[b] for b in ids], dtype="float64")
        new_blocks[col] = pd.array(np.where(np.isnan(arr), 0, arr).astype(np.int64), dtype="Int64")
        new_blocks.loc[np.isnan(arr), col] = pd.NA
    trace.blocks = new_blocks.reset_index(drop=True)
    a_ids = acc["block_id"].to_numpy()
    hit = np.isin(a_ids, np.fromiter(remap.keys(), dtype=np.int64))
    if hit.any():
        acc = acc.copy()
        acc.loc[hit, "block_id"] = [resolve(int(b)) for b in a_ids[hit]]
        trace.accesses = acc
    return counts


def apply_corrections(trace):
    """Apply every correction; records the counts in ``metadata["prediction_corrections"]``. Returns it."""
    counts = fold_in_place(trace)
    if any(counts.values()):
        trace.metadata.setdefault("notes", []).append(
            "predict: folded in place as autograd does on real tensors: "
            + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items() if v))
    trace.metadata["prediction_corrections"] = counts
    return trace
