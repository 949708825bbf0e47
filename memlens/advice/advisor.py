"""`memlens.advise`: which changes make a training step fit, each verified by predicting the step with it.

The search, per sharding base (one GPU; with a world size each strategy of `memlens.predict_strategies`):
1. Predict the base as it is (the baseline: no change on one GPU, DDP on N ranks).
2. Activation checkpointing or offload: estimate per candidate block (the children of the model's largest
   ``nn.ModuleList``, or `layers(model)`) the activation bytes each mode takes off the peak and the time it
   adds, from the base's predicted trace: forward ops run again (`checkpoint.module_costs`); the planned
   saved tensors moved to the host and prefetched back over the GPU table's host link, and the stall of
   the copies back (`offload_plan`, from one more prediction naming every saved tensor; one GPU only);
   choose the cheapest set freeing what the capacity asks (`solver.choose`);
   predict the step with exactly that set applied. When the verified plan still misses, ask for the shortfall
   more and solve again (at most `rounds` times). Every block checkpointed in full (the usual manual answer)
   is predicted too, as a reference plan.
3. Batch (with `batch`): the largest micro-batch that fits, as gradient accumulation keeping the global
   batch, each predicted.
4. Precision and optimizer: autocast bf16, and the optimizer with ``foreach=False``, on the base and on its
   closest plan to fitting, each predicted (an autocast variant's offload planned again on the autocast step).
5. Allocator settings: the closest plan to fitting of each base replayed under each candidate
   ``PYTORCH_CUDA_ALLOC_CONF``.
Every plan in the answer carries the peaks and modeled step time of its own prediction.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from memlens.advice.plan import Plan
from memlens.advice.result import OBJECTIVES, Advice
from memlens.advice.verify import Workload, verify
from memlens.errors import InputError

# the three ZeRO stages, most sharded first: FSDP2 (stage 3), true ZeRO-2, ZeRO-1 (DDP is the baseline).
# "fsdp2+ac" is left out because the checkpoint search on "fsdp2" chooses the blocks itself; "fsdp2+noreshard"
# (held memory between steps as FSDP2's, more from forward to backward) is searched when `strategies` names it
SHARDING = ("fsdp2", "zero2", "zero1")


class AdviceFailed(RuntimeError):
    """The step itself fails under prediction, so there is nothing to advise; the message says why."""


def advise_step(build_model: Callable, step: Callable | None = None, gpu="H100", capacity="40GiB",
           world_size: int | None = None, objective: str = "fit", *, optimizer=None,
           optimizer_kwargs: dict | None = None, layers: Callable | None = None, batch: int | None = None,
           strategies=SHARDING, rounds: int = 4, allocator: bool = True, precision: bool = True,
           max_accumulate: int = 8, **options) -> Advice:
    """Advise changes that make `step` fit `capacity` on `gpu` (bytes or "40GiB" of device memory per GPU).

    `build_model()` returns a fresh ``nn.Module`` (`memlens.advise` also takes a script path or a recorded
    trace in its place, see `memlens.advice.entry`); `step(model, optimizer)` runs one training step
    (``step(model, optimizer, batch)`` with `batch` given); `optimizer` (class, default AdamW) and
    `optimizer_kwargs` build the optimizer; `layers(model)` returns the blocks that may be checkpointed
    (default: the children of the largest ``nn.ModuleList``). With `world_size` every strategy of
    `strategies` is searched too (DDP is the baseline; default `SHARDING`: FSDP2, ZeRO-2, ZeRO-1; any row
    of `memlens.predict_strategies` may be named, ``"fsdp2+noreshard"`` included). `precision`: also try
    autocast bf16 and an optimizer without foreach temporaries; `allocator`: also replay allocator
    settings. With `batch`: the largest micro-batch dividing it that fits, with gradient accumulation
    keeping the global batch (at most `max_accumulate` micro-steps). `objective`: ``"fit"`` (fitting
    plans, fewest changes first), ``"fastest_fit"`` (fitting plans, fastest modeled step first) or
    ``"pareto"`` (only plans on the memory/time frontier). `options` go to each `memlens.predict`
    (``steps``: on one GPU each plan's model and optimizer are built once and the step runs as
    `memlens.predict` runs a step function, by default again while the first step left state alive, so
    the peaks are the steady state's). Raises `AdviceFailed` when the step fails as it is; a plan the step
    fails with is kept with its error and does not fit.
    """
    from memlens.prediction.predictor import _capacity_bytes
    if objective not in OBJECTIVES:
        raise InputError(f"objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")
    cap = _capacity_bytes(capacity)
    if world_size is not None and (not isinstance(world_size, int) or world_size < 1):
        raise InputError(f"world_size must be a positive integer, not {world_size!r}")
    from memlens.prediction.distributed.strategies import STRATEGIES
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise InputError(f"unknown strategies {unknown}: choose from {', '.join(STRATEGIES)}")
    work = Workload(build_model, step, gpu, cap, world_size, optimizer, dict(optimizer_kwargs or {}), layers,
                    batch, options)
    bases = [None] if world_size is None else ["ddp", *[s for s in strategies if s != "ddp"]]
    baseline = Plan(strategy=bases[0])
    base_pred = verify(work, baseline)
    if baseline.error is not None:
        raise AdviceFailed(f"no advice: the step fails as it is ({baseline.error})")
    found = _candidates(work)
    plans, notes = [baseline], list(found["notes"])
    if getattr(base_pred, "steps_note", None):     # which step's peaks every plan gives (one GPU)
        notes.append(f"each plan predicted as memlens.predict predicts a step; as it is, {base_pred.steps_note}")
    closest: dict = {}       # strategy -> (plan, prediction) closest to fitting, for the allocator replay
    _keep(closest, baseline, base_pred)
    for base in bases:
        if base == bases[0]:
            plan, pred = baseline, base_pred
        else:
            plan = Plan(strategy=base)
            pred = verify(work, plan, baseline.step_ns)
            plans.append(plan)
            _keep(closest, plan, pred)
        if plan.error is not None or pred is None:
            continue
        if not plan.fits and found["candidates"]:
            plans += _checkpoint_search(work, plan, pred, found, baseline.step_ns, rounds, notes, closest)
        if batch is not None and not plan.fits:
            plans += _batch_plans(work, plan, closest, baseline.step_ns, max_accumulate)
        if precision and not plan.fits:
            plans += _precision_plans(work, plan, closest, baseline.step_ns)
    if allocator:
        plans += _allocator_plans(work, closest, notes)
    return Advice(plans, baseline, cap, objective, notes)


def _candidates(work: Workload) -> dict:
    """The model's candidate blocks (``named_modules`` names), from one build inside a prediction (the
    model may be too large to build for real)."""
    from memlens.prediction.api import predict
    from memlens.prediction.distributed.strategies import repeated_blocks
    out = {"candidates": [], "notes": []}

    def look():
        model = work.build_model()
        names = {id(m): n for n, m in model.named_modules()}
        blocks = list(work.layers(model)) if work.layers is not None else repeated_blocks(model)
        out["candidates"] = [names[id(b)] for b in blocks if id(b) in names]
        missing = [type(b).__name__ for b in blocks if id(b) not in names]
        if missing:
            out["notes"].append(f"layers(model) returned modules not inside the model ({', '.join(missing)}): "
                                "they cannot be checkpointed")
    predict(look, gpu=work.gpu)
    if not out["candidates"]:
        out["notes"].append("no blocks to checkpoint: the model has no nn.ModuleList; pass layers=fn(model) "
                            "returning the modules that may be checkpointed")
    return out


def _keep(closest: dict, plan: Plan, pred) -> None:
    """Remember `plan` and its prediction when it is the closest to fitting of its strategy so far."""
    if pred is None or plan.error is not None or plan.device_bytes_needed is None:
        return
    held = closest.get(plan.strategy)
    if held is None or plan.device_bytes_needed < held[0].device_bytes_needed:
        closest[plan.strategy] = (plan, pred)


def _checkpoint_search(work, base: Plan, base_pred, found, baseline_step_ns, rounds: int, notes,
                       closest: dict) -> list:
    """Checkpoint plans on top of `base` (see the module docstring, step 2)."""
    from memlens.advice.checkpoint import MODES, module_costs
    from memlens.advice.solver import choose
    first = base_pred.predictions[min(base_pred.predictions)] if hasattr(base_pred, "predictions") else base_pred
    from memlens.advice.verify import last_step_start
    costs = module_costs(first.trace, found["candidates"], from_op=last_step_start(first))
    offload = _offload_plan(work, base, found["candidates"], notes)
    costs = [replace(c, offload_bytes=offload.by_module[c.name][0], offload_ns=offload.by_module[c.name][1])
             if c.name in offload.by_module else c for c in costs]
    options = [[(m, *c.option(m)) for m in MODES] for c in costs]
    cap = work.capacity if work.capacity is not None else first.gpu.total_memory
    need = base.device_bytes_needed - cap
    out, tried = [], set()
    for _ in range(max(rounds, 1)):
        choice, freed, cost = choose(options, need)
        picked = {costs[i].name: m for i, m in enumerate(choice) if m is not None}
        key = tuple(sorted(picked.items()))
        if not picked or key in tried:
            break
        tried.add(key)
        moved = tuple(t for t in offload.tensors if picked.get(t.module) == "offload")
        plan = Plan(checkpoint=picked, offload=moved, strategy=base.strategy, recompute_ns=cost,
                    freed=[f"{c.name} ({m}): {c.option(m)[0]:,} bytes of activations off the peak (estimated)"
                           for c, m in zip(costs, choice) if m is not None])
        _keep(closest, plan, verify(work, plan, baseline_step_ns))
        out.append(plan)
        if plan.fits or plan.error is not None:
            break
        need += plan.device_bytes_needed - cap       # the estimate fell short by this much: ask for it too
    every = {c.name: "full" for c in costs}
    if tuple(sorted(every.items())) not in tried:
        manual = Plan(checkpoint=every, strategy=base.strategy, recompute_ns=sum(c.full_ns for c in costs),
                      freed=["every block checkpointed in full (the usual manual answer, for comparison)"])
        _keep(closest, manual, verify(work, manual, baseline_step_ns))
        out.append(manual)
    if not any(p.fits for p in out):
        notes.append(f"{base.changes}: checkpointing alone does not reach the capacity")
    return out


def _offload_plan(work, base: Plan, candidates: list, notes: list):
    """The offload plan of `base`'s step (`memlens.advice.offload_plan`), on one GPU and where the GPU
    table gives the GPU a host link; an empty plan otherwise (its note added to `notes`)."""
    from memlens.advice.offload_plan import OffloadPlan, census_prediction, host_link, plan_offload
    from memlens.advice.verify import last_step_start
    link = host_link(work.gpu)
    if link is None or base.strategy is not None or base.micro_batch is not None:
        if link is None:
            notes.append("offload not searched: the GPU table has no host link for this GPU")
        return OffloadPlan()
    # the census runs the step as `base` runs it (its autocast: the saves' dtypes and sizes are autocast's)
    as_base = Plan(checkpoint={n: m for n, m in base.checkpoint.items() if m != "offload"}, autocast=base.autocast)
    try:
        pred, census = census_prediction(work, candidates, as_base)
    except Exception as exc:      # the census run failing leaves offload out, the rest of the search stands
        notes.append(f"offload not searched: the census of saved tensors failed ({type(exc).__name__}: {exc})")
        return OffloadPlan()
    found = plan_offload(pred.trace, census.last_call(), candidates, link, from_op=last_step_start(pred))
    notes.extend(found.notes)
    return found


def _batch_plans(work, base: Plan, closest: dict, baseline_step_ns, max_accumulate: int) -> list:
    """Micro-batches dividing `work.batch`, largest first, each predicted as gradient accumulation on `base`,
    until one fits."""
    out = []
    for k in range(2, max(int(max_accumulate), 1) + 1):
        if work.batch % k:
            continue
        plan = Plan(strategy=base.strategy, micro_batch=work.batch // k, accumulate=k)
        _keep(closest, plan, verify(work, plan, baseline_step_ns))
        out.append(plan)
        if plan.fits or plan.error is not None:
            break
    return out


def _precision_plans(work, base: Plan, closest: dict, baseline_step_ns) -> list:
    """Autocast bf16, and the optimizer without its foreach temporaries (when it takes ``foreach``), each
    on `base` and on the closest plan to fitting of its strategy, each predicted."""
    import inspect

    import torch
    variants = [{"autocast": "bfloat16"}]
    opt_class = work.optimizer or torch.optim.AdamW
    if "foreach" in inspect.signature(opt_class).parameters and work.optimizer_kwargs.get("foreach") is not False:
        variants.append({"optimizer_kwargs": {"foreach": False}})
    starts = [base]
    held = closest.get(base.strategy)
    if held is not None and held[0] is not base and not held[0].conf:
        starts.append(held[0])
    out = []
    for start in starts:
        for v in variants:
            plan = Plan(checkpoint=dict(start.checkpoint), offload=start.offload, strategy=start.strategy,
                        recompute_ns=start.recompute_ns, micro_batch=start.micro_batch,
                        accumulate=start.accumulate, freed=list(start.freed), **v)
            if plan.offload and plan.autocast:
                _replan_offload(work, plan)
            _keep(closest, plan, verify(work, plan, baseline_step_ns))
            out.append(plan)
    return out


def _replan_offload(work, plan: Plan) -> None:
    """Plan `plan`'s offload again for its autocast step (in place): a save's dtype and size, and so which
    tensors are worth moving, are autocast's, and tensors planned for the step without autocast would match
    no save. An offload module left without planned tensors is dropped, and `freed` says so."""
    owners = sorted({n for n, m in plan.checkpoint.items() if m == "offload"})
    why: list = []
    found = _offload_plan(work, plan, owners, why)
    stalls_before = sum(t.stall_ns for t in plan.offload)
    plan.offload = tuple(t for t in found.tensors if t.module in owners)
    kept = {t.module for t in plan.offload}
    plan.freed = [f for f in plan.freed if not any(f.startswith(f"{n} (offload)") for n in owners)]
    plan.freed += [f"{n} (offload, planned again under autocast {plan.autocast}): {found.by_module[n][0]:,} bytes "
                   "of activations off the peak (estimated)" for n in sorted(kept)]
    for n in owners:
        if n not in kept:
            del plan.checkpoint[n]
            plan.freed.append(f"{n}: offload dropped, no saved tensor of it is worth moving under autocast "
                              f"{plan.autocast} ({'; '.join(why) or 'the planner picked none'})")
    plan.recompute_ns += sum(t.stall_ns for t in plan.offload) - stalls_before


def _allocator_plans(work, closest: dict, notes) -> list:
    """The best allocator setting on top of the closest plan to fitting of each strategy (replayed on that
    plan's prediction), as new plans."""
    from memlens.advice.allocator import best_conf
    out = []
    for plan, pred in closest.values():
        better = best_conf(plan, pred, work.capacity)
        if better is not None:
            out.append(better)
    if not out:
        notes.append("no allocator setting needs less device memory than torch's defaults here")
    return out


def offload_only(build_model, step, gpu="H100", layers=None, **options):
    """The offload-only `memlens.advice.Plan` of a step on one GPU, verified: `build_model`, `step` and
    `layers` as `memlens.advise` takes them, `options` for `memlens.predict`. The plan's `offload` lists the
    planned tensors, its peaks and modeled step time come from a prediction with the plan applied
    (`baseline_step_ns` and `freed`: the step as it is, and the bytes each module's offload takes off its
    peak, estimated, with the planning's notes)."""
    work = Workload(build_model, step, gpu, layers=layers, options=options)
    base = Plan()
    verify(work, base)
    notes: list = []
    found = _offload_plan(work, base, _candidates(work)["candidates"], notes)
    freed = [f"{m} (offload): {b:,} bytes of activations off the peak of {base.peak_allocated:,} (estimated)"
             for m, (b, _) in sorted(found.by_module.items())]
    plan = Plan(checkpoint={m: "offload" for m in found.by_module}, offload=found.tensors, freed=freed + notes,
                recompute_ns=sum(ns for _, ns in found.by_module.values()))
    verify(work, plan, base.step_ns)
    return plan
