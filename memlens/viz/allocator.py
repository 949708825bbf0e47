"""A simulated caching allocator over time: reserved vs allocated bytes, next to the trace's live bytes.

Reserved minus allocated is what the allocator caches but does not hand out (its fragmentation overhead);
allocated minus live is rounding. Each curve is reduced per pixel column by `lod.extrema_indices`, so the
peaks stay exact.
"""
from __future__ import annotations

from memlens.clock import clock_label

import numpy as np

from memlens.viz.labels import byte_unit, plot_text, time_axis
from memlens.viz.lod import extrema_indices


def allocator_timeline(trace, result=None, device: str | None = None, max_points: int = 4000, conf=None,
                       x_offset_ns: int = 0):
    """Figure: simulated reserved and allocated bytes over time with the trace's live bytes, for `device`
    (default: the one with the highest peak).

    `result` is a `memlens.simulate.SimulationResult` for this trace; without one the trace is replayed
    through the caching allocator under `conf` (default: the recorded settings). `x_offset_ns` is added to
    every time (ns), e.g. to show a window cut from a longer trace on that trace's clock.
    """
    import plotly.graph_objects as go

    from memlens.units import format_bytes

    if device is None:
        peaks = trace.peak_live_bytes()
        device = max(peaks, key=peaks.get)
    if result is None:
        from memlens.simulate import simulate
        result = simulate(trace, allocator="caching", conf=conf, device=device)
    sim = result.devices[device]
    tl = sim.timeline
    tl = tl[tl["seq"] >= 0] if "seq" in tl.columns and (tl["seq"] >= 0).any() else tl
    live = trace.live_bytes(device)
    div, unit = byte_unit(max(sim.peak_reserved, int(live["live"].max()) if len(live) else 0))
    fig = go.Figure()
    bins = max(max_points // 4, 1)
    scale, x_title = time_axis("time", span_ns=trace.duration_ns, clock=clock_label(trace))
    series = (("reserved (simulated)", tl["t_ns"].to_numpy(np.float64), tl["reserved"].to_numpy(np.float64),
               "#E45756"),
              ("allocated (simulated)", tl["t_ns"].to_numpy(np.float64), tl["allocated"].to_numpy(np.float64),
               "#F58518"),
              ("live (trace)", live["t_ns"].to_numpy(np.float64), live["live"].to_numpy(np.float64), "#4C78A8"))
    for name, x, y, color in series:
        if len(x) == 0:
            continue
        keep = extrema_indices(x, y, bins)
        fig.add_trace(go.Scatter(x=(x[keep] + x_offset_ns) / scale, y=y[keep] / div, mode="lines", name=name,
                                 line=dict(shape="hv", color=color, width=1.4),
                                 hovertemplate=f"{name}: %{{y:,.2f}} {unit}<extra></extra>"))
    fig.update_layout(
        height=380, margin=dict(l=60, r=20, t=40, b=50), hovermode="x unified",
        title=plot_text(f"{device}: caching allocator ({sim.conf or 'recorded settings'}, {sim.initial_state} start): "
                   f"peak reserved {format_bytes(sim.peak_reserved)}, peak allocated "
                   f"{format_bytes(sim.peak_allocated)}"),
        xaxis_title=x_title, yaxis_title=f"bytes ({unit})")
    return fig
