"""The largest blocks of a trace, as a DataFrame and as a plotly table."""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.viz.labels import plot_text

TABLE_COLUMNS = ("block_id", "device", "size", "alloc_ns", "free_ns", "lifetime_ns", "category", "op",
                 "module", "location")


def block_locations(trace, stack_ids) -> np.ndarray:
    """'file:line name' of the innermost frame of each stack id ('' when unknown)."""
    ids = pd.Series(stack_ids, dtype="Int64")
    out = np.full(len(ids), "", dtype=object)
    stacks = trace.stacks
    if stacks is None or len(stacks) == 0 or len(ids) == 0:
        return out
    top = stacks[stacks["depth"] == 0].drop_duplicates("stack_id").set_index("stack_id")
    text = top["filename"].astype(str) + ":" + top["line"].astype(str) + " " + top["name"].astype(str)
    known = ids.notna().to_numpy()
    pos = top.index.get_indexer(ids[known].astype("int64").to_numpy())
    found = np.where(pos >= 0, text.to_numpy()[np.maximum(pos, 0)], "")
    out[known] = found
    return out


def largest_blocks(trace, n: int = 20, device: str | None = None) -> pd.DataFrame:
    """The `n` largest blocks (ties: earlier block first) with their lifetime and attribution.

    Columns: `TABLE_COLUMNS`; sizes in bytes, times in ns since the trace start (``free_ns`` missing when
    the block outlived the recording, ``lifetime_ns`` then runs to the trace end). ``location`` is the
    innermost recorded frame when the trace has stacks (or the importer's ``location`` column).
    """
    b = trace.blocks if device is None else trace.blocks[trace.blocks["device"] == device]
    if len(b) > n:
        # argpartition keeps this O(blocks) on million-block traces
        sizes = b["size"].to_numpy()
        cut = np.sort(np.argpartition(-sizes, n - 1)[:n]) if n > 0 else np.zeros(0, dtype=np.int64)
        threshold = sizes[cut].min() if len(cut) else 0
        b = b[sizes >= threshold]
    return largest_of(b, n, trace.time_span_ns(), trace.stacks)


def largest_of(b: pd.DataFrame, n: int, span: tuple[int, int], stacks) -> pd.DataFrame:
    """`largest_blocks` of the blocks rows `b` (any superset of the `n` largest), given the trace's time
    span (ns) and stacks table: what the out-of-core report builds from each batch's largest."""
    from types import SimpleNamespace
    trace = SimpleNamespace(stacks=stacks)
    top = b.sort_values(["size", "block_id"], ascending=[False, True], kind="stable").head(n)
    lo, hi = span
    out = pd.DataFrame({c: top[c] for c in ("block_id", "device", "size", "alloc_ns", "free_ns")})
    out["lifetime_ns"] = top["free_ns"].fillna(hi).astype("int64") - top["alloc_ns"].fillna(lo).astype("int64")
    for col in ("category", "op", "module"):
        out[col] = top[col].astype(str)
    if "location" in top.columns:
        out["location"] = top["location"].astype(str).replace({"nan": "", "None": ""}).to_numpy()
    else:
        out["location"] = block_locations(trace, top["stack_id"])
    return out.reset_index(drop=True)


def largest_blocks_table(trace, n: int = 20, device: str | None = None):
    """Plotly table figure of `largest_blocks` (sizes and times human-readable, text escaped)."""
    import plotly.graph_objects as go

    from memlens.units import format_bytes, format_ns

    df = largest_blocks(trace, n=n, device=device)
    cells = [df["block_id"].astype(str), df["device"].map(plot_text), df["size"].map(format_bytes),
             df["alloc_ns"].map(lambda v: "before start" if pd.isna(v) else format_ns(v)),
             df["free_ns"].map(lambda v: "still alive" if pd.isna(v) else format_ns(v)),
             df["lifetime_ns"].map(format_ns), df["category"].map(plot_text), df["op"].map(plot_text),
             df["module"].map(plot_text), df["location"].map(plot_text)]
    header = ["block", "device", "size", "allocated", "freed", "lifetime", "category", "op", "module",
              "location"]
    fig = go.Figure(go.Table(header=dict(values=header, align="left"),
                             cells=dict(values=[list(c) for c in cells], align="left")))
    fig.update_layout(height=120 + 24 * len(df), margin=dict(l=10, r=10, t=10, b=10))
    return fig
