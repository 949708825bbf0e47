"""The run's phases (forward pass, backward pass, optimizer step, annotated ranges), from whatever the trace
tells: a snapshot's annotations and frames (``metadata["phases"]``, set by its importer) or, for a recording,
the ``phase`` column of its ops."""
from __future__ import annotations

import numpy as np
import pandas as pd

# the recorders' op phases, named as the snapshot importer names the same phases
OPS_PHASE_NAMES = {"forward": "forward", "backward": "backward", "optimizer": "optimizer_step"}


def trace_phases(trace) -> list[dict]:
    """Phases as dicts ``name``, ``start_ns``, ``end_ns`` (ns since the trace start, on the trace's clock),
    ``source``, sorted by start. The importer's phases when it found any; otherwise each run of consecutive
    recorded ops in one phase within one iteration, from its first op's start to its last op's end (ops in no
    phase, e.g. a loss computed outside every module, neither end nor join a run)."""
    known = trace.metadata.get("phases") or []
    if known:
        return list(known)
    # an out-of-core report's stand-in trace carries metadata only: no ops table to read phases from
    return phases_from_ops(getattr(trace, "ops", None))


def phases_from_ops(ops) -> list[dict]:
    """Runs of consecutive ops (by start time) with the same known ``phase`` and ``iteration`` (see
    `trace_phases`); source ``"recorded ops"``. Empty when the ops carry no phase column."""
    if ops is None or len(ops) == 0 or "phase" not in ops.columns:
        return []
    ops = ops.sort_values(["start_ns", "op_id"] if "op_id" in ops.columns else ["start_ns"], kind="stable")
    names = ops["phase"].astype(object).map(OPS_PHASE_NAMES).to_numpy(dtype=object)
    keep = pd.notna(names)   # ops in no known phase map to NaN
    if not keep.any():
        return []
    names = names[keep].astype(str)
    start = ops["start_ns"].to_numpy(dtype=np.int64)[keep]
    end = ops["end_ns"].to_numpy(dtype=np.int64)[keep]
    iteration = (ops["iteration"].to_numpy(dtype=np.float64, na_value=np.nan)[keep]
                 if "iteration" in ops.columns else np.zeros(len(names)))
    iteration = np.where(np.isnan(iteration), -1.0, iteration)
    change = np.flatnonzero((names[1:] != names[:-1]) | (iteration[1:] != iteration[:-1])) + 1
    first = np.concatenate([[0], change])
    last = np.concatenate([change, [len(names)]])
    run_end = np.maximum.reduceat(end, first)
    return [{"name": str(names[f]), "start_ns": int(start[f]), "end_ns": int(e), "source": "recorded ops"}
            for f, e in zip(first, run_end)]
