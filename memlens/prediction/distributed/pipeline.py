"""Pipeline parallelism (``torch.distributed.pipelining``) under prediction: torch's own schedules run.

The user's code builds its rank's ``PipelineStage`` and a schedule (``ScheduleGPipe``, ``Schedule1F1B``, or
another single-stage schedule) and calls ``schedule.step(...)``; under `environment.rank_world` that code runs
as it is, on fake ``cuda`` tensors and torch's fake process group. What runs and what allocates is torch's:
the schedule splits the batch into microbatches, runs each forward and backward in the schedule's order,
keeps each microbatch's stage output and saved activations until its backward (GPipe: every microbatch's
forward comes first; 1F1B: stage ``s`` of ``S`` holds at most ``S - s`` microbatches in flight), and
allocates its receive buffers up front (``PipelineStage`` makes one activation buffer per microbatch on every
stage but the first and one gradient buffer per microbatch on every stage but the last, kept for the
stage's life). Sends and receives go through the fake process group, which completes them at once and moves
no data: a receive buffer keeps the bytes it was allocated with, which is all the memory prediction needs.

Against the standard analysis (GPipe holds N microbatches' activations, 1F1B min(N, S - s) on stage s, so
GPipe - 1F1B = (N - (S - s)) microbatches), a predicted stage differs by blocks that analysis leaves out:
GPipe's peak comes in its second backward, after the first made the gradients and freed one microbatch, when
the gradients outweigh a microbatch (N - 1 in flight then, against 1F1B's S - s); 1F1B keeps the previous
backward's send (one input gradient) alive on every stage but the first, so the step from the first stage to
the second is one stage output smaller than a microbatch; the last stage keeps every microbatch's output under
both schedules (merged for ``step``'s return) and its loss-side blocks, so its step is smaller again. Stages
with more than the Linear stack (an embedding on the first, the head's logits on the last) add their own.

Two things cannot run as on GPUs, so `patch` (and `rng.patch`) changes them (only inside a predicted rank):

- the P2P warm-up vote (``_PipelineSchedule._warmup_p2p``): stages send a tensor around the ring and read it
  back with ``.item()`` to agree on static or dynamic shape inference; a fake tensor has no value. Here each
  stage decides alone: STATIC when its ``PipelineStage`` was given ``input_args`` and ``output_args`` (with
  plain tensors, shapes are all a stage needs). Dynamic inference exchanges shapes as pickled objects between
  ranks, which a rank predicted alone cannot receive, so a stage without them is refused with a clear error
  (`PIPELINE_NEEDS_SHAPES`). ``device="meta"`` example tensors cost nothing and are enough.
- ``torch.random.fork_rng`` around the schedule's shape inference reads ``torch.cuda.get_rng_state``, which a
  CPU build does not have: the predicted rank's generator stands for it (`rng.FakeCudaGenerator`).

Every stage is a different rank with different memory (the first holds the most in flight under 1F1B; the
first has no activation receive buffers, the last no gradient receive buffers and it computes the loss), so
when a ``PipelineStage`` is built the prediction runs every rank (`ranks.predict_ranks`), never marking one as
standing for another, and records each rank's stage indices (several with an interleaved schedule such as
``ScheduleInterleaved1F1B``: rank r runs stages r, r + world size, ...). The tracer front end
(``pipeline()`` + ``build_stage``) runs too, but ``torch.export`` under the prediction's FakeTensorMode makes
its own fake copies of the parameters (seen as allocated before the step), so such a prediction over-counts
(seen on a 2-stage MLP: its 4 weights and the example input counted twice; not fixed): build
``PipelineStage`` by hand for a faithful answer. Pipeline x data parallel meshes are predicted rank by rank
with no symmetry shortcut.

An async send's tensor stays alive until its work is waited, as ``ProcessGroupNCCL``'s stash keeps it
(`memlens.prediction.distributed.p2p`): GPipe waits on its backward sends only after the last backward, so a
stage after the first holds one more input gradient per finished backward.

For the step time (`pipeline_time`), `patch` also notes what each stage did and when, as op counts of the
recording (the next op's id): every ``forward_one_chunk`` ("F"), ``backward_one_chunk`` ("B", or "I" when
it computes input gradients only) and ``backward_weight_one_chunk`` ("W") with its stage, microbatch and the
op ids it spans; and every ``get_fwd_recv_ops`` / ``get_bwd_recv_ops`` with the peer global rank and bytes
of each receive (what the action waits for). `timeline_record` gives them per rank.
"""
from __future__ import annotations

import torch

PIPELINE_NEEDS_SHAPES = (
    "pipeline stage {stage}: memlens predicts pipeline ranks one at a time, so stages cannot exchange shapes "
    "at run time; give PipelineStage(..., input_args=..., output_args=...) example tensors with the "
    "microbatch's shapes and dtypes (device='meta' tensors cost no memory)")


class PipelineShapesNeeded(RuntimeError):
    """A ``PipelineStage`` would need dynamic shape inference, which a rank predicted alone cannot do."""


NO_INPUT_GRAD = ("pipeline stage {stage}: none of its input_args requires grad, so its backward sends no "
                 "gradient to stage {prev}, whose gradient receive would wait for ever in a real run; give "
                 "input_args that require grad as the previous stage's output does")


def _local_warmup(original, notes: list):
    """``_warmup_p2p`` without the vote: every ``PipelineStage`` infers statically from its own example
    args; other stage kinds keep torch's path (neighbour warm-up sends, completed by the fake group).
    A stage after the first whose example inputs need no gradient is noted (`NO_INPUT_GRAD`): a real run
    would hang, the fake group completes the unmatched receive."""
    def _warmup_p2p(self, stages, has_backward, p2p_done):
        from torch.distributed.pipelining._utils import InferenceMode
        from torch.distributed.pipelining.stage import PipelineStage
        if not all(isinstance(s, PipelineStage) for s in stages):
            return original(self, stages, has_backward, p2p_done)
        for stage in stages:
            if InferenceMode.needs_dynamic(stage._user_meta, has_backward):
                raise PipelineShapesNeeded(PIPELINE_NEEDS_SHAPES.format(stage=stage.stage_index))
            stage._inference_mode = InferenceMode.STATIC
            inputs = stage._user_meta.inputs or ()
            if has_backward and not stage.is_first and not any(m.requires_grad for m in inputs):
                notes.append(NO_INPUT_GRAD.format(stage=stage.stage_index, prev=stage.stage_index - 1))
    return _warmup_p2p


def _sighted_stage(init, seen: set, stages: list):
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.add("pp")
        stages.append(int(self.stage_index))
    return __init__


def _op_count(session) -> int:
    return int(session.n_ops) if session is not None else 0


def timeline_record(session) -> dict:
    """The pipeline actions and receives noted beside `session` (module docstring): ``{"actions": [{"kind",
    "stage", "mb", "start", "end"}], "recvs": [{"kind", "stage", "mb", "peers": [[global rank, bytes]]}]}``,
    op ids ``start <= id < end``; plain lists and ints (JSON-safe). Empty lists when no stage ran."""
    rec = getattr(session, "memlens_pipeline", None) or {"actions": [], "recvs": []}
    return {"actions": [dict(a) for a in rec["actions"]], "recvs": [dict(r) for r in rec["recvs"]]}


def _timed(method, kind_of, session, rec):
    """`method` (a stage's one-chunk compute) noting its kind, stage, microbatch and op-id span."""
    def run(self, chunk_id, *args, **kwargs):
        start = _op_count(session)
        try:
            return method(self, chunk_id, *args, **kwargs)
        finally:
            rec["actions"].append({"kind": kind_of(kwargs), "stage": int(self.stage_index), "mb": int(chunk_id),
                                   "start": start, "end": _op_count(session)})
    return run


def _noted_recvs(method, kind, rec):
    """`get_fwd_recv_ops` / `get_bwd_recv_ops` noting each receive's peer (global rank) and bytes."""
    def get(self, chunk_id, *args, **kwargs):
        ops = method(self, chunk_id, *args, **kwargs)
        peers = [[int(op.peer), int(op.tensor.numel() * op.tensor.element_size())] for op in ops
                 if getattr(op, "tensor", None) is not None and op.peer is not None]
        rec["recvs"].append({"kind": kind, "stage": int(self.stage_index), "mb": int(chunk_id), "peers": peers})
        return ops
    return get


def patch(patches, seen: set, stages: list, notes: list, session=None) -> None:
    """Make ``torch.distributed.pipelining`` run on one predicted rank (see the module docstring);
    `seen` gets ``"pp"``, `stages` the stage index of each ``PipelineStage`` the rank builds, `notes` what a
    real run would not survive; `session` (the recording session) gets the stages' timeline
    (`timeline_record`). `patches` restores everything."""
    try:
        from torch.distributed.pipelining import schedules
        from torch.distributed.pipelining.stage import _PipelineStageBase
    except ImportError:      # a torch without pipelining: nothing else to patch
        return
    base = schedules._PipelineSchedule
    warmup = base.__dict__.get("_warmup_p2p")
    if warmup is not None:   # torch 2.13's vote; older versions exchange shapes differently (not supported)
        patches.set(base, "_warmup_p2p", _local_warmup(warmup, notes))
    patches.set(_PipelineStageBase, "__init__", _sighted_stage(_PipelineStageBase.__dict__["__init__"], seen,
                                                               stages))
    rec = {"actions": [], "recvs": []}
    if session is not None:
        session.memlens_pipeline = rec
    base_stage = _PipelineStageBase.__dict__
    patches.set(_PipelineStageBase, "forward_one_chunk", _timed(base_stage["forward_one_chunk"],
                                                                lambda kw: "F", session, rec))
    patches.set(_PipelineStageBase, "backward_one_chunk", _timed(
        base_stage["backward_one_chunk"], lambda kw: "B" if kw.get("full_backward", True) else "I", session, rec))
    if "backward_weight_one_chunk" in base_stage:
        patches.set(_PipelineStageBase, "backward_weight_one_chunk", _timed(
            base_stage["backward_weight_one_chunk"], lambda kw: "W", session, rec))
    patches.set(_PipelineStageBase, "get_fwd_recv_ops", _noted_recvs(base_stage["get_fwd_recv_ops"], "F", rec))
    patches.set(_PipelineStageBase, "get_bwd_recv_ops", _noted_recvs(base_stage["get_bwd_recv_ops"], "B", rec))
