"""Advice for a recorded or imported trace: nothing can be re-run, so the only change that can be verified is
the allocator's; each candidate ``PYTORCH_CUDA_ALLOC_CONF`` is replayed through the caching-allocator model
(`memlens.simulate`) from an empty allocator, the blocks live before the recording requested first: a
recording's own start state is taken as given by the replay, never checked against a smaller capacity."""
from __future__ import annotations

from memlens.advice.allocator import CANDIDATE_CONFS, replay
from memlens.advice.plan import Plan
from memlens.advice.result import Advice
from memlens.errors import InputError

CAPACITY_NOTE = ("a recorded trace: the capacity is compared with what the caching allocator reserves (the "
                 "recording's CUDA context and other memory outside the allocator are not known); "
                 "only allocator settings can be verified without re-running the code")


def advise_trace(trace, capacity=None, objective: str = "fit", device: str | None = None) -> Advice:
    """`Advice` for `trace` (a `memlens.Trace` or a path any importer reads) on `device` (default: its first
    ``cuda`` device): the recording as it is under its recorded settings, and each candidate setting."""
    from memlens.io.detect import load
    from memlens.prediction.predictor import _capacity_bytes
    from memlens.trace import Trace
    if not isinstance(trace, Trace):
        trace = load(trace)
    devices = sorted(d for d in trace.blocks["device"].unique() if str(d).startswith("cuda"))
    if device is None:
        if not devices:
            raise InputError("the trace has no cuda blocks: nothing to advise on")
        device = devices[0]
    elif device not in devices:
        raise InputError(f"device {device!r} is not in the trace (cuda devices: {', '.join(devices) or 'none'})")
    cap = _capacity_bytes(capacity)

    def plan_for(conf):
        alloc, reserved, needed, fits = replay(trace, conf, cap, device=device)
        return Plan(conf=conf or "", peak_allocated=alloc, peak_reserved=reserved, device_bytes_needed=needed,
                    fits=fits, verified=True, freed=[] if conf is None else [f"allocator settings {conf} (replayed)"],
                    trace=trace)
    baseline = plan_for(None)
    plans = [baseline] + [plan_for(c) for c in CANDIDATE_CONFS]
    return Advice(plans, baseline, cap, objective, [CAPACITY_NOTE])
