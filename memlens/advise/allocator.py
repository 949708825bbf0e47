"""Allocator settings as a plan's change: the predicted trace replayed through the caching-allocator model
under each candidate ``PYTORCH_CUDA_ALLOC_CONF``. Settings change where blocks go, not which blocks exist or
when, so the replay of the same predicted trace is the prediction under that setting (`memlens.predict`
itself replays its trace the same way)."""
from __future__ import annotations

from dataclasses import replace

from memlens.advise.plan import Plan

# each setting alone: the ones that change reserved bytes on a training step's requests
CANDIDATE_CONFS = ("expandable_segments:True", "max_split_size_mb:256", "garbage_collection_threshold:0.8",
                   "roundup_power2_divisions:4")


def _replay(prediction, conf: str, capacity: int | None):
    """(peak allocated, peak reserved, device bytes needed, fits) of one `Prediction`'s trace under `conf`
    (bytes; `capacity` in bytes of device memory, the CUDA context and NCCL buffers counted as `fits` does)."""
    from memlens.simulate import simulate
    gpu = prediction.gpu
    cap = capacity if capacity is not None else gpu.total_memory
    usable = max(cap - gpu.cuda_context - prediction.nccl_bytes, 1)
    trace = prediction.trace
    if not (trace.blocks["device"] == "cuda:0").any():
        return 0, 0, gpu.cuda_context + prediction.nccl_bytes, True
    sim = simulate(trace, conf=conf, capacity=usable, device="cuda:0", initial_state="empty").devices["cuda:0"]
    unlimited = simulate(trace, conf=conf, capacity="unlimited", device="cuda:0",
                         initial_state="empty").devices["cuda:0"]
    needed = unlimited.peak_reserved + gpu.cuda_context + prediction.nccl_bytes
    return unlimited.peak_allocated, unlimited.peak_reserved, needed, not sim.ooms


def with_conf(plan: Plan, prediction, conf: str, capacity: int | None) -> Plan:
    """`plan` under the allocator settings `conf`, its peaks replayed from `prediction` (the plan's own
    prediction: a `Prediction`, or a `DistributedPrediction` whose ranks are each replayed)."""
    preds = list(prediction.predictions.values()) if hasattr(prediction, "predictions") else [prediction]
    rows = [_replay(p, conf, capacity) for p in preds if p.trace is not None]
    return replace(plan, conf=conf, peak_allocated=max(r[0] for r in rows), peak_reserved=max(r[1] for r in rows),
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
