"""Step time of a predicted rank on the modeled GPU clock, collectives included, as a two-stream schedule.

Collective durations: `memlens.devicetime.collectives` (ring or double binary tree, the faster per
message; hierarchical across nodes; formulas in its docstring). The message of a recorded c10d op is the
gathered output (all-gather), the unreduced input (reduce-scatter), the tensor (all-reduce, broadcast) or the
send buffer (all-to-all).

Schedule (how FSDP2 overlaps): compute ops run in host order, back to back, for their modeled durations on
the compute stream; each collective runs on its own stream per kind (all-gather, reduce-scatter, all-reduce)
and starts when issued (the compute stream's time at its host position: NCCL's stream waits for the stream
it is issued from) and when the previous collective on its stream has ended; the first later op that
touches a block the collective wrote waits for it.

FSDP2's all-gathers are the exception (prefetch): FSDP2 issues them from its own streams, so they wait for
no compute the host issued before them. Its copy-in (``fsdp::all_gather_copy_in``) runs on the copy-in
stream, with every op that writes a block allocated on that stream (FSDP2 computes the all-gather inputs
there: the mixed-precision casts of the sharded parameters). They start when the blocks they read were last
written (the sharded parameters: after the previous step's optimizer) and when the previous all-gather's
copy-out (``fsdp::split_with_sizes_copy``, on the compute stream) has ended: the event FSDP2's ``unshard``
waits on before reusing all-gather memory (forward: the ``all_gather_state`` event; backward: the copy-out
event); before any copy-out, at the compute stream's time (FSDP2's root makes the copy-in stream wait for
it). The all-gather a copy-in feeds starts when the copy-in ends. So the next group's all-gather overlaps
the current group's compute, in forward and in backward, as the host runs ahead of the GPU. Assumed: the
host is ahead (launch-bound steps are not modelled); copies on the copy-in stream take no bandwidth from
compute.

DDP (its C++ Reducer calls NCCL outside the dispatcher, so no c10d op is recorded): the bucket all-reduces
come from the rank's ``metadata["prediction"]["ddp"]`` (`memlens.prediction.distributed.ddp`). Each bucket is
issued, in the Reducer's bucket order, when its last gradient has been copied into it (the compute stream's
time at the end of the op before its ready position) and runs on the all-reduce stream, one bucket after the
other, overlapping the rest of backward; the first op after the end of the backward pass (the Reducer's
``finalize_backward`` makes the compute stream wait on every bucket) waits for all of that pass's buckets.
Exposed communication is what runs past the compute that could hide it: the step's end minus the compute
stream's busy time.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.devicetime.collectives import (EFFICIENCY, INTER_NODE_STEP_NS, INTRA_NODE_STEP_NS,
                                                     SOURCE, collective_ns, collective_time, intra_link,
                                                     network_bw)

__all__ = ["collective_kind", "collective_ns", "collective_time", "link", "schedule", "step_time",
           "onto_step_clock", "EFFICIENCY", "SOURCE"]

# FSDP2's all-gather copy-in (on its copy-in stream) and copy-out (on the compute stream)
COPY_IN, COPY_OUT, COPY_IN_STREAM = "fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "all_gather_copy_in"
# op name fragment -> (collective kind, ring factor)
_KINDS = (("allgather", "all_gather", 1), ("all_gather", "all_gather", 1), ("reduce_scatter", "reduce_scatter", 1),
          ("allreduce", "all_reduce", 2), ("all_reduce", "all_reduce", 2), ("broadcast", "broadcast", 1),
          ("alltoall", "all_to_all", 1), ("all_to_all", "all_to_all", 1))


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
    """(bytes/s per GPU, step latency ns, which link) of the slowest link a collective of `world_size` ranks
    of `gpu` crosses: NVLink (or PCIe) within a node, the network across nodes."""
    if world_size <= gpu.gpus_per_node:
        bw, which = intra_link(gpu)
        return bw, INTRA_NODE_STEP_NS, which
    return network_bw(gpu, world_size), INTER_NODE_STEP_NS, f"{intra_link(gpu)[1]} + network"


def _ddp_events(metadata) -> list[dict]:
    """The DDP bucket all-reduces of a rank, flattened: ``{"ddp", "pass", "bucket", "bytes", "ready",
    "end"}`` (ready / end: op counts, see `ddp.all_reduce_rounds`)."""
    from memlens.prediction.distributed.ddp import all_reduce_rounds
    events = []
    for d, record in enumerate(((metadata or {}).get("prediction") or {}).get("ddp") or []):
        for k, rnd in enumerate(all_reduce_rounds(record)):
            for b, (nbytes, ready) in enumerate(rnd["buckets"]):
                events.append({"ddp": d, "pass": k, "bucket": b, "bytes": int(nbytes), "ready": ready,
                               "end": rnd["end"]})
    return events


def schedule(ops: pd.DataFrame, accesses: pd.DataFrame, world_size: int, gpu, ddp_events=None,
             blocks: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-op (start_ns, end_ns, stream, wait_ns, algorithm) of the two-stream schedule, aligned with `ops`
    rows. Compute ops keep their modeled durations (``end_ns - start_ns``); collectives get
    `collective_time`. `ddp_events` (see `_ddp_events`): DDP bucket all-reduces to schedule too (their
    times: `ddp_schedule`). `blocks` (the trace's, with ``stream``): which ops ran on FSDP2's copy-in stream
    (`copy_in_stream_ops`)."""
    return _schedule(ops, accesses, world_size, gpu, ddp_events or [],
                     copy_in_stream_ops(ops, accesses, blocks))[0]


def copy_in_stream_ops(ops: pd.DataFrame, accesses: pd.DataFrame, blocks: pd.DataFrame | None) -> set:
    """Op ids that ran on FSDP2's all-gather copy-in stream: the copy-ins, and every other op (not a
    collective) that writes a block allocated on the stream the copy-ins' outputs were allocated on (FSDP2
    computes the all-gather inputs there, e.g. the mixed-precision casts of the sharded parameters into the
    copy-in's input buffer). Without a blocks table with streams: the copy-ins."""
    ids = set(ops.loc[ops["name"] == COPY_IN, "op_id"].astype(int))
    if blocks is None or not ids or not {"stream", "block_id"} <= set(blocks.columns) or not len(accesses):
        return ids
    writes = accesses[accesses["is_write"].astype(bool)]
    stream_of = dict(zip(blocks["block_id"].astype(int), blocks["stream"].astype(int)))
    side = {stream_of.get(int(b), 0) for b in writes.loc[writes["op_id"].isin(ids), "block_id"]} - {0}
    if not side:
        return ids
    names = dict(zip(ops["op_id"].astype(int), ops["name"]))
    writers = writes.loc[writes["block_id"].map(stream_of).isin(side), "op_id"].astype(int)
    return ids | {int(i) for i in writers.unique() if collective_kind(names.get(int(i), "")) is None}


def _schedule(ops, accesses, world_size, gpu, ddp_events, copy_in_ops=frozenset()):
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
    algorithm = np.array([""] * len(ops), dtype=object)
    clock = 0.0
    stream_free: dict[str, float] = {}
    pending: dict[int, float] = {}      # block written by a collective -> its end
    last_write: dict[int, float] = {}   # block -> end of the op (compute or copy-in stream) that last wrote it
    fed: dict[int, float] = {}          # block written by an FSDP2 copy-in -> the copy-in's end
    copy_out_end = None                 # end of the latest FSDP2 all-gather copy-out (compute stream)
    # DDP: per DDP module its buckets in issue order (pass, then the Reducer's bucket order)
    queues: dict[int, list] = {}
    for e in ddp_events:
        queues.setdefault(e["ddp"], []).append(dict(e))
    heads = {d: 0 for d in queues}
    issued: list[dict] = []
    barriers = sorted({(e["end"], e["ddp"], e["pass"]) for e in ddp_events})

    def issue_ready(position):
        """Issue every DDP bucket whose gradients are in by `position` (an op count), at the current time."""
        for d, q in queues.items():
            while heads[d] < len(q) and q[heads[d]]["ready"] <= position:
                e = q[heads[d]]
                heads[d] += 1
                e["issue_ns"] = clock
                e["start_ns"] = max(clock, stream_free.get("all_reduce", 0.0))
                t, e["algorithm"] = collective_time("all_reduce", e["bytes"], world_size, gpu)
                e["end_ns"] = e["start_ns"] + t
                stream_free["all_reduce"] = e["end_ns"]
                issued.append(e)

    for i in order:
        if queues:
            issue_ready(int(ids[i]))
        if names[i] == COPY_IN or int(ids[i]) in copy_in_ops:
            # FSDP2's copy-in stream: after the blocks it reads were written and the previous copy-out
            # (no copy-out yet: the first group, after FSDP2's root made the copy-in stream wait for compute)
            ready = max([copy_out_end if copy_out_end is not None else clock]
                        + [last_write.get(b, 0.0) for b in touched.get(ids[i], ())])
            s = max(ready, stream_free.get(COPY_IN_STREAM, 0.0))
            start[i], end[i], stream[i] = s, s + dur[i], COPY_IN_STREAM
            stream_free[COPY_IN_STREAM] = end[i]
            for b in written.get(ids[i], ()):
                fed[b] = pending[b] = last_write[b] = end[i]
            continue
        kc = collective_kind(names[i])
        if kc is not None:
            kind = kc[0]
            inputs = [fed[b] for b in touched.get(ids[i], ()) if b in fed]
            # an FSDP2 all-gather waits for its copy-in only; any other collective for the compute stream too
            issued_at = max(inputs) if kind == "all_gather" and inputs else clock
            s = max(issued_at, stream_free.get(kind, 0.0))
            t, algorithm[i] = collective_time(kind, int(size[i]), world_size, gpu)
            start[i], end[i], stream[i] = s, s + t, kind
            stream_free[kind] = end[i]
            for b in written.get(ids[i], ()):
                pending[b] = end[i]
            continue
        ready = clock
        while barriers and barriers[0][0] <= ids[i]:      # finalize_backward: wait for the pass's buckets
            _, d, k = barriers.pop(0)
            ready = max([ready] + [e["end_ns"] for e in issued if e["ddp"] == d and e["pass"] == k])
        for b in touched.get(ids[i], ()):
            if b in pending:
                ready = max(ready, pending.pop(b))
        wait[i] = ready - clock
        start[i], end[i] = ready, ready + dur[i]
        clock = end[i]
        for b in written.get(ids[i], ()):
            last_write[b] = clock
        if names[i] == COPY_OUT:
            copy_out_end = clock
    if queues:
        issue_ready(np.iinfo(np.int64).max)             # buckets ready after the last op
    sched = pd.DataFrame({"op_id": ids, "name": names, "stream": stream, "start_ns": np.rint(start).astype(np.int64),
                          "end_ns": np.rint(end).astype(np.int64), "wait_ns": np.rint(wait).astype(np.int64),
                          "algorithm": algorithm})
    ddp = [{"ddp": e["ddp"], "pass": e["pass"], "bucket": e["bucket"], "bytes": e["bytes"],
            "ready_op": e["ready"], "backward_end_op": e["end"], "issue_ns": int(round(e["issue_ns"])),
            "start_ns": int(round(e["start_ns"])), "end_ns": int(round(e["end_ns"])), "stream": "all_reduce",
            "algorithm": e["algorithm"]} for e in issued]
    return sched, ddp


def step_time(trace, world_size: int, gpu) -> dict:
    """Step time (ns, modeled clock) of one predicted rank's trace: ``step_ns`` (the last op's or collective's
    end), ``compute_ns`` (compute-stream busy), ``comm_ns`` (sum of collective durations, DDP's bucket
    all-reduces included), ``copy_in_ns`` (FSDP2's all-gather copy-ins, on their own stream),
    ``exposed_comm_ns`` (``step_ns - compute_ns``: time the compute stream waited plus collective time past
    the last compute op), ``ddp_all_reduces`` (one dict per DDP bucket all-reduce: bytes,
    ready op, issue/start/end ns, algorithm), the link used and the schedule."""
    from memlens.devicetime.gpus import gpu as resolve_gpu
    g = resolve_gpu(gpu)
    events = _ddp_events(getattr(trace, "metadata", None))
    sched, ddp = _schedule(trace.ops, trace.accesses, world_size, g, events,
                           copy_in_stream_ops(trace.ops, trace.accesses, getattr(trace, "blocks", None)))
    comp = sched[sched["stream"] == "compute"]
    coll = sched[~sched["stream"].isin(["compute", COPY_IN_STREAM])]
    copy_in = sched[sched["stream"] == COPY_IN_STREAM]
    compute_end = int(comp["end_ns"].max()) if len(comp) else 0
    step = max([compute_end, int(coll["end_ns"].max()) if len(coll) else 0,
                int(copy_in["end_ns"].max()) if len(copy_in) else 0] + [e["end_ns"] for e in ddp])
    compute_ns = int((comp["end_ns"] - comp["start_ns"]).sum())
    comm_ns = int((coll["end_ns"] - coll["start_ns"]).sum()) + sum(e["end_ns"] - e["start_ns"] for e in ddp)
    bw, lat, which = link(g, world_size)
    n_coll = len(coll) + len(ddp)
    return {"step_ns": step, "compute_ns": compute_ns, "comm_ns": comm_ns,
            "copy_in_ns": int((copy_in["end_ns"] - copy_in["start_ns"]).sum()),
            "exposed_comm_ns": step - compute_ns, "collectives": n_coll, "ddp_all_reduces": ddp, "link": which,
            "link_bw": bw, "step_latency_ns": lat, "efficiency": EFFICIENCY, "clock": "modeled GPU clock",
            "source": SOURCE, "note": _NO_COLLECTIVES if world_size > 1 and not n_coll else "", "schedule": sched}


# a trace with no c10d op and no DDP record (e.g. a DDP trace recorded outside `memlens.predict(world_size=)`,
# whose Reducer's all-reduces are never ops): its step time is compute only
_NO_COLLECTIVES = ("no c10d collective op in this rank's ops table and no DDP bucket record: communication is "
                   "not timed, the step time is compute only")


def onto_step_clock(trace, world_size: int, gpu, timing: dict | None = None):
    """A new Trace of one predicted rank with every op at its place in the two-stream schedule (collectives
    on their modeled start/end, compute ops delayed by their waits), so swap/prefetch what-ifs and the
    analyses see the same modeled clock as `step_time`; ``metadata["clock"]`` per the clock contract, the
    op's stream and collective algorithm in new ``stream`` / ``algorithm`` columns of the ops table. DDP's
    bucket all-reduces are no ops of the trace: their modeled start/end are in
    ``metadata["prediction"]["step_time"]["ddp_all_reduces"]``, and the compute ops that waited for them
    (the first op after each backward pass) start late by that wait. `timing`: this rank's `step_time`
    already computed elsewhere (a pipeline run's, `pipeline_time`, whose schedule includes the waits for
    neighbour stages). The input trace is not modified."""
    from memlens.clock import restamp
    from memlens.devicetime.gpus import gpu as resolve_gpu
    from memlens.trace.schema import make_clock
    g = resolve_gpu(gpu)
    t = timing if timing is not None else step_time(trace, world_size, g)
    sched = t["schedule"]
    old = trace.metadata.get("clock") or {}
    clock = make_clock("modeled", gpu=g.name, model=f"{old.get('model') or 'memlens.devicetime'}; collectives: "
                       f"ring or tree over {t['link']}, own streams overlapping compute (memlens steptime)",
                       device_busy_ns=t["compute_ns"], kernels=old.get("kernels"))
    out = restamp(trace, sched["start_ns"].to_numpy(), sched["end_ns"].to_numpy(), clock,
                  op_columns={"stream": sched["stream"].to_numpy(), "algorithm": sched["algorithm"].to_numpy()},
                  note=f"times are on the modeled clock of {g.name}: compute ops in host order, collectives on "
                       f"their own streams ({t['source']})")
    out.metadata.setdefault("prediction", {})["step_time"] = {k: v for k, v in t.items() if k != "schedule"}
    return out
