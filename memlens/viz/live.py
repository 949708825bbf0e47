"""Live memory over time, stacked by category / module / op, with the peak marked.

The curve is exact at every kept point: points are whole events of the trace (`Trace.live_bytes`), reduced
per pixel column by `lod.extrema_indices`, so the peak is never lost however many events there are.
"""
from __future__ import annotations

from memlens.clock import clock_label

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.viz.labels import byte_unit, color_for, plot_text, time_axis
from memlens.viz.lod import extrema_indices

GROUPINGS = ("category", "module", "op", "none")


@dataclass
class LiveSeries:
    """Live bytes of one device at the kept events.

    ``x`` (ns since trace start, or event index), ``total`` (bytes), ``groups`` ({label: bytes array},
    bottom of the stack first), ``peak_x`` / ``peak_bytes`` (exact), ``events`` (events before reduction).
    Labels are raw trace text (escape before display).
    """

    device: str
    x: np.ndarray
    total: np.ndarray
    groups: dict[str, np.ndarray] = field(default_factory=dict)
    peak_x: float = 0.0
    peak_bytes: int = 0
    events: int = 0


def live_series(trace, device: str, by: str = "category", x: str = "time", max_points: int = 4000,
                top_groups: int = 8, curve=None) -> LiveSeries:
    """Live bytes of `device` after each event, reduced to about `max_points` points, split by `by`.

    `by` is a block column (category, module, op) or "none"; the `top_groups` groups holding the most bytes
    at the peak are kept and the rest summed as "other". `x` is "time" (ns) or "event" (event index).
    `curve` is ``trace.live_bytes(device)`` when the caller already has it.
    """
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {GROUPINGS}, got {by!r}")
    time_axis(x)
    curve = trace.live_bytes(device) if curve is None else curve
    n = len(curve)
    if n == 0:
        return LiveSeries(device=device, x=np.zeros(0), total=np.zeros(0, dtype=np.int64))
    live = curve["live"].to_numpy(dtype=np.int64)
    xs = curve["t_ns"].to_numpy(dtype=np.float64) if x == "time" else np.arange(n, dtype=np.float64)
    # blocks alive before recording all enter at the first instant: show the level they make, not a ramp
    # from 0 through each of them (a curve that seemed to jump up from 0 at the start)
    before = curve["seq"].to_numpy() < 0
    visible = np.flatnonzero(~before | (np.arange(n) == (np.flatnonzero(before)[-1] if before.any() else -1)))
    keep = visible[extrema_indices(xs[visible], live[visible], max(max_points // 4, 1))]
    i_peak = int(np.argmax(live))
    series = LiveSeries(device=device, x=xs[keep], total=live[keep], peak_x=float(xs[i_peak]),
                        peak_bytes=int(live[i_peak]), events=n)
    if by == "none":
        series.groups = {"live": live[keep]}
        return series
    blocks = trace.blocks[trace.blocks["device"] == device]
    labels = blocks[by].astype(str).replace("", "(unknown)").to_numpy()
    row = pd.Index(blocks["block_id"].to_numpy()).get_indexer(curve["block_id"].to_numpy())
    event_label = labels[row]
    delta = curve["delta"].to_numpy(dtype=np.int64)
    codes, names = pd.factorize(event_label)
    # bytes per group at the peak decide which groups get their own band
    at_peak = np.bincount(codes[: i_peak + 1], weights=delta[: i_peak + 1], minlength=len(names))
    ranked = np.argsort(-at_peak, kind="stable")
    own = ranked[:top_groups] if len(names) > top_groups + 1 else ranked
    groups: dict[str, np.ndarray] = {}
    covered = np.zeros(len(keep), dtype=np.int64)
    for code in own:
        band = np.cumsum(np.where(codes == code, delta, 0))[keep]
        groups[str(names[code])] = band
        covered += band
    if len(own) < len(names):
        groups["other"] = live[keep] - covered
    series.groups = groups
    return series


def live_memory(trace, device: str | None = None, by: str = "category", x: str = "time",
                max_points: int = 4000, top_groups: int = 8, height: int | None = None, curves: dict | None = None):
    """Figure: live bytes over time per device (one row each), stacked by `by`, the peak marked.

    `device` limits it to one device. `x` is "time" (since the trace start, in the unit that suits its span; idle gaps visible) or
    "event" (event index, as PyTorch's memory_viz). See `live_series` for `by`, `max_points`, `top_groups`;
    `curves` ({device: trace.live_bytes(device)}) saves recomputing them.
    """
    devices = trace.devices if device is None else [device]
    series = [live_series(trace, dev, by=by, x=x, max_points=max_points, top_groups=top_groups,
                          curve=(curves or {}).get(dev)) for dev in devices]
    from memlens.reserved import reserved_curve
    reserved = {dev: reserved_curve(trace, dev) for dev in devices}

    def event_index(dev, seqs):
        return np.searchsorted((curves or {}).get(dev, trace.live_bytes(dev))["seq"].to_numpy(), seqs, side="left")
    return series_figure(series, x=x, span_ns=trace.duration_ns, clock=clock_label(trace), by=by, height=height,
                         reserved=reserved, event_index=event_index)


def series_figure(series: list[LiveSeries], *, x: str, span_ns: int, clock: str, by: str, height: int | None = None,
                  reserved: dict | None = None, event_index=None):
    """The figure of `live_memory` from prepared `LiveSeries` (one row per series' device): what the
    out-of-core report draws from curves it reduced a time bucket at a time. `reserved` ({device:
    `reserved.ReservedCurve` or None}) adds the reserved line; with ``x="event"`` it needs `event_index`
    (device, seqs) -> the event index of each seq."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from memlens.units import format_bytes

    devices = [s.device for s in series]
    reserved = reserved or {}
    scale, x_title = time_axis(x, span_ns=span_ns, clock=clock)
    fig = make_subplots(rows=max(len(devices), 1), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[plot_text(d) for d in devices] or None)
    seen_legend: set[str] = set()
    div, unit = byte_unit(max([s.peak_bytes for s in series] + [r.peak for r in reserved.values() if r],
                              default=0))
    for row, (dev, s) in enumerate(zip(devices, series), start=1):
        xs = s.x / scale
        res = reserved.get(dev)
        if res is not None and s.events:
            # what the allocator held from the device (memory reserved before recording included)
            rx = res.t_ns.astype(np.float64) if x == "time" else event_index(dev, res.seq).astype(np.float64)
            rx = np.append(rx, xs[-1] * scale if len(xs) else rx[-1])
            ry = np.append(res.reserved, res.reserved[-1])
            label = f"reserved (peak {format_bytes(res.peak)})"
            fig.add_trace(go.Scatter(
                x=rx / scale, y=ry / div, mode="lines", name="reserved", legendgroup="reserved",
                showlegend="reserved" not in seen_legend, line=dict(color="#555555", dash="dot", width=1.2, shape="hv"),
                hovertemplate=f"{plot_text(label)}: %{{y:,.2f}} {unit}<extra></extra>"), row=row, col=1)
            seen_legend.add("reserved")
        for i, (label, values) in enumerate(s.groups.items()):
            name = plot_text(label)
            fig.add_trace(go.Scatter(
                x=xs, y=values / div, name=name, legendgroup=name, showlegend=name not in seen_legend,
                mode="lines", line=dict(width=0.5, shape="hv", color=color_for(label, i, by)),
                stackgroup=f"live{row}", hovertemplate=f"{name}: %{{y:,.2f}} {unit}<extra></extra>"),
                row=row, col=1)
            seen_legend.add(name)
        if s.events:
            label = f"peak {format_bytes(s.peak_bytes)}"
            fig.add_trace(go.Scatter(
                x=[s.peak_x / scale], y=[s.peak_bytes / div], mode="markers+text", name="peak",
                legendgroup="peak", showlegend="peak" not in seen_legend, text=[label],
                textposition="top center", marker=dict(symbol="triangle-down", size=12, color="black"),
                hovertemplate=f"{plot_text(dev)} {label} ({s.peak_bytes:,} B)<extra></extra>"), row=row, col=1)
            seen_legend.add("peak")
        fig.update_yaxes(title_text=f"live memory ({unit})", rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text=x_title, row=max(len(devices), 1), col=1)
    fig.update_layout(height=height or 260 + 220 * max(len(devices), 1), margin=dict(l=60, r=20, t=40, b=50),
                      hovermode="x unified", legend=dict(title_text=plot_text(by)))
    return fig
