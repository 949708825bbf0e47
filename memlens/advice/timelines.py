"""Which plans keep their verified prediction's trace, so that a plan's memory timeline can be shown beside the
baseline's without predicting it again: the baseline and the plans on the memory / time frontier only. The
search drops a trace as soon as a later plan beats its plan on both device memory and modeled step time (a
beaten plan never returns to the frontier), so at any moment at most the frontier so far holds traces."""
from __future__ import annotations


def plan_trace(prediction):
    """The trace to show for a plan's prediction: the `Prediction`'s own trace, or for a
    `DistributedPrediction` the trace of the rank needing the most device memory (the lowest such rank);
    None when there is none."""
    if prediction is None:
        return None
    ranks = getattr(prediction, "predictions", None)
    if ranks is None:
        return prediction.trace
    traced = [(r, p) for r, p in sorted(ranks.items()) if p.trace is not None]
    if not traced:
        return None
    return max(traced, key=lambda rp: (rp[1].device_bytes_needed or 0, -rp[0]))[1].trace


def keep_frontier_traces(plans: list, baseline) -> None:
    """Drop (set to None) the trace of every plan of `plans` that is neither `baseline` nor on the memory /
    time frontier of `plans` (`memlens.advice.result.frontier`); in place."""
    from memlens.advice.result import frontier
    keep = {id(p) for p in frontier(plans)} | {id(baseline)}
    for p in plans:
        if id(p) not in keep:
            p.trace = None
