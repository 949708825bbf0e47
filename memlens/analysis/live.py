"""Live bytes over time as plain arrays, for the analyses that walk the curve of a million blocks.

The curve of `Trace.live_bytes` (one event order: `memlens.trace.live_events`), optionally summed over
every device, returned with where each block's allocation sits on it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.trace import live_events


def live_curve(trace, device: str | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """Live bytes after each alloc/free of `device` (all devices summed when None), in event order.

    Returns (frame with ``t_ns``, ``seq``, ``live`` (bytes); position in that frame of each selected
    block's alloc event, aligned with the selected rows of the blocks table).
    """
    b = trace.blocks if device is None else trace.blocks[trace.blocks["device"] == device]
    t, seq, delta, row, is_alloc = live_events(b, trace.time_span_ns()[0])
    alloc_at = np.empty(len(b), dtype=np.int64)
    alloc_at[row[is_alloc]] = np.flatnonzero(is_alloc)
    return pd.DataFrame({"t_ns": t, "seq": seq, "live": np.cumsum(delta)}, copy=False), alloc_at
