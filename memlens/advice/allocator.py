"""Allocator settings as a plan's change: the predicted trace replayed through the caching-allocator model
under each candidate ``PYTORCH_CUDA_ALLOC_CONF``. Settings change where blocks go, not which blocks exist or
when, so the replay of the same predicted trace is the prediction under that setting (`memlens.predict`
itself replays its trace the same way)."""
from __future__ import annotations

from dataclasses import replace

from memlens.advice.plan import Plan
from memlens.advice.timelines import plan_trace

# each setting alone: the ones that change reserved bytes on a training step's requests
CANDIDATE_CONFS = ("expandable_segments:True", "max_split_size_mb:256", "garbage_collection_threshold:0.8",
                   "roundup_power2_divisions:4")


def replay(trace, conf: str | None, capacity: int | None, device: str = "cuda:0", overhead: int = 0,
           initial_state: str = "empty"):
    """(peak allocated, peak reserved, device bytes needed, fits) of `device`'s requests in `trace` replayed
    under `conf` (None: the trace's recorded settings); bytes. `overhead`: device bytes outside the caching
    allocator (CUDA context, NCCL buffers), counted against `capacity` and in the bytes needed; `capacity`
    None: never limited."""
    from memlens.simulate import simulate
    if not (trace.blocks["device"] == device).any():
        return 0, 0, overhead, True
    unlimited = simulate(trace, conf=conf, capacity="unlimited", device=device,
                         initial_state=initial_state).devices[device]
    fits = True
    if capacity is not None:
        limited = simulate(trace, conf=conf, capacity=max(capacity - overhead, 1), device=device,
                           initial_state=initial_state).devices[device]
        fits = not limited.ooms
    return unlimited.peak_allocated, unlimited.peak_reserved, unlimited.peak_reserved + overhead, fits


def _replay(prediction, conf: str, capacity: int | None):
    """`replay` of one `Prediction`'s trace, its CUDA context and NCCL buffers counted as `fits` counts them
    (`capacity` None: the GPU's memory)."""
    gpu = prediction.gpu
    cap = capacity if capacity is not None else gpu.total_memory
    return replay(prediction.trace, conf, cap, overhead=gpu.cuda_context + prediction.nccl_bytes)


def with_conf(plan: Plan, prediction, conf: str, capacity: int | None) -> Plan:
    """`plan` under the allocator settings `conf`, its peaks replayed from `prediction` (the plan's own
    prediction: a `Prediction`, or a `DistributedPrediction` whose ranks are each replayed)."""
    preds = list(prediction.predictions.values()) if hasattr(prediction, "predictions") else [prediction]
    rows = [_replay(p, conf, capacity) for p in preds if p.trace is not None]
    # settings move blocks, not requests: the plan's own trace is this plan's timeline too
    return replace(plan, conf=conf, trace=plan_trace(prediction), peak_allocated=max(r[0] for r in rows), peak_reserved=max(r[1] for r in rows),
                   device_bytes_needed=max(r[2] for r in rows), fits=all(r[3] for r in rows), verified=True,
                   freed=list(plan.freed) + [f"allocator settings {conf} (replayed)"])


def best_conf(plan: Plan, prediction, capacity: int | None, confs=CANDIDATE_CONFS) -> Plan | None:
    """The setting of `confs` that needs the least device memory for `plan`, as a new plan; None when no
    setting needs less than the plan as it is."""
    best = None
    for conf in confs:
        candidate = with_conf(plan, prediction, conf, capacity)
        if candidate.device_bytes_needed < (best or plan).device_bytes_needed:
            best = candidate
    return best
