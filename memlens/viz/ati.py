"""Access time intervals (ATI): histogram and ECDF, split by what the bandwidth filter lets through.

An interval is swappable when it is at least the round trip of its block over the host link
(`memlens.analysis.swappable.bandwidth_filter`); that threshold depends on the block's size, so the bars are
split exactly (swappable vs too short) and the dashed line marks the round trip of the median-size block as
a reference.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.units import format_bytes, format_ns
from memlens.viz.labels import plot_text


def _filtered(trace_or_intervals, bandwidth, device):
    """Intervals with the bandwidth filter applied; a frame that already went through it is used as is."""
    from memlens.analysis.swappable import bandwidth_filter

    if isinstance(trace_or_intervals, pd.DataFrame) and "swappable" in trace_or_intervals.columns:
        iv = trace_or_intervals
        out = iv if device is None else iv[iv["device"].astype(str) == device]
    else:
        out = bandwidth_filter(trace_or_intervals, bandwidth, device)
    label = _clock(trace_or_intervals)
    if label:
        out.attrs["clock_label"] = label
    return out


def _clock(trace_or_intervals) -> str:
    """The clock label of a Trace, or of the clock an intervals frame carries in ``attrs["clock"]``
    ("" if none)."""
    from memlens.clock import clock_label
    if isinstance(trace_or_intervals, pd.DataFrame):
        clock = trace_or_intervals.attrs.get("clock")
        return clock_label(clock) if isinstance(clock, dict) else str(clock or "")
    return clock_label(trace_or_intervals)


def _reference_threshold(iv, bandwidth) -> tuple[float, int, str]:
    """(round trip ns, reference size bytes, link description) for the median block size of `iv`."""
    from memlens.analysis.bandwidth import DEFAULT, BandwidthModel

    bw = BandwidthModel.parse(bandwidth) if bandwidth is not None else DEFAULT
    size = int(np.median(iv["size"].to_numpy())) if len(iv) else 0
    return float(bw.round_trip_ns(size)), size, bw.describe()


def ati_histogram(trace_or_intervals, bandwidth=None, device: str | None = None, per_decade: int = 5,
                  weight: str = "count"):
    """Figure: log-binned histogram of ATIs (ns), bars split into swappable / too short at `bandwidth`.

    Accepts a Trace (needs accesses), a frame from `memlens.analysis.ati.access_intervals`, or one from
    `memlens.analysis.swappable.bandwidth_filter` (used as filtered; pass the same `bandwidth`). `weight` is
    "count" (intervals) or "bytes_ns" (size x length: where the idle memory is).
    """
    import plotly.graph_objects as go

    from memlens.analysis.distributions import log_bins

    if weight not in ("count", "bytes_ns"):
        raise ValueError(f"weight must be 'count' or 'bytes_ns', got {weight!r}")
    iv = _filtered(trace_or_intervals, bandwidth, device)
    lengths = iv["length_ns"].to_numpy(dtype=np.float64)
    w = np.ones(len(iv)) if weight == "count" else lengths * iv["size"].to_numpy(dtype=np.float64)
    edges = log_bins(lengths, per_decade=per_decade)
    swappable = iv["swappable"].to_numpy()
    fig = go.Figure()
    centers = np.sqrt(np.maximum(edges[:-1], 0.5) * edges[1:])
    for mask, name, color in ((~swappable, "too short to swap", "#BAB0AC"), (swappable, "swappable", "#4C78A8")):
        h, _ = np.histogram(lengths[mask], bins=edges, weights=w[mask])
        fig.add_trace(go.Bar(x=centers, y=h, width=np.diff(edges) * 0.95, name=name, marker_color=color,
                             customdata=np.stack([edges[:-1], edges[1:]], axis=1),
                             hovertemplate=name + ": %{y:,.3s} in [%{customdata[0]:.3s}, %{customdata[1]:.3s}) ns"
                                           "<extra></extra>"))
    threshold, ref_size, link = _reference_threshold(iv, bandwidth)
    if len(iv):
        fig.add_vline(x=max(threshold, 1.0), line_dash="dash", line_color="#E45756",
                      annotation_text=plot_text(f"round trip of a {format_bytes(ref_size)} block: {format_ns(threshold)}"),
                      annotation_position="top right")
    fig.update_layout(barmode="stack", height=380, margin=dict(l=60, r=20, t=40, b=50),
                      title=plot_text(f"{len(iv):,} access intervals" +
                                 ("" if weight == "count" else ", weighted by size x length (idle byte-time)") +
                                 f"; link {link}" + (f"; {iv.attrs['clock_label']}" if iv.attrs.get("clock_label") else "")),
                      xaxis=dict(type="log", title="interval length (ns)"),
                      yaxis=dict(title="intervals" if weight == "count" else "bytes x ns", tickformat=".3~s"))
    return fig


def ati_ecdf(trace_or_intervals, bandwidth=None, device: str | None = None, max_points: int = 2000):
    """Figure: empirical CDF of ATIs (ns, log axis) with the reference round-trip threshold and the share of
    intervals below it (see module docstring)."""
    import plotly.graph_objects as go

    from memlens.analysis.distributions import ecdf

    iv = _filtered(trace_or_intervals, bandwidth, device)
    lengths = iv["length_ns"].to_numpy(dtype=np.float64)
    fig = go.Figure()
    all_curve = ecdf(lengths, max_points=max_points)
    fig.add_trace(go.Scatter(x=np.maximum(all_curve["value"], 1.0), y=all_curve["fraction"], mode="lines",
                             line_shape="hv", name="all intervals"))
    threshold, ref_size, link = _reference_threshold(iv, bandwidth)
    if len(iv):
        below = float((lengths < threshold).mean())
        fig.add_vline(x=max(threshold, 1.0), line_dash="dash", line_color="#E45756",
                      annotation_text=plot_text(f"{below:.0%} shorter than the round trip of a {format_bytes(ref_size)} "
                                           f"block ({format_ns(threshold)})"), annotation_position="bottom right")
    fig.update_layout(height=340, margin=dict(l=60, r=20, t=40, b=50), title=plot_text(f"ECDF; link {link}" +
                                                                             (f"; {iv.attrs['clock_label']}"
                                                                              if iv.attrs.get("clock_label") else "")),
                      xaxis=dict(type="log", title="interval length (ns)"),
                      yaxis=dict(title="fraction of intervals <= x", range=[0, 1.02]))
    return fig
