"""The advisor's figures: the memory / time frontier of the verified plans (device memory needed per rank
against the modeled step time, the capacity as a line), and one plan's memory timeline beside the
baseline's. Both come from `plan_points`, the one table the report's and the widget's text are written from
too, so a number in the words and the point it describes never disagree."""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.units import format_bytes
from memlens.viz.labels import binary_ticks, plot_text, time_axis

FITS_COLOUR, MISSES_COLOUR, BASELINE_COLOUR = "#54A24B", "#E45756", "#9E9E9E"
TIMELINE_POINTS = 2000  # points per memory curve (the peak is always kept: `memlens.viz.live.live_series`)


def plan_points(advice) -> pd.DataFrame:
    """One row per ranked plan of `advice`: ``rank`` (1-based, the advice's order), the columns of
    `Advice.table` (bytes per rank, modeled ns), ``step_ms`` (modeled step time, ms), ``on_frontier`` (no
    plan beats it on both device memory and step time), ``is_baseline`` and ``has_timeline`` (its
    prediction's trace was kept: the baseline and the frontier plans)."""
    table = advice.table()
    table.insert(0, "rank", np.arange(1, len(table) + 1))
    front = {id(p) for p in advice.frontier()}
    table["step_ms"] = [None if p.step_ns is None else p.step_ns / 1e6 for p in advice.plans]
    table["on_frontier"] = [id(p) in front for p in advice.plans]
    table["is_baseline"] = [p is advice.baseline for p in advice.plans]
    table["has_timeline"] = [p.trace is not None for p in advice.plans]
    return table


def advice_clock(advice) -> str:
    """The clock the plans' step times are on ("modeled H100 SXM clock"), from the baseline's trace."""
    from memlens.clock import clock_label
    trace = getattr(advice.baseline, "trace", None)
    return clock_label(trace) if trace is not None else "modeled clock"


def frontier_figure(points: pd.DataFrame, capacity: int | None, clock: str = "modeled clock"):
    """Figure: each plan of `points` (`plan_points`) with a modeled step time as a point (x: step time, ms;
    y: device memory needed per rank, bytes), the frontier joined by a line, green where the plan fits;
    `capacity` (bytes per GPU) as a dashed line. Each point's ``customdata`` is its plan's rank."""
    import plotly.graph_objects as go
    timed = points[points["step_ms"].notna() & points["error"].isna()]
    fig = go.Figure()
    # the beaten plans first, so that the frontier is drawn (and picked by a click) on top of a beaten plan
    # that lies almost on it (the same plan under other allocator settings)
    for name, rows, mode in (("other plans", timed[~timed["on_frontier"]], "markers"),
                             ("frontier", timed[timed["on_frontier"]].sort_values("step_ms"), "lines+markers")):
        fig.add_trace(go.Scatter(
            x=rows["step_ms"].to_numpy(dtype=float), y=rows["device_bytes_needed"].to_numpy(dtype=float),
            mode=mode, name=name, customdata=rows["rank"].to_numpy(),
            line=dict(color="#4C78A8", width=1.5), marker=dict(
                size=12 if name == "frontier" else 9, symbol="circle" if name == "frontier" else "circle-open",
                color=[FITS_COLOUR if f else MISSES_COLOUR for f in rows["fits"]],
                line=dict(width=[3 if b else 1 for b in rows["is_baseline"]], color="#263238")),
            text=[plot_text(f"#{r}: {c}") for r, c in zip(rows["rank"], rows["changes"])],
            hovertemplate="%{text}<br>step %{x:.2f} ms<br>needs %{y:,.0f} bytes per rank<extra></extra>"))
    top = max([float(timed["device_bytes_needed"].max()) if len(timed) else 0.0, float(capacity or 0)])
    vals, text = binary_ticks(0.0, top * 1.05 if top else 1.0)
    fig.update_layout(
        title=dict(text=f"Verified plans: device memory per rank vs step time ({plot_text(clock)})", font_size=13),
        xaxis_title=f"modeled step time (ms, {plot_text(clock)})",
        yaxis=dict(title="device memory needed per rank", tickvals=vals, ticktext=text, rangemode="tozero"),
        template="plotly_white", hovermode="closest", height=420, width=640,
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0), margin=dict(l=80, r=20, t=70, b=50))
    if capacity is not None:
        fig.add_hline(y=capacity, line=dict(color="#263238", dash="dash", width=1),
                      annotation_text=plot_text(f"capacity {format_bytes(capacity)}"),
                      annotation_position="top left")
    return fig


def _curve(trace):
    """(device, `LiveSeries` of live bytes, no grouping) of the device of `trace` that peaks highest."""
    from memlens.viz.live import live_series
    peaks = trace.peak_live_bytes()
    device = max(peaks, key=lambda d: (peaks[d], d)) if peaks else "cuda:0"
    return device, live_series(trace, device, by="none", x="time", max_points=TIMELINE_POINTS)


def plan_timeline_figure(advice, plan):
    """Figure: live (allocated) bytes over the modeled time of `plan`'s verified prediction beside the
    baseline's (each from its own trace's start; one curve when `plan` is the baseline), peaks marked, and
    the capacity less the plan's CUDA context and NCCL buffers (what the allocator may reserve) as a line.
    Raises ValueError when the plan's trace was not kept (only the baseline's and the frontier plans' are)."""
    import plotly.graph_objects as go
    from memlens.clock import clock_label
    if plan.trace is None:
        raise ValueError(f"no timeline kept for {plan.changes!r}: only the baseline's and the frontier plans' "
                         "predicted traces are kept")
    shown = [(plan, "this plan", "#4C78A8")]
    if plan is not advice.baseline and getattr(advice.baseline, "trace", None) is not None:
        shown.insert(0, (advice.baseline, "as it is", BASELINE_COLOUR))
    curves = [(p, name, colour, *_curve(p.trace)) for p, name, colour in shown]
    clock = clock_label(plan.trace)
    scale, x_title = time_axis("time", span_ns=max(p.trace.duration_ns for p, *_ in curves), clock=clock)
    fig = go.Figure()
    for p, name, colour, device, s in curves:
        label = plot_text(f"{name}: {p.changes}")
        fig.add_trace(go.Scatter(x=s.x / scale, y=s.total, mode="lines", name=label, line=dict(color=colour),
                                 hovertemplate="%{y:,.0f} bytes live<extra>" + plot_text(name) + "</extra>"))
        fig.add_trace(go.Scatter(x=[s.peak_x / scale], y=[s.peak_bytes], mode="markers+text", showlegend=False,
                                 marker=dict(color=colour, size=9), text=[plot_text(f"peak {format_bytes(s.peak_bytes)}")],
                                 textposition="top center", hoverinfo="skip", name=plot_text(f"{name} peak")))
    top = max(s.peak_bytes for *_, s in curves)
    if advice.capacity is not None and plan.device_bytes_needed is not None and plan.peak_reserved is not None:
        budget = advice.capacity - (plan.device_bytes_needed - plan.peak_reserved)
        fig.add_hline(y=budget, line=dict(color="#263238", dash="dash", width=1),
                      annotation_text=plot_text(f"capacity less CUDA context and NCCL: {format_bytes(budget)}"),
                      annotation_position="top left")
        top = max(top, budget)
    vals, text = binary_ticks(0.0, top * 1.1 if top else 1.0)
    fig.update_layout(
        title=dict(text=plot_text(f"Live memory of the step, {curves[-1][3]} ({clock})"), font_size=13),
        xaxis_title=x_title, yaxis=dict(title="live (allocated) bytes", tickvals=vals, ticktext=text),
        template="plotly_white", height=340, width=760, hovermode="x unified",
        legend=dict(orientation="h", y=-0.25, x=0), margin=dict(l=80, r=20, t=50, b=90))
    return fig


def frontier_sentence(points: pd.DataFrame, capacity: int | None) -> str:
    """The frontier chart in words, from the same `points` (`plan_points`): how many plans were verified and
    timed, how many fit `capacity`, and the frontier's two ends (fastest; least memory)."""
    from memlens.units import format_bytes as fb
    timed = points[points["step_ms"].notna() & points["error"].isna()]
    front = timed[timed["on_frontier"]].sort_values("step_ms")
    fits = int(points["fits"].fillna(False).astype(bool).sum())
    cap = "no capacity given" if capacity is None else f"{fits} of {len(points)} fit {fb(capacity)}"
    if not len(front):
        return (f"{len(points)} plans verified ({cap}); none has a modeled step time, so there is no memory / time "
                "frontier (a recorded trace is replayed, not re-timed)")
    fast, small = front.iloc[0], front.iloc[-1]
    ends = (f"fastest #{int(fast['rank'])} ({fast['changes']}): {fast['step_ms']:.2f} ms, "
            f"{fb(fast['device_bytes_needed'])} per rank")
    if len(front) > 1:
        ends += (f"; least memory #{int(small['rank'])} ({small['changes']}): {small['step_ms']:.2f} ms, "
                 f"{fb(small['device_bytes_needed'])} per rank")
    return (f"{len(points)} plans verified, {len(timed)} with a modeled step time ({cap}); the frontier holds "
            f"{len(front)}: {ends}")
