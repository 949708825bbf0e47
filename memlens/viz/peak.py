"""What is live at the peak, as bars: bytes per category and per module (or op) at each device's peak."""
from __future__ import annotations

from memlens.viz.labels import byte_unit, color_for, plot_text


def peak_composition(trace_or_breakdowns, by: str = "module", top: int = 15):
    """Figure: for each device, its live bytes at the peak split by category (one stacked bar) and the `top`
    groups by `by` ("module" or "op") as horizontal bars.

    Accepts a Trace or the dict `memlens.analysis.peak.peak_breakdown` returns.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from memlens.units import format_bytes, format_share

    if by not in ("module", "op"):
        raise ValueError(f"by must be 'module' or 'op', got {by!r}")
    if isinstance(trace_or_breakdowns, dict):
        peaks = trace_or_breakdowns
    else:
        from memlens.analysis.peak import peak_breakdown
        peaks = peak_breakdown(trace_or_breakdowns)
    devices = list(peaks)
    div, unit = byte_unit(max((p.peak_bytes for p in peaks.values()), default=0))
    fig = make_subplots(rows=max(len(devices), 1), cols=2, column_widths=[0.25, 0.75], horizontal_spacing=0.25,
                        subplot_titles=[t for d in devices for t in (plot_text(f"{d}: by category"),
                                                                      plot_text(f"{d}: top {top} by {by}"))] or None)
    seen: set[str] = set()
    for row, dev in enumerate(devices, start=1):
        pb = peaks[dev]
        for i, r in enumerate(pb.by_category.itertuples()):
            name = plot_text(r.category)
            fig.add_trace(go.Bar(x=[plot_text(dev)], y=[r.bytes / div], name=name, legendgroup=name,
                                 showlegend=name not in seen, marker_color=color_for(str(r.category), i, "category"),
                                 hovertemplate=f"{name}: {format_bytes(r.bytes)} ({format_share(r.share)})<extra></extra>"),
                          row=row, col=1)
            seen.add(name)
        groups = getattr(pb, f"by_{by}").head(top).iloc[::-1]
        fig.add_trace(go.Bar(x=groups["bytes"] / div, y=[plot_text(v) for v in groups[by]], orientation="h",
                             showlegend=False, marker_color="#4C78A8",
                             text=[format_bytes(v) for v in groups["bytes"]], textposition="auto",
                             hovertemplate="%{y}: %{x:,.2f} " + unit + "<extra></extra>"), row=row, col=2)
        fig.update_yaxes(title_text=f"live at the peak ({unit})", row=row, col=1)
        fig.update_xaxes(title_text=unit, row=row, col=2)
    fig.update_layout(barmode="stack", height=160 + 360 * max(len(devices), 1), margin=dict(l=60, r=20, t=50, b=40),
                      legend=dict(title_text="category"))
    return fig
