"""The trace a plan's verified prediction keeps, so that a plan's memory timeline can be shown beside the
baseline's without predicting it again (which plans keep one: `memlens.advice.result.keep_frontier_traces`)."""
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

