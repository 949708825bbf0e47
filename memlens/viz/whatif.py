"""The what-if comparison as a figure: the same run under each memory policy (`memlens.whatif`)."""
from __future__ import annotations

import pandas as pd

from memlens.viz.labels import plot_text

TEXT_COLUMNS = ("device", "stage", "variant", "note")


def escaped_table(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of a `memlens.whatif.compare` table whose text columns are HTML-escaped for plotly."""
    out = df.copy()
    for col in TEXT_COLUMNS:
        if col in out.columns:
            out[col] = out[col].map(plot_text)
    return out


def whatif_comparison(trace_or_table, bandwidth="pcie4", conf_variants=None, time_limit_s: float = 1.0,
                      limit=None):
    """Figure: bytes each policy needs (recorded / simulated caching allocator, static plan, max-live,
    swapping, infinite bandwidth), one panel per device.

    Accepts a Trace (runs `memlens.whatif.compare` with the given options: `bandwidth` text or model,
    `conf_variants` PYTORCH_CUDA_ALLOC_CONF strings, `time_limit_s` planner search seconds, `limit` memory
    limit in bytes for swapping) or a table that `compare` returned.
    """
    from memlens.whatif import compare, whatif_figure

    if isinstance(trace_or_table, pd.DataFrame):
        table = trace_or_table
    else:
        table = compare(trace_or_table, bandwidth=bandwidth, conf_variants=conf_variants,
                        time_limit_s=time_limit_s, limit=limit)
    return whatif_figure(escaped_table(table))
