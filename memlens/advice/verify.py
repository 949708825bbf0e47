"""Verify a plan: run the user's step again under `memlens.predict` with the plan applied, and fill in the
plan's peaks, fit and modeled step time from that prediction (never from an estimate made apart)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from memlens.advice.plan import Plan
from memlens.advice.result import keep_frontier_traces
from memlens.advice.timelines import plan_trace


@dataclass
class Workload:
    """What the advisor predicts: `build_model()` returns a fresh ``nn.Module``; `step(model, optimizer)` runs
    one training step (``step(model, optimizer, batch)`` when `batch` is given); `optimizer` is the optimizer
    class made with `optimizer_kwargs`; `layers(model)` returns the candidate blocks (default: the children of
    the model's largest ``nn.ModuleList``). `options` go to `memlens.predict`. `verified`: the plans verified
    so far, the first the baseline (`verify` keeps traces only for it and the frontier among them)."""

    build_model: Callable
    step: Callable
    gpu: object = "H100"
    capacity: int | None = None
    world_size: int | None = None
    optimizer: object = None
    optimizer_kwargs: dict = field(default_factory=dict)
    layers: Callable | None = None
    batch: int | None = None
    options: dict = field(default_factory=dict)
    verified: list = field(default_factory=list)


def run_plan(work: Workload, plan: Plan, prepare=None, installed: list | None = None):
    """Predict `work` with `plan` applied; returns the `Prediction` (or `DistributedPrediction` with a world
    size). On one GPU the step runs as `memlens.predict` runs a step function: once, and again on the same
    model and optimizer when the first step left state alive (its peaks are the steady state's; the
    ``steps`` option of `work.options` chooses the number of steps). With `plan.micro_batch`, each step
    runs `plan.accumulate` micro-steps on that batch, the optimizer's ``step`` and ``zero_grad`` skipped in
    all but the last (gradient accumulation: the gradients of the earlier micro-batches are held while the
    later ones run). The plan's offloaded tensors are installed with `memlens.advice.offload.install`;
    `prepare(model)`, when given, runs on each model built, after the plan is applied; `installed`, when
    given, receives each model's `OffloadHooks` (their counters say what the step offloaded)."""
    import torch

    from memlens.advice.checkpoint import wrap
    from memlens.advice.offload import install
    from memlens.advice.plan import autocast_forward
    from memlens.prediction.api import predict
    from memlens.prediction.distributed.strategies import apply_strategy
    opt_class = work.optimizer or torch.optim.AdamW
    keep: list = []

    def build():
        model = wrap(work.build_model(), plan.checkpoint)
        if plan.offload:
            hooks = install(model, plan.offload)
            if installed is not None:
                installed.append(hooks)
        if prepare is not None:
            prepare(model)
        model = model.cuda()
        if plan.autocast:
            autocast_forward(model, plan.autocast)
        kwargs = {**work.optimizer_kwargs, **plan.optimizer_kwargs}
        if plan.strategy:
            return apply_strategy(plan.strategy, model, opt_class, kwargs, work.layers)
        return model, opt_class(model.parameters(), **kwargs)

    def run():
        # one GPU: the model and optimizer are built at the first call only, so that memlens.predict's second
        # call (the steady state) is a second training step on them, as in a training loop; each rank of a
        # world size builds its own
        module, opt = keep[0] if keep and work.world_size is None else build()
        if plan.micro_batch is None:
            work.step(module, opt, *(() if work.batch is None else (work.batch,)))
        else:
            accumulate(work.step, module, opt, plan.micro_batch, plan.accumulate)
        if not keep or work.world_size is not None:
            keep.append((module, opt))   # a rank holds its state after the step

    world = {} if work.world_size is None else {"world_size": int(work.world_size)}
    try:
        return predict(run, gpu=work.gpu, capacity=work.capacity, conf=plan.conf, **world, **work.options)
    finally:
        keep.clear()


def accumulate(step, model, opt, micro_batch: int, times: int) -> None:
    """Run ``step(model, opt, micro_batch)`` `times` times as gradient accumulation: the optimizer's ``step``
    and ``zero_grad`` do nothing in all but the last."""
    def skip(*args, **kwargs):
        return None
    for i in range(times):
        last = i == times - 1
        if not last:
            opt.step, opt.zero_grad = skip, skip     # instance attributes shadow the class's methods
        try:
            step(model, opt, micro_batch)
        finally:
            if not last:
                del opt.step, opt.zero_grad


def last_step_start(prediction) -> int:
    """Op id at which the last call of the step function began (0 for a single call or a ``with`` block):
    the steady-state step is the ops from there on."""
    starts = getattr(prediction, "_step_starts", None) or [0]
    return int(starts[-1])


def step_ns(prediction, world_size: int, gpu) -> int | None:
    """Modeled step time of one rank's prediction, ns: the end of its step schedule (collectives on their
    own streams, `memlens.prediction.distributed.steptime`) minus the start of the last step's first forward op
    (building the model and the optimizer, and the earlier steps of a steady-state prediction, are not part
    of the step; making the step's inputs is left out too, the same in every plan)."""
    from memlens.devicetime.gpus import gpu as resolve_gpu
    from memlens.prediction.distributed.steptime import step_time
    trace = prediction.trace
    if trace is None or trace.metadata.get("clock", {}).get("kind") != "modeled":
        return None
    name = getattr(prediction, "gpu_name", None) or prediction.gpu.name
    timing = step_time(trace, world_size, resolve_gpu(name))
    sched = timing["schedule"]
    start = 0
    if "phase" in trace.ops.columns:
        ops = trace.ops
        forward = ops.loc[(ops["phase"] == "forward") & (ops["op_id"] >= last_step_start(prediction)), "op_id"]
        if len(forward) and "op_id" in sched.columns:
            first = sched.loc[sched["op_id"] == int(forward.min()), "start_ns"]
            start = int(first.iloc[0]) if len(first) else 0
    return int(timing["step_ns"] - start)


def verify(work: Workload, plan: Plan, baseline_step_ns: int | None = None):
    """Run `plan` (`run_plan`) and fill in its results in place; returns the prediction (None when the
    step failed under the plan: then `plan.error` says why and `plan.fits` is False). The plan keeps its
    prediction's trace while it is the baseline or on the frontier of `work.verified`
    (`memlens.advice.timelines`)."""
    installed: list = []
    try:
        p = run_plan(work, plan, installed=installed)
    except Exception as exc:  # a plan the step cannot run with is reported on the plan, not raised
        plan.error, plan.fits, plan.verified = f"{type(exc).__name__}: {exc}", False, True
        return None
    plan.verified = True
    _note_unmatched(plan, installed)
    if work.world_size is None:
        plan.peak_allocated, plan.peak_reserved = p.peak_allocated, p.peak_reserved
        plan.device_bytes_needed, plan.fits = p.device_bytes_needed, bool(p.fits())
        plan.step_ns = step_ns(p, 1, work.gpu)
    else:
        if p.errors:
            plan.error = "; ".join(f"rank {r}: {e}" for r, e in sorted(p.errors.items()))
            plan.fits = False
            return None
        plan.peak_allocated, plan.peak_reserved = p.peak_allocated, p.peak_reserved
        plan.device_bytes_needed, plan.fits = p.device_bytes_needed, bool(p.fits())
        times = [step_ns(q, p.world_size, work.gpu) for q in p.predictions.values() if q.trace is not None]
        times = [t for t in times if t is not None]
        plan.step_ns = max(times) if times else None
    plan.baseline_step_ns = baseline_step_ns if baseline_step_ns is not None else plan.step_ns
    plan.trace = plan_trace(p)
    work.verified.append(plan)
    keep_frontier_traces(work.verified, work.verified[0])
    return p


def _note_unmatched(plan: Plan, installed: list) -> None:
    """Say on `plan` (in `freed`) when planned offload tensors matched no save of the predicted step: they
    stayed on the device, and the verified peak includes them."""
    missed = {(t.module, t.index) for h in installed for t in h.unmatched()}
    if not installed or not missed:
        return
    plan.freed.append(f"offload: {len(missed)} of the {len(plan.offload)} planned saved tensors matched no save "
                      "of the predicted step (module, order of save, shape, dtype): they stayed on the device, "
                      "in the verified peak")
