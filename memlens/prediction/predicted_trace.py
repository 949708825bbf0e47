"""How the recording of a fake run becomes a predicted trace's blocks and clock: the sizes the caching
allocator would give (`allocator_sized`) and the GPU's modeled clock (`onto_gpu_clock`).

`memlens.prediction.predictor` runs these around the corrections (`memlens.prediction.corrections`) and the
modelled scratch (`memlens.prediction.scratch.modelled`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def allocator_sized(trace, op_threads: list[int], config):
    """`trace` with each op's thread (`op_threads`: per op index, when the session saw every op) and its
    ``cuda`` blocks as the caching allocator under `config` (an `AllocatorConfig`) would give them: sizes
    rounded (bytes), the bytes asked for kept in ``requested_size``, no addresses (fake tensors have none)."""
    from memlens.simulate.config import round_size
    op_ids = trace.ops["op_id"].to_numpy()
    if len(op_threads) >= len(op_ids) and len(op_ids):
        trace.ops["thread"] = np.asarray(op_threads, dtype=np.int64)[op_ids]
    blocks = trace.blocks.copy()
    cuda = blocks["device"].str.startswith("cuda")
    blocks.loc[cuda, "addr"] = pd.NA
    blocks["requested_size"] = blocks["size"]
    sizes = blocks.loc[cuda, "size"].to_numpy()
    blocks.loc[cuda, "size"] = np.array([round_size(int(s), config) for s in sizes], dtype=np.int64)
    trace.blocks = blocks
    return trace


def onto_gpu_clock(trace, gpu_name: str, reset_marks: list[int]) -> tuple:
    """(`trace` on the modeled clock of GPU `gpu_name`, the reset marks on that clock, ns).

    `memlens.retime` puts the ops back to back with durations from the per-op cost model; each
    ``reset_peak_memory_stats`` mark (`reset_marks`, trace ns) follows the first op after it. Keeps the
    host clock and the marks, with a note, when the GPU is not in memlens.gpus() or retiming fails."""
    from memlens.devicetime.retiming import retime
    ops = trace.ops.sort_values(["start_ns", "op_id"])
    starts = ops["start_ns"].to_numpy()
    marks = [int(ops["op_id"].iloc[i]) for i in np.searchsorted(starts, reset_marks) if i < len(ops)]
    try:
        out = retime(trace, gpu=gpu_name)
    except Exception as exc:   # an unknown GPU for the cost model, or no cost facts: keep the host clock
        trace.metadata.setdefault("notes", []).append(
            f"predict: not retimed onto a GPU clock ({type(exc).__name__}: {exc}); times are host times of "
            "fake execution")
        return trace, reset_marks
    new_start = out.ops.set_index("op_id")["start_ns"]
    new_marks = [int(new_start.loc[m]) - 1 for m in marks]
    out.metadata["prediction"]["reset_peak_ns"] = new_marks
    return out, new_marks
