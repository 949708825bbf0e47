"""Step time of a predicted rank on the modeled GPU clock, collectives included, as a two-stream schedule.

Collective cost (ring algorithms, NCCL's "bus bandwidth" convention, nccl-tests doc/PERFORMANCE.md): for a
message of S bytes (all-gather: the gathered output; reduce-scatter: the unreduced input; all-reduce and
broadcast: the tensor) on N ranks, a ring moves ``(N-1)/N x S`` bytes over each rank's link for all-gather and
reduce-scatter, ``2 (N-1)/N x S`` for all-reduce (reduce-scatter then all-gather) and ``S`` for broadcast
(pipelined ring), in ``N-1`` steps (``2 (N-1)`` for all-reduce), each paying a latency. So

    time_ns = factor x (N-1)/N x S / (efficiency x link_bw) + factor x (N-1) x step_latency_ns

with factor 2 for all-reduce, 1 otherwise. ``link_bw`` is the GPU table's ``nvlink_bw`` (per GPU, one
direction) when the world fits in one node (``N <= gpus_per_node``), else its ``network_bw`` (per GPU).
`EFFICIENCY` (0.8) and the step latencies are assumptions, stated and not fitted to any measurement.

Schedule (how FSDP2 overlaps): compute ops run in host order, back to back, for their modeled durations on
the compute stream; each collective runs on its own stream per kind (all-gather, reduce-scatter, all-reduce)
and starts when issued (the compute stream's time at its host position) and when the previous collective
on its stream has ended; the first later op that touches a block the collective wrote waits for it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

EFFICIENCY = 0.8                 # assumed achieved fraction of the link's bus bandwidth (not fitted)
INTRA_NODE_STEP_NS = 1_000.0     # assumed latency per ring step over NVLink, ns
INTER_NODE_STEP_NS = 5_000.0     # assumed latency per ring step over the network, ns
SOURCE = ("ring model and bus-bandwidth convention: nccl-tests doc/PERFORMANCE.md "
          "(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md); efficiency 0.8 and step "
          "latencies 1 us (NVLink) / 5 us (network) are assumptions, not fitted")

# op name fragment -> (collective kind, ring factor)
_KINDS = (("allgather", "all_gather", 1), ("all_gather", "all_gather", 1), ("reduce_scatter", "reduce_scatter", 1),
          ("allreduce", "all_reduce", 2), ("all_reduce", "all_reduce", 2), ("broadcast", "broadcast", 1))


def collective_kind(name: str):
    """(kind, ring factor) for a c10d collective op name, None for any other op."""
    if not str(name).startswith(("c10d::", "_c10d_functional::")):
        return None
    low = str(name).lower()
    for frag, kind, factor in _KINDS:
        if frag in low:
            return kind, factor
    return None


def link(gpu, world_size: int) -> tuple[float, float, str]:
    """(bytes/s per GPU, step latency ns, which link) for a ring of `world_size` ranks of `gpu`."""
    if world_size <= gpu.gpus_per_node and gpu.nvlink_bw > 0:
        return gpu.nvlink_bw, INTRA_NODE_STEP_NS, "NVLink"
    if world_size <= gpu.gpus_per_node:     # no NVLink: peers talk over the host link (PCIe)
        return min(gpu.host_bw), INTRA_NODE_STEP_NS, "PCIe"
    if not gpu.network_bw > 0:
        from memlens.errors import InputError
        raise InputError(f"GPU {gpu.name!r} has no network_bw, so {world_size} ranks (> {gpu.gpus_per_node} per "
                         "node) cannot be timed; give one with memlens.GPU(..., network_bw=bytes/s)")
    return gpu.network_bw, INTER_NODE_STEP_NS, "network"


def collective_ns(kind: str, nbytes: int, world_size: int, gpu) -> float:
    """Modeled duration (ns) of one ring collective of `nbytes` (module docstring) on `world_size` ranks."""
    if world_size <= 1:
        return 0.0
    factor = 2 if kind == "all_reduce" else 1
    bw, step, _ = link(gpu, world_size)
    n = world_size
    moved = nbytes if kind == "broadcast" else (n - 1) / n * nbytes
    return factor * moved / (EFFICIENCY * bw) * 1e9 + factor * (n - 1) * step


def schedule(ops: pd.DataFrame, accesses: pd.DataFrame, world_size: int, gpu) -> pd.DataFrame:
    """Per-op (start_ns, end_ns, stream, wait_ns) of the two-stream schedule, aligned with `ops` rows.

    Compute ops keep their modeled durations (``end_ns - start_ns``); collectives get `collective_ns`."""
    order = np.lexsort((ops["op_id"].to_numpy(), ops["start_ns"].to_numpy()))
    names = ops["name"].to_numpy()
    ids = ops["op_id"].to_numpy()
    dur = (ops["end_ns"] - ops["start_ns"]).to_numpy(np.int64)
    # the ops table counts a collective's output argument among its reads too (all-gather: read = shard +
    # gathered output, written = output; reduce-scatter: read = input + shard, written = shard), so the
    # message (gathered output / unreduced input / the tensor) is the larger of written and read - written
    read, wrote = ops["bytes_read"].to_numpy(np.int64), ops["bytes_written"].to_numpy(np.int64)
    size = np.maximum(wrote, read - wrote)
    writes = accesses[accesses["is_write"].astype(bool)] if len(accesses) else accesses
    written = writes.groupby("op_id")["block_id"].apply(set).to_dict() if len(writes) else {}
    touched = accesses.groupby("op_id")["block_id"].apply(set).to_dict() if len(accesses) else {}
    start = np.zeros(len(ops), dtype=np.float64)
    end = np.zeros(len(ops), dtype=np.float64)
    wait = np.zeros(len(ops), dtype=np.float64)
    stream = np.array(["compute"] * len(ops), dtype=object)
    clock = 0.0
    stream_free: dict[str, float] = {}
    pending: dict[int, float] = {}      # block written by a collective -> its end
    for i in order:
        kc = collective_kind(names[i])
        if kc is not None:
            kind = kc[0]
            s = max(clock, stream_free.get(kind, 0.0))
            e = s + collective_ns(kind, int(size[i]), world_size, gpu)
            start[i], end[i], stream[i] = s, e, kind
            stream_free[kind] = e
            for b in written.get(ids[i], ()):
                pending[b] = e
            continue
        ready = clock
        for b in touched.get(ids[i], ()):
            if b in pending:
                ready = max(ready, pending.pop(b))
        wait[i] = ready - clock
        start[i], end[i] = ready, ready + dur[i]
        clock = end[i]
    return pd.DataFrame({"op_id": ids, "name": names, "stream": stream, "start_ns": np.rint(start).astype(np.int64),
                         "end_ns": np.rint(end).astype(np.int64), "wait_ns": np.rint(wait).astype(np.int64)})


def step_time(trace, world_size: int, gpu) -> dict:
    """Step time (ns, modeled clock) of one predicted rank's trace: ``step_ns`` (last op's end), ``compute_ns``
    (compute-stream busy), ``comm_ns`` (sum of collective durations), ``exposed_comm_ns`` (time the compute
    stream waited plus collective time past the last compute op), the link used and the schedule."""
    from memlens.devicetime.gpus import gpu as resolve_gpu
    g = resolve_gpu(gpu)
    sched = schedule(trace.ops, trace.accesses, world_size, g)
    comp = sched[sched["stream"] == "compute"]
    coll = sched[sched["stream"] != "compute"]
    compute_end = int(comp["end_ns"].max()) if len(comp) else 0
    step = max(compute_end, int(coll["end_ns"].max()) if len(coll) else 0)
    compute_ns = int((comp["end_ns"] - comp["start_ns"]).sum())
    bw, lat, which = link(g, world_size)
    return {"step_ns": step, "compute_ns": compute_ns, "comm_ns": int((coll["end_ns"] - coll["start_ns"]).sum()),
            "exposed_comm_ns": step - compute_ns, "collectives": len(coll), "link": which, "link_bw": bw,
            "step_latency_ns": lat, "efficiency": EFFICIENCY, "clock": "modeled GPU clock", "source": SOURCE,
            "note": _NO_COLLECTIVES if world_size > 1 and not len(coll) else "", "schedule": sched}


# DDP's C++ reducer calls the process group directly, outside the dispatcher, so its bucket all-reduces are
# not ops in a predicted trace (checked: a DDP step records no c10d op); its step time is compute only
_NO_COLLECTIVES = ("no c10d collective op in this rank's ops table (DDP's bucket all-reduces run outside the "
                   "dispatcher and are not recorded): communication is not timed, the step time is compute only")


def onto_step_clock(trace, world_size: int, gpu):
    """A new Trace of one predicted rank with every op at its place in the two-stream schedule (collectives
    on their modeled start/end, compute ops delayed by their waits), so swap/prefetch what-ifs and the
    analyses see the same modeled clock as `step_time`; ``metadata["clock"]`` per the clock contract, the
    op's stream in a new ``stream`` column of the ops table. The input trace is not modified."""
    from memlens.clock import restamp
    from memlens.devicetime.gpus import gpu as resolve_gpu
    from memlens.schema import make_clock
    g = resolve_gpu(gpu)
    t = step_time(trace, world_size, g)
    sched = t["schedule"]
    old = trace.metadata.get("clock") or {}
    clock = make_clock("modeled", gpu=g.name, model=f"{old.get('model') or 'memlens.devicetime'}; collectives: "
                       f"ring over {t['link']}, own streams overlapping compute (memlens steptime)",
                       device_busy_ns=t["compute_ns"], kernels=old.get("kernels"))
    out = restamp(trace, sched["start_ns"].to_numpy(), sched["end_ns"].to_numpy(), clock,
                  op_columns={"stream": sched["stream"].to_numpy()},
                  note=f"times are on the modeled clock of {g.name}: compute ops in host order, collectives on "
                       f"their own streams ({t['source']})")
    out.metadata.setdefault("prediction", {})["step_time"] = {k: v for k, v in t.items() if k != "schedule"}
    return out
