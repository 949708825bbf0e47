"""Which saved activations to offload to host memory, and where in backward each comes back.

From a census prediction (the step predicted once with `memlens.advice.offload.SaveCensus` on the candidate
blocks, `census_prediction`): every save of the last forward is matched to its block (the census marker op
of the k-th save reads the k-th save's block). A saved tensor is a candidate when it is floating point, saved
once, made by its own module's forward ops (not an input or a parameter the caller still holds), at least
`memlens.swap.planner.size_floor` of the peak, and its idle interval runs from its last forward use to its
first backward use. The swap planner (`memlens.swap.plan_swaps`, restricted to those intervals) picks the
blocks to move and times the copies over the GPU table's host link; each picked block comes back at the
latest module backward start at or before its planned copy-in start (`OffloadTensor.prefetch_at`), and its
stall is the copy-in's end past its first backward use, the copies-in queued on one stream in that order.
Without a host link in the GPU table nothing is planned.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.advice.offload import CENSUS_MARKER, OffloadTensor


@dataclass
class OffloadPlan:
    """The planned tensors (`tensors`, `OffloadTensor` rows), per owner module ``(bytes off the predicted
    peak, stall ns)`` in `by_module` (modeled clock), the swap planner's plan they come from (`swap`; None
    when nothing could be planned) and `notes` saying why something was not planned."""

    tensors: tuple = ()
    by_module: dict = field(default_factory=dict)
    swap: object = None
    notes: list = field(default_factory=list)


def host_link(gpu):
    """The GPU table's host link of `gpu` (a name or a `memlens.devicetime.gpus.GPU`) as a
    `memlens.analysis.bandwidth.BandwidthModel` (bytes/s each way, the row's copy latency); None when the
    GPU is unknown or its row has no host link."""
    from memlens.analysis.bandwidth import BandwidthModel
    from memlens.devicetime.gpus import gpu as resolve_gpu
    try:
        g = resolve_gpu(gpu) if isinstance(gpu, str) else gpu
    except Exception:       # a GPU the table does not know: no link to plan copies over
        return None
    link = getattr(g, "host_bw", None)
    if not link or not all(v and v > 0 for v in link):
        return None
    return BandwidthModel(h2d_bytes_per_s=float(link[1]), d2h_bytes_per_s=float(link[0]),
                          latency_ns=float(getattr(g, "latency_ns", 0.0) or 0.0), name=g.host_link)


def census_prediction(work, candidates: list[str], plan=None):
    """Predict `work` with `plan` applied (default: as it is; e.g. under its autocast, whose saves differ in
    dtype and size) and a `SaveCensus` on `candidates`; returns (prediction, census)."""
    from memlens.advice.offload import SaveCensus
    from memlens.advice.plan import Plan
    from memlens.advice.verify import run_plan
    census = SaveCensus(candidates)
    return run_plan(work, plan if plan is not None else Plan(), prepare=census.install), census


def saved_blocks(trace, saves: list, candidates: list[str], from_op: int = 0,
                 root: str | None = None) -> pd.DataFrame | None:
    """The census `saves` (`SaveCensus.last_call()`) with their block: columns module, index, shape, dtype,
    block_id, size, made_by (the allocating op), candidate (see the module docstring, but for the interval).
    None when the trace's census marker ops from `from_op` on do not match the saves one to one."""
    from memlens.advice.checkpoint import _root_prefix
    ops = trace.ops
    marks = ops.loc[(ops["name"] == CENSUS_MARKER) & (ops["op_id"] >= from_op), "op_id"].sort_values()
    if len(marks) != len(saves) or not len(saves):
        return None
    acc = trace.accesses
    read = acc[acc["op_id"].isin(marks) & ~acc["is_write"]].groupby("op_id")["block_id"].first()
    if len(read) != len(marks):
        return None
    out = pd.DataFrame([s[:4] for s in saves], columns=["module", "index", "shape", "dtype"])
    out["block_id"] = read.reindex(marks.to_numpy()).to_numpy(np.int64)
    blocks = trace.blocks.drop_duplicates("block_id").set_index("block_id")
    out["size"] = blocks["size"].reindex(out["block_id"]).to_numpy(np.int64)
    out["made_by"] = blocks["op"].reindex(out["block_id"]).to_numpy()
    if root is None:
        root = _root_prefix(set(ops["module"].unique()), candidates)
    alloc_op = blocks["alloc_op_id"].reindex(out["block_id"])
    alloc_module = alloc_op.map(ops.set_index("op_id")["module"]).fillna("").to_numpy()
    phase = alloc_op.map(ops.set_index("op_id")["phase"]).fillna("").to_numpy() if "phase" in ops else None
    own = [(m == _path(root, o) or m.startswith(_path(root, o) + ".")) for m, o in zip(alloc_module, out["module"])]
    mine = np.asarray(own, bool) & (alloc_op.fillna(-1).to_numpy(np.int64) >= from_op)
    if phase is not None:
        mine &= phase == "forward"
    out["candidate"] = mine & ~out["block_id"].duplicated(keep=False).to_numpy()
    return out


def _path(root: str, name: str) -> str:
    return f"{root}.{name}" if root and name else (root or name)


def backward_starts(trace, from_op: int, root: str) -> dict:
    """``named_modules`` name -> start (ns) of its first backward op from `from_op` on (a module's backward
    includes its descendants'; ``""`` is the model, the start of backward)."""
    ops = trace.ops
    bwd = ops[(ops["phase"] == "backward") & (ops["op_id"] >= from_op)]
    first = bwd.groupby("module")["start_ns"].min()
    out: dict = {}
    for path, start in first.items():
        if path == root:
            name = ""
        elif root and path.startswith(root + "."):
            name = path[len(root) + 1:]
        else:
            continue
        parts = name.split(".") if name else []
        for k in range(len(parts) + 1):
            prefix = ".".join(parts[:k])
            out[prefix] = min(out.get(prefix, start), int(start))
    return out


def plan_offload(trace, saves: list, candidates: list[str], link, from_op: int = 0,
                 min_size: int | None = None) -> OffloadPlan:
    """An `OffloadPlan` for `trace` (a census prediction's, modeled clock; its last step starts at op
    `from_op`) and the census `saves`, over `link` (a `BandwidthModel`, `host_link`; None plans nothing).
    `min_size`: the smallest block worth moving (bytes; default `size_floor` of the trace's peak)."""
    from memlens.advice.checkpoint import _peak_time, _root_prefix
    from memlens.swap import plan_swaps
    from memlens.swap.planner import size_floor
    if link is None:
        return OffloadPlan(notes=["no host link in the GPU table for this GPU: offload not planned"])
    root = _root_prefix(set(trace.ops["module"].unique()), candidates)
    found = saved_blocks(trace, saves, candidates, from_op, root)
    if found is None:
        return OffloadPlan(notes=["the census of saved tensors did not match the predicted step (more than one "
                                  "forward per step?): offload not planned"])
    ops = trace.ops
    bwd = ops[(ops["phase"] == "backward") & (ops["op_id"] >= from_op)]
    if not len(bwd):
        return OffloadPlan(notes=["the step has no backward: nothing to offload"])
    bwd_start = int(bwd["start_ns"].min())
    step_start = int(ops.loc[ops["op_id"] >= from_op, "start_ns"].min())
    eligible = set(found.loc[found["candidate"], "block_id"].tolist())

    def only(iv):      # the forward-to-backward interval of a candidate saved tensor of this step
        return (iv["block_id"].isin(eligible) & (iv["idle_from_ns"] >= step_start)
                & (iv["idle_from_ns"] <= bwd_start) & (iv["idle_to_ns"] >= bwd_start)).to_numpy()
    if min_size is None:
        from memlens.swap.schedule import LoadCurve
        min_size = size_floor(LoadCurve(trace, "cuda:0").peak()[0])
    swap = plan_swaps(trace, bandwidth=link, device="cuda:0", min_size=min_size, only=only)
    sw = swap.swaps
    if not len(sw):
        return OffloadPlan(swap=swap, notes=["no saved tensor is large and idle long enough to offload"])
    starts = backward_starts(trace, from_op, root)
    by_block = found[found["candidate"]].set_index("block_id")
    acc = trace.accesses.merge(ops[["op_id", "name", "start_ns", "end_ns"]], on="op_id")
    rows = []
    for s in sw.itertuples(index=False):
        mine = acc[acc["block_id"] == s.block_id]
        last = mine.loc[mine["end_ns"] == s.idle_from_ns, "name"]
        first = mine.loc[mine["start_ns"] == s.idle_to_ns, "name"]
        want = min(int(s.in_start_ns), int(s.idle_to_ns))
        # the latest module backward start at or before the planned copy-in (the deepest module at a tie)
        at = max(((t, n.count(".") + bool(n), n) for n, t in starts.items() if t <= want),
                 default=(bwd_start, 0, ""))
        rows.append((s, by_block.loc[s.block_id], at[2], int(at[0]),
                     last.iloc[-1] if len(last) else "", first.iloc[0] if len(first) else ""))
    stalls = _stalls(rows, link)
    t_peak = _peak_time(trace)
    tensors, by_module = [], {}
    for (s, save, at, t_at, last, first), (in_start, stall) in zip(rows, stalls):
        tensors.append(OffloadTensor(save["module"], int(save["index"]), tuple(int(d) for d in save["shape"]),
                                     save["dtype"], int(s.size), at, str(save["made_by"]), last, first, stall))
        off_peak = int(s.size) if s.out_end_ns <= t_peak < in_start else 0
        b, ns = by_module.get(save["module"], (0, 0))
        by_module[save["module"]] = (b + off_peak, ns + stall)
    tensors.sort(key=lambda t: (t.module, t.index))
    return OffloadPlan(tuple(tensors), by_module, swap)


def _stalls(rows, link) -> list:
    """(copy-in start ns, stall ns) per row: the copies back queued on one host->device stream in the order
    of their prefetch points, each starting at its point, after its own copy-out and after the previous
    copy-in; the stall is its end past the first backward use (`idle_to_ns`)."""
    order = sorted(range(len(rows)), key=lambda k: (rows[k][3], rows[k][0].idle_to_ns))
    out, free_at = [None] * len(rows), None
    for k in order:
        s, t_at = rows[k][0], rows[k][3]
        in_ns = int(np.ceil(link.swap_in_ns(int(s.size))))
        start = max(t_at, int(s.out_end_ns), free_at if free_at is not None else t_at)
        free_at = start + in_ns
        out[k] = (start, max(free_at - int(s.idle_to_ns), 0))
    return out

