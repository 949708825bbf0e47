"""Live bytes over time as plain arrays, for the analyses that walk the curve of a million blocks.

The same curve as `Trace.live_bytes` (events ordered by time then event order; blocks alive before
recording count from the trace start), optionally summed over every device, built without a pandas
consolidation copy and returning where each block's allocation sits on it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def live_curve(trace, device: str | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """Live bytes after each alloc/free of `device` (all devices summed when None), in event order.

    Returns (frame with ``t_ns``, ``seq``, ``live`` (bytes); position in that frame of each selected
    block's alloc event, aligned with the selected rows of the blocks table).
    """
    b = trace.blocks if device is None else trace.blocks[trace.blocks["device"] == device]
    n = len(b)
    lo, _ = trace.time_span_ns()
    size = b["size"].to_numpy(dtype=np.int64)
    freed = b["free_ns"].notna().to_numpy()
    t = np.concatenate([b["alloc_ns"].fillna(lo).to_numpy(np.int64),
                        b["free_ns"].to_numpy("float64", na_value=0)[freed].astype(np.int64)])
    seq = np.concatenate([b["alloc_seq"].fillna(-1).to_numpy(np.int64),
                          b["free_seq"].fillna(np.iinfo(np.int64).max).to_numpy(np.int64)[freed]])
    delta = np.concatenate([size, -size[freed]])
    order = np.lexsort((seq, t))
    where = np.empty(len(order), dtype=np.int64)
    where[order] = np.arange(len(order))
    frame = pd.DataFrame({"t_ns": t[order], "seq": seq[order], "live": np.cumsum(delta[order])}, copy=False)
    return frame, where[:n]
