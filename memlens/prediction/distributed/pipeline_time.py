"""Step time of a pipeline-parallel prediction on the modeled GPU clock: bubbles and send/receive time.

Each stage rank is predicted alone (`pipeline`), so its own step (`steptime.step_time`) runs its compute back
to back as if every activation and gradient were already there. Here the ranks' own timelines are joined:

- Actions. While a rank ran, `pipeline` noted each ``forward_one_chunk`` ("F"), ``backward_one_chunk`` ("B",
  "I" for input gradients only) and ``backward_weight_one_chunk`` ("W") as a span of op ids, in the order
  the schedule ran them (the schedule's own order: GPipe, 1F1B, interleaved, ...), and each receive
  (``get_fwd_recv_ops`` / ``get_bwd_recv_ops``: peer global rank, bytes). On the rank's own schedule (compute
  stream, collectives on their streams), ``E(p)`` is when the compute stream has finished every op with id
  below ``p``. Action ``[a, b)`` takes ``E(b) - E(a)`` (its ops, and any wait of theirs for a collective);
  the ops between an action's end and the next action's start (the loss after a last-stage forward, the
  send, the receive) are a gap after it; the ops before the first action are the prelude, those after the
  last (gradient scaling, the optimizer) the epilogue. Prelude + actions + gaps + epilogue = the own step.
- p2p ops. ``c10d::send`` / ``c10d::recv_`` take no compute-stream time here (their modeled kernel time is
  dropped): a message is a link transfer instead, ``latency + bytes / (0.8 x bw)`` on NVLink (or PCIe)
  between ranks of one node (``rank // gpus_per_node``) or the network between nodes (`collectives` link
  constants: 1 us / 5 us step latency, efficiency 0.8; assumptions, not fitted). A receiving rank on the
  same rank as its sender (two stages of one rank) gets it at no cost.
- Schedule. Each rank runs prelude, then its actions in its recorded order, each followed by its gap, then
  the epilogue. Action F of stage s, microbatch m starts when the rank's previous work is done and the
  activation has arrived: the end of F(s-1, m) on the peer it receives from plus the transfer; B (or I) of
  stage s waits for B/I(s+1, m)'s input gradient likewise; W and the first/last stage's other actions wait
  only for their own rank. Sends are asynchronous (the sender does not wait for the transfer); messages
  over one link (sender, receiver) go one after the other in the order sent.

Per rank: ``step_ns`` (its end: own step + ``wait_ns``), ``busy_ns`` (compute-stream busy), ``wait_ns``
(time its compute stream waited for a neighbour before an action, transfer included), ``bubble_ns``
(``pipeline_step_ns - busy_ns``: the rank's idle time over the whole step), ``p2p_ns`` / ``p2p_bytes``
(transfers it received, whether hidden or not). The whole step, ``pipeline_step_ns``, is the max over ranks.
With every stage's F and B equal and no transfer time, GPipe and 1F1B both take ``(M + S - 1)(F + B)``
for M microbatches on S stages, a bubble fraction of ``(S - 1) / (M + S - 1)`` (tests).

Not modelled: the transfer competing with collectives or compute for the link or the SMs; NCCL's p2p
chunking; a receiver's ``recv_`` posted late; shape-inference exchanges before the step.
"""
from __future__ import annotations

import types

import numpy as np

from memlens.errors import InputError
from memlens.devicetime.collectives import (EFFICIENCY, INTER_NODE_STEP_NS, INTRA_NODE_STEP_NS,
                                                     intra_link, network_bw)

P2P_OPS = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")


class PipelineTimingError(InputError):
    """The recorded pipeline actions cannot be put on one clock (a receive with no recorded sender)."""


def p2p_link(gpu, src: int, dst: int) -> tuple[float, float, str]:
    """(bytes/s, latency ns, name) of the link a message from global rank `src` to `dst` crosses: NVLink (or
    PCIe) within a node of ``gpu.gpus_per_node`` ranks, the network between nodes."""
    g = max(1, int(gpu.gpus_per_node))
    if src // g == dst // g:
        bw, which = intra_link(gpu)
        return bw, INTRA_NODE_STEP_NS, which
    return network_bw(gpu, max(src, dst) + 1), INTER_NODE_STEP_NS, "network"


def p2p_ns(nbytes: int, src: int, dst: int, gpu) -> float:
    """Modeled transfer time (ns) of `nbytes` from rank `src` to `dst`: ``latency + bytes / (0.8 x bw)``;
    0 on the same rank."""
    if src == dst:
        return 0.0
    bw, lat, _ = p2p_link(gpu, src, dst)
    return lat + nbytes / (EFFICIENCY * bw) * 1e9


def without_p2p_time(trace):
    """A view of `trace` whose ``c10d::send`` / ``c10d::recv_`` ops take no time (their transfer is modeled
    as a link transfer instead); ops, accesses and metadata otherwise the trace's own."""
    ops = trace.ops.copy()
    p2p = ops["name"].isin(P2P_OPS).to_numpy()
    ops.loc[p2p, "end_ns"] = ops.loc[p2p, "start_ns"]
    return types.SimpleNamespace(ops=ops, accesses=trace.accesses, metadata=trace.metadata)


def rank_plan(rank: int, own: dict, record: dict) -> dict:
    """One rank's part of the pipeline schedule from its own step time `own` (`steptime.step_time` of
    `without_p2p_time`) and its `pipeline.timeline_record`: ``prelude_ns``, ``actions`` (``kind``,
    ``stage``, ``mb``, ``start_op``, ``end_op``, ``dur_ns``, ``gap_ns``, ``recv`` = [[peer, bytes]]; the
    last action's gap is the epilogue), ``own_step_ns``, ``busy_ns``. ns on the modeled clock."""
    sched = own["schedule"]
    comp = sched[sched["stream"] == "compute"].sort_values("op_id")
    ids = comp["op_id"].to_numpy(np.int64)
    ends = np.maximum.accumulate(comp["end_ns"].to_numpy(np.int64)) if len(comp) else np.zeros(0, np.int64)

    def done_by(pos: int) -> int:     # E(pos): the compute stream's time once every op with id < pos ran
        k = int(np.searchsorted(ids, pos, side="left"))
        return int(ends[k - 1]) if k else 0

    # a step run twice (or more) repeats every (stage, kind, microbatch): the n-th receive of one belongs to its
    # n-th action, `it` = n
    recvs, seen = {}, {}
    for r in record.get("recvs", []):
        key = (r["stage"], _class(r["kind"]), r["mb"])
        n = seen[key] = seen.get(key, -1) + 1
        recvs[key + (n,)] = [[int(p), int(b)] for p, b in r["peers"]]
    acts = sorted(record.get("actions", []), key=lambda a: a["start"])
    out, seen = [], {}
    for k, a in enumerate(acts):
        nxt = done_by(acts[k + 1]["start"]) if k + 1 < len(acts) else own["step_ns"]
        key = (a["stage"], _class(a["kind"]), a["mb"])
        n = seen[key] = seen.get(key, -1) + 1
        out.append({"kind": a["kind"], "stage": a["stage"], "mb": a["mb"], "it": n, "start_op": a["start"],
                    "end_op": a["end"], "dur_ns": done_by(a["end"]) - done_by(a["start"]),
                    "gap_ns": nxt - done_by(a["end"]), "recv": recvs.get(key + (n,), []) if a["kind"] != "W" else []})
    return {"rank": rank, "prelude_ns": done_by(acts[0]["start"]) if acts else own["step_ns"], "actions": out,
            "own_step_ns": int(own["step_ns"]), "busy_ns": int(own["compute_ns"])}


def _class(kind: str) -> str:
    """F, "grad" (B or I: the actions that send an input gradient back) or W."""
    return "F" if kind == "F" else "W" if kind == "W" else "grad"


def _key(rank: int, a: dict) -> tuple:
    return (rank, a["stage"], _class(a["kind"]), a["mb"], a.get("it", 0))


def _sender(peer: int, a: dict) -> tuple:
    """The key of the action on rank `peer` that sent what action `a` receives (stage -/+ 1, same microbatch
    and repetition)."""
    if a["kind"] == "F":
        return (peer, a["stage"] - 1, "F", a["mb"], a.get("it", 0))
    return (peer, a["stage"] + 1, "grad", a["mb"], a.get("it", 0))


def simulate(plans: dict, transfer) -> dict:
    """Join the ranks' `rank_plan` s on one clock (module docstring). `transfer(nbytes, src, dst)`: a
    message's transfer ns. Returns ``{"pipeline_step_ns", "ranks": {rank: {"step_ns", "busy_ns", "wait_ns",
    "bubble_ns", "p2p_ns", "p2p_bytes", "own_step_ns", "actions": [{"kind", "stage", "mb", "it", "start_ns",
    "end_ns", "wait_ns", "start_op", "end_op"}]}}}``; ns (ints, rounded) on the modeled clock. ``it``: the
    repetition of that (stage, kind, microbatch) on the rank (a second ``schedule.step()``: 1), whose receive
    comes from the sender's same repetition."""
    keyof = {_key(r, a): a for r, plan in plans.items() for a in plan["actions"]}
    outgoing: dict = {}          # sender key -> [(receiver rank, receiver key, bytes)]
    for r, plan in plans.items():
        for a in plan["actions"]:
            rkey = _key(r, a)
            for peer, nbytes in a["recv"]:
                skey = _sender(int(peer), a)
                if skey not in keyof:
                    raise PipelineTimingError(
                        f"pipeline step time: rank {r} stage {a['stage']} {a['kind']} of microbatch {a['mb']} "
                        f"receives from rank {peer}, which has no recorded {skey[2]} of stage {skey[1]} for that "
                        "microbatch (was that rank predicted?)")
                outgoing.setdefault(skey, []).append((r, rkey, nbytes))
    arrival: dict = {}           # (sender key, receiver key) -> ns
    link_free: dict = {}
    pos = {r: 0 for r in plans}
    clock = {r: float(p["prelude_ns"]) for r, p in plans.items()}
    waited = {r: 0.0 for r in plans}
    p2p = {r: [0.0, 0] for r in plans}
    timed = {r: [] for r in plans}
    while any(pos[r] < len(p["actions"]) for r, p in plans.items()):
        progressed = False
        for r, plan in plans.items():
            while pos[r] < len(plan["actions"]):
                a = plan["actions"][pos[r]]
                rkey = _key(r, a)
                needs = [(_sender(int(peer), a), rkey) for peer, _ in a["recv"]]
                if any(n not in arrival for n in needs):
                    break
                start = max([clock[r]] + [arrival[n] for n in needs])
                wait = start - clock[r]
                waited[r] += wait
                end = start + a["dur_ns"]
                timed[r].append({"kind": a["kind"], "stage": a["stage"], "mb": a["mb"], "it": a.get("it", 0),
                                 "start_ns": start, "end_ns": end, "wait_ns": wait, "start_op": a["start_op"],
                                 "end_op": a["end_op"]})
                if a["kind"] != "W":
                    for dst, dkey, nbytes in outgoing.get(rkey, []):
                        go = max(end, link_free.get((r, dst), 0.0))
                        t = float(transfer(nbytes, r, dst))
                        link_free[(r, dst)] = go + t
                        arrival[(rkey, dkey)] = max(arrival.get((rkey, dkey), 0.0), go + t)
                        p2p[dst][0] += t
                        p2p[dst][1] += int(nbytes)
                clock[r] = end + a["gap_ns"]
                pos[r] += 1
                progressed = True
        if not progressed:
            stuck = {r: plans[r]["actions"][pos[r]] for r in plans if pos[r] < len(plans[r]["actions"])}
            raise PipelineTimingError("pipeline step time: the recorded actions wait on each other in a cycle: "
                                      + "; ".join(f"rank {r} at {a['kind']} stage {a['stage']} mb {a['mb']}"
                                                  for r, a in stuck.items()))
    ends = {r: (clock[r] if plans[r]["actions"] else float(plans[r]["own_step_ns"])) for r in plans}
    step = max(ends.values(), default=0.0)
    rnd = lambda x: int(round(x))         # noqa: E731
    ranks = {}
    for r, plan in plans.items():
        ranks[r] = {"step_ns": rnd(ends[r]), "busy_ns": plan["busy_ns"], "wait_ns": rnd(waited[r]),
                    "bubble_ns": rnd(step) - plan["busy_ns"], "p2p_ns": rnd(p2p[r][0]), "p2p_bytes": p2p[r][1],
                    "own_step_ns": plan["own_step_ns"],
                    "actions": [{**a, "start_ns": rnd(a["start_ns"]), "end_ns": rnd(a["end_ns"]),
                                 "wait_ns": rnd(a["wait_ns"])} for a in timed[r]]}
    return {"pipeline_step_ns": rnd(step), "ranks": ranks}


def shift_schedule(sched, actions: list):
    """The rank's own schedule with every op delayed by the waits of the actions starting at or before it
    (the op's id >= the action's first op id), as the pipeline clock places them; a new DataFrame."""
    out = sched.copy()
    starts = np.array([a["start_op"] for a in actions], dtype=np.int64)
    waits = np.cumsum([a["wait_ns"] for a in actions]).astype(np.int64)
    k = np.searchsorted(starts, out["op_id"].to_numpy(np.int64), side="right")
    shift = np.where(k > 0, waits[np.maximum(k - 1, 0)] if len(waits) else 0, 0)
    out["start_ns"] = out["start_ns"].to_numpy(np.int64) + shift
    out["end_ns"] = out["end_ns"].to_numpy(np.int64) + shift
    wait = out["wait_ns"].to_numpy(np.int64).copy()
    comp = np.flatnonzero((out["stream"] == "compute").to_numpy())
    comp = comp[np.argsort(out["op_id"].to_numpy(np.int64)[comp], kind="stable")]
    comp_ids = out["op_id"].to_numpy(np.int64)[comp]
    for a in actions:                 # an action's wait shows on its first compute op
        j = int(np.searchsorted(comp_ids, a["start_op"], side="left"))
        if j < len(comp):
            wait[comp[j]] += int(a["wait_ns"])
    out["wait_ns"] = wait
    return out


def pipeline_step_time(traces: dict, world_size: int, gpu) -> dict:
    """Per rank (rank -> dict, ns on the modeled GPU clock) the step time of a pipeline prediction:
    `steptime.step_time` of the rank with p2p ops taking no compute time, ``step_ns`` its end on the joined
    pipeline clock, ``pipeline_step_ns`` (the whole step: max over ranks), ``busy_ns``, ``wait_ns``,
    ``bubble_ns``, ``p2p_ns``, ``p2p_bytes``, ``own_step_ns`` (the rank alone, no waits),
    ``pipeline_actions`` (each action's start/end/wait) and the ``schedule`` shifted by the waits.
    ``exposed_comm_ns`` stays the rank's own (collectives only), so ``step_ns = compute_ns +
    exposed_comm_ns + wait_ns``. `traces`: every rank's predicted trace (rank -> Trace)."""
    from memlens.devicetime.gpus import gpu as resolve_gpu
    from memlens.prediction.distributed.steptime import _NO_COLLECTIVES, step_time
    g = resolve_gpu(gpu)
    own, plans = {}, {}
    for r, tr in traces.items():
        own[r] = step_time(without_p2p_time(tr), world_size, g)
        record = ((tr.metadata or {}).get("prediction") or {}).get("pipeline") or {}
        plans[r] = rank_plan(r, own[r], record)
    # whole ns per transfer: every time on the joined clock stays an integer, so step = own step + waits exactly
    sim = simulate(plans, lambda nbytes, src, dst: round(p2p_ns(nbytes, src, dst, g)))
    out = {}
    for r, t in own.items():
        p = sim["ranks"][r]
        out[r] = {**t, "step_ns": p["step_ns"], "pipeline_step_ns": sim["pipeline_step_ns"],
                  "busy_ns": p["busy_ns"], "wait_ns": p["wait_ns"], "bubble_ns": p["bubble_ns"],
                  "p2p_ns": p["p2p_ns"], "p2p_bytes": p["p2p_bytes"], "own_step_ns": p["own_step_ns"],
                  "pipeline_actions": p["actions"], "schedule": shift_schedule(t["schedule"], p["actions"]),
                  "note": _NOTE if t["note"] == _NO_COLLECTIVES else "; ".join(filter(None, [t["note"], _NOTE]))}
    return out


_NOTE = ("pipeline: stages joined on one modeled clock (waits for activations/gradients, link transfers; "
         "memlens.prediction.distributed.pipeline_time)")
