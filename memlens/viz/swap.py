"""Swap plans as figures (`memlens.swap.plan_swaps`): what the load becomes, when each copy runs, and why
each block was picked.

- `swap_load_curves(plan)`: the load curve after swapping beside the original (and the infinite-bandwidth
  bound and the limit as lines); in steady state, one period of the cycle;
- `swap_timeline(plan)`: every copy on its stream (device->host copy-outs on one, host->device copy-ins on
  the other), with the window in which each block is off the device;
- `swap_priorities(plan)`: the candidates ranked by Zhang et al.'s DOA, AOA and WDOA, chosen ones marked.

Each figure's title names the clock the times are on and the link model (rates and copy latencies).
"""
from __future__ import annotations

import numpy as np

from memlens.units import format_bytes, format_ns
from memlens.viz.labels import plot_text

OUT_COLOR, IN_COLOR, SAVED_COLOR = "#E45756", "#4C78A8", "rgba(84,162,75,0.35)"


def _subtitle(plan) -> str:
    from memlens.analysis.clock import describe_clock
    mode = (f"steady state, iteration {plan.iteration} (period {format_ns(float(plan.period_ns))})"
            if plan.steady_state else "the recording as a straight line")
    return plot_text(f"{describe_clock(plan.clock)}; link {plan.bandwidth_text or plan.bandwidth.get('name', '')}; "
                     f"{mode}; blocks >= {format_bytes(plan.min_size)}")


def _step_xy(t: np.ndarray, v: np.ndarray, end: float | None = None):
    """Arrays drawing a step curve (value holds until the next time), in ms."""
    if len(t) == 0:
        return np.zeros(0), np.zeros(0)
    t = np.asarray(t, np.float64)
    end = float(t[-1]) if end is None else float(end)
    x = np.repeat(np.append(t, end), 2)[1:-1]
    y = np.repeat(np.asarray(v, np.float64), 2)
    return x / 1e6, y


def swap_load_curves(plan, title: str | None = None):
    """Figure: live bytes over time before and after the plan's swaps (ms on the plan's clock), with the
    infinite-bandwidth bound and the memory limit as horizontal lines."""
    import plotly.graph_objects as go

    end = plan.window_ns[1] if plan.window_ns else None
    fig = go.Figure()
    for frame, name, color in ((plan.curve_before, "recorded", "#9D9D9D"), (plan.curve_after, "after swapping",
                                                                              "#54A24B")):
        if frame is None:
            continue
        x, y = _step_xy(frame["t_ns"].to_numpy(), frame["live"].to_numpy(), end)
        fig.add_trace(go.Scattergl(x=x, y=y, mode="lines", name=name, line=dict(color=color, width=1.5),
                                   hovertemplate="%{x:.3f} ms: %{y:,.0f} bytes<extra>" + name + "</extra>"))
    for value, name, dash in ((plan.peak_before, f"peak before {format_bytes(plan.peak_before)}", "dot"),
                              (plan.peak_after, f"peak after {format_bytes(plan.peak_after)}", "solid"),
                              (plan.infinite_bandwidth_peak,
                               f"infinite bandwidth {format_bytes(plan.infinite_bandwidth_peak)}", "dash"),
                              (plan.limit, f"limit {format_bytes(plan.limit or 0)}", "dashdot")):
        if value is not None:
            fig.add_hline(y=value, line_dash=dash, line_width=1, annotation_text=plot_text(name),
                          annotation_position="top left")
    fig.update_layout(title=dict(text=plot_text(title or f"Load before and after {len(plan.swaps)} swaps "
                                                f"({plan.priority})") + f"<br><sub>{_subtitle(plan)}</sub>"),
                      xaxis_title="time (ms)", yaxis_title="live bytes", height=380,
                      margin=dict(l=60, r=20, t=70, b=50), legend=dict(orientation="h", y=-0.2))
    return fig


def swap_timeline(plan, max_swaps: int = 2000, title: str | None = None):
    """Figure: each swap's copy-out on the device->host stream and copy-in on the host->device stream (ms),
    and the window in which the block is off the device; the `max_swaps` largest swaps are drawn."""
    import plotly.graph_objects as go

    sw = plan.swaps
    if len(sw) > max_swaps:
        sw = sw.nlargest(max_swaps, "size").sort_values("out_start_ns")
    fig = go.Figure()
    lanes = ("copy-out (device->host)", "off the device", "copy-in (host->device)")
    labels = [plot_text(f"block {b} {format_bytes(z)} {c or ''} {m or ''}".strip())
              for b, z, c, m in zip(sw["block_id"], sw["size"], sw.get("category", [""] * len(sw)),
                                    sw.get("module", [""] * len(sw)))]
    for lane, start, end, color in ((lanes[0], "out_start_ns", "out_end_ns", OUT_COLOR),
                                    (lanes[1], "saved_from_ns", "saved_to_ns", SAVED_COLOR),
                                    (lanes[2], "in_start_ns", "in_end_ns", IN_COLOR)):
        s = sw[start].to_numpy(np.float64)
        e = np.maximum(sw[end].to_numpy(np.float64), s)
        fig.add_trace(go.Bar(y=[lane] * len(sw), x=(e - s) / 1e6, base=s / 1e6, orientation="h", name=lane,
                             marker=dict(color=color, line=dict(width=0.5, color="white")), customdata=labels,
                             hovertemplate="%{customdata}<br>%{base:.3f} ms + %{x:.3f} ms<extra></extra>"))
    if plan.window_ns:
        for t in plan.window_ns:
            fig.add_vline(x=t / 1e6, line_dash="dot", line_width=1)
    fig.update_layout(barmode="overlay", height=300, xaxis_title="time (ms)",
                      yaxis=dict(categoryorder="array", categoryarray=list(lanes)[::-1]),
                      title=dict(text=plot_text(title or f"Swap timeline: {len(plan.swaps)} swaps on two copy "
                                                "streams") + f"<br><sub>{_subtitle(plan)}</sub>"),
                      margin=dict(l=170, r=20, t=70, b=50), showlegend=False)
    return fig


def swap_priorities(plan, top: int = 25, title: str | None = None):
    """Figure: the `top` candidates under each of Zhang et al.'s priorities (DOA ns, AOA byte*s, WDOA ns),
    one panel each, best at the top; the swaps the plan kept are coloured."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    table = plan.candidates_table
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.12,
                        subplot_titles=("DOA (ns)", "AOA (byte x s)", "WDOA (ns)"))
    if table is None or len(table) == 0:
        fig.add_annotation(text="no swap candidates (see min_size and the link)", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5)
    else:
        for col, (name, value, scale) in enumerate((("doa", "doa_ns", 1.0), ("aoa", "aoa", 1e-9),
                                                    ("wdoa", "wdoa_ns", 1.0)), start=1):
            rows = table.sort_values(f"rank_{name}").head(top)
            labels = [f"#{r} b{b} {format_bytes(z)}" for r, b, z in
                      zip(rows[f"rank_{name}"], rows["block_id"], rows["size"])]
            colors = np.where(rows["chosen"].to_numpy(), "#54A24B", "#BAB0AC")
            fig.add_trace(go.Bar(x=rows[value].to_numpy(np.float64) * scale, y=labels, orientation="h",
                                 marker_color=colors, showlegend=False,
                                 hovertemplate="%{y}: %{x:,.4g}<extra></extra>"), row=1, col=col)
            fig.update_yaxes(autorange="reversed", row=1, col=col)
    fig.update_layout(height=120 + 18 * min(top, 0 if table is None else len(table)) + 60,
                      title=dict(text=plot_text(title or "Swap candidates by priority (green: kept)")
                                 + f"<br><sub>{_subtitle(plan)}</sub>"),
                      margin=dict(l=20, r=20, t=90, b=40))
    return fig
