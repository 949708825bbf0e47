"""Two runs' live memory overlaid on one axis (the figure of `memlens.diff`)."""
from __future__ import annotations

from memlens.viz.labels import byte_unit, plot_text, time_axis
from memlens.viz.live import live_series

ALIGNS = ("auto", "start", "iteration")


def _offset(trace, align: str, x: str) -> tuple[float, str]:
    """(x offset, how) that puts the trace's alignment point at 0."""
    if align == "start" or x == "event":
        return 0.0, "trace start"
    from memlens.analysis.iterations import split_iterations
    its = split_iterations(trace)
    if str(its["source"].iloc[0]) != "none":
        return float(its["start_ns"].iloc[0]), "first iteration"
    # no iterations: the first forward pass the snapshot's stacks show (setup before it differs between runs)
    forward = [p for p in trace.metadata.get("phases") or [] if p.get("name") == "forward"]
    if forward:
        return float(min(p["start_ns"] for p in forward)), "first forward pass"
    return 0.0, "trace start"


def diff_overlay(a, b, device_pairs=None, align: str = "auto", x: str = "time", max_points: int = 4000,
                 names: tuple[str, str] = ("A", "B")):
    """Figure: live bytes of `a` and `b`, one row per device pair, both peaks marked.

    `align` "start" puts both trace starts at 0; "iteration" each trace's first iteration start (when both
    have iterations; otherwise the starts); "auto" is "iteration" when possible. `x` is "time" (unit chosen by the longer trace's span) or
    "event" (event index, always aligned at the start). `device_pairs` defaults to the pairing of
    `memlens.analysis.diff.pair_devices`.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from memlens.units import format_bytes

    if align not in ALIGNS:
        raise ValueError(f"align must be one of {ALIGNS}, got {align!r}")
    if device_pairs is None:
        from memlens.analysis.diff import pair_devices
        device_pairs, _ = pair_devices(a, b)
    scale, x_title = time_axis(x, span_ns=max(a.duration_ns, b.duration_ns))
    off_a, how_a = _offset(a, "iteration" if align != "start" else "start", x)
    off_b, how_b = _offset(b, "iteration" if align != "start" else "start", x)
    if how_a != how_b:  # only one has iterations: align both at their starts
        off_a, off_b, how_a = 0.0, 0.0, "trace start"
    rows = max(len(device_pairs), 1)
    titles = [plot_text(da if da == db else f"{da} / {db}") for da, db in device_pairs] or None
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=titles)
    styles = (("#4C78A8", "solid"), ("#E45756", "solid"))
    series = [[live_series(trace, dev, by="none", x=x, max_points=max_points) for trace, dev in zip((a, b), pair)]
              for pair in device_pairs]
    div, unit = byte_unit(max((s.peak_bytes for row in series for s in row), default=0))
    for row, pair_series in enumerate(series, start=1):
        for side, (s, off, name, (color, dash)) in enumerate(zip(pair_series, (off_a, off_b), names, styles)):
            label = plot_text(f"{'AB'[side]}: {name}")
            fig.add_trace(go.Scatter(x=(s.x - off) / scale, y=s.total / div, mode="lines", name=label,
                                     legendgroup=label, showlegend=row == 1,
                                     line=dict(color=color, dash=dash, shape="hv", width=1.5),
                                     hovertemplate=label + f": %{{y:,.2f}} {unit}<extra></extra>"), row=row, col=1)
            if s.events:
                fig.add_trace(go.Scatter(
                    x=[(s.peak_x - off) / scale], y=[s.peak_bytes / div], mode="markers+text",
                    # A's label left of its marker, B's right of its own: two peaks at about the same place never
                    # print one label over the other
                    text=[f"{'AB'[side]} peak {format_bytes(s.peak_bytes)}"], textposition=("top left", "top right")[side],
                    marker=dict(symbol="triangle-down", size=11, color=color), showlegend=False,
                    hovertemplate=f"{label} peak {s.peak_bytes:,} B<extra></extra>"), row=row, col=1)
        fig.update_yaxes(title_text=f"live memory ({unit})", rangemode="tozero", row=row, col=1)
    if how_a in ("first iteration", "first forward pass"):
        x_title = x_title.replace("time since trace start", f"time from each trace's {how_a} start")
    fig.update_xaxes(title_text=x_title, row=rows, col=1)
    fig.update_layout(height=240 + 220 * rows, margin=dict(l=60, r=20, t=40, b=50), hovermode="x unified")
    return fig


def diff_figure(d, align: str = "auto", x: str = "time", max_points: int = 4000):
    """The figure of a `memlens.analysis.diff.TraceDiff`: both runs' live memory overlaid (`diff_overlay`), on the
    device pairs the diff compared. (It lives here, not on TraceDiff, so that the analysis never imports
    figures.)"""
    return diff_overlay(d.trace_a, d.trace_b, device_pairs=d.device_pairs, align=align, x=x,
                        max_points=max_points, names=(d.name_a, d.name_b))
