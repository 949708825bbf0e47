"""The explorer's ATI panel: access time intervals of the current selection, split by the bandwidth filter.

An interval counts for the selection when its block is selected and the interval overlaps the time range.
Each interval is swappable or filtered out at the chosen link (`memlens.analysis.outliers.bandwidth_filter`:
length >= the block's round trip out and back in), which is the observation of Li et al. that most ATIs
are too short to hide a transfer. The histogram uses `memlens.analysis.distributions.log_histogram`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.distributions import ecdf, log_bins
from memlens.analysis.outliers import bandwidth_filter, filter_summary
from memlens.units import format_bytes, format_ns
from memlens.viz.labels import safe
from memlens.widgets.geometry import BlockGeometry

PER_DECADE = 5


def selection_intervals(intervals: pd.DataFrame, geom: BlockGeometry, mask: np.ndarray,
                        t_range_ns: tuple[float, float] | None) -> pd.DataFrame:
    """Rows of `intervals` (from `access_intervals`) whose block is selected and that overlap the range (ns)."""
    selected_ids = geom.block_id[mask]
    keep = np.isin(intervals["block_id"].to_numpy(dtype=np.int64), selected_ids)
    if t_range_ns is not None:
        keep &= (intervals["end_ns"].to_numpy(dtype=np.float64) >= t_range_ns[0]) & \
                (intervals["start_ns"].to_numpy(dtype=np.float64) <= t_range_ns[1])
    return intervals[keep]


def filtered_intervals(intervals: pd.DataFrame, bandwidth) -> pd.DataFrame:
    """`bandwidth_filter` of the selection's intervals at `bandwidth` (preset name, '25GB/s' or a model)."""
    return bandwidth_filter(intervals, bandwidth)


def ati_traces(filtered: pd.DataFrame, as_ecdf: bool = False) -> list[dict]:
    """Plotly trace dicts: a stacked log-binned histogram (swappable vs too short), or the two ECDFs."""
    length = filtered["length_ns"].to_numpy(dtype=np.float64)
    swappable = filtered["swappable"].to_numpy(dtype=bool)
    if as_ecdf:
        traces = []
        n = max(len(length), 1)
        for label, pick, colour in (("all intervals", np.ones(len(length), bool), "#444444"),
                                    ("swappable", swappable, "#2ca02c")):
            curve = ecdf(np.maximum(length[pick], 1.0))
            # fractions of *all* intervals, so the swappable curve ends at the swappable share
            frac = curve["fraction"].to_numpy() * pick.sum() / n
            traces.append(dict(type="scatter", mode="lines", line=dict(shape="hv", color=colour), name=label,
                               x=curve["value"].to_numpy(), y=frac))
        return traces
    edges = log_bins(np.maximum(length, 1.0), PER_DECADE)
    centres = np.sqrt(np.maximum(edges[:-1], 1.0) * edges[1:])
    widths = edges[1:] - np.maximum(edges[:-1], 1.0)
    traces = []
    for label, pick, colour in (("too short to swap", ~swappable, "#d62728"), ("swappable", swappable, "#2ca02c")):
        counts, _ = np.histogram(np.maximum(length[pick], 1.0), bins=edges)
        traces.append(dict(type="bar", name=label, x=centres, y=counts, width=widths, marker=dict(color=colour),
                           hovertemplate="%{y} intervals near %{x:.3s} ns<extra>" + label + "</extra>"))
    return traces


def ati_layout(as_ecdf: bool) -> dict:
    """Axis settings for `ati_traces`."""
    return dict(barmode="stack", xaxis=dict(type="log", title="access time interval (ns)"),
                yaxis=dict(title="fraction of intervals" if as_ecdf else "intervals"))


def ati_summary_html(filtered: pd.DataFrame) -> str:
    """One paragraph: how many intervals, how many the link filters out, the swappable share of idle bytes."""
    if len(filtered) == 0:
        return "<i>No access intervals in the current selection.</i>"
    s = filter_summary(filtered)
    bw = s.get("bandwidth") or {}
    share = s["swappable_share"]
    lengths = filtered["length_ns"].to_numpy(dtype=np.float64)
    return (f"<b>{s['intervals']:,}</b> intervals, median {safe(format_ns(float(np.median(lengths))))}; "
            f"at <b>{safe(bw.get('name', ''))}</b> {s['filtered_out_fraction']:.1%} are too short to swap; "
            f"{s['swappable']:,} swappable in {s['blocks_with_swappable']:,} blocks, holding "
            f"{'n/a' if share is None else f'{share:.1%}'} of the idle byte-time "
            f"(largest swappable block {safe(format_bytes(int(filtered.loc[filtered['swappable'], 'size'].max())) if s['swappable'] else '-')}).")
