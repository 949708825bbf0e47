"""How the explorer puts what it computed on screen: the timeline figure, the status line, the blocks' hover
text, and plotly figures shown in Output widgets."""
from __future__ import annotations

import json

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from memlens.units import format_bytes, format_ns
from memlens.viz.labels import binary_ticks, safe
from memlens.widgets.timeline import PLOT_HEIGHT_PX, PLOT_WIDTH_PX

MARGIN = dict(l=70, r=20, t=50, b=45)


def timeline_widget() -> go.FigureWidget:
    """The empty timeline FigureWidget: plot area of `PLOT_WIDTH_PX` x `PLOT_HEIGHT_PX` inside `MARGIN`."""
    return go.FigureWidget(layout=dict(
        width=PLOT_WIDTH_PX + MARGIN["l"] + MARGIN["r"], height=PLOT_HEIGHT_PX + MARGIN["t"] + MARGIN["b"],
        margin=MARGIN, template="plotly_white", dragmode="zoom", hovermode="closest",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0)))


def draw_timeline(fig, data, on_click) -> None:
    """Draw `data` (a `TimelineData` of `memlens.widgets.timeline`) into the timeline FigureWidget `fig`: traces
    updated in place when their types and names are unchanged (else replaced, each new one calling
    `on_click`), axis ranges, and binary byte ticks."""
    same_shape = [(t.type, t.name) for t in fig.data] == [(t["type"], t["name"]) for t in data.traces]
    with fig.batch_update():
        if same_shape:
            for existing, new in zip(fig.data, data.traces):
                existing.update(new, overwrite=True)
        else:
            fig.data = ()
    if not same_shape:
        fig.add_traces(data.traces)
        for t in fig.data:
            t.on_click(on_click)
    with fig.batch_update():
        fig.layout.xaxis.update(title_text=data.x_title,
                                range=[data.x_range[0] / data.scale, data.x_range[1] / data.scale])
        # binary units on the byte axis, as everywhere else (plotly's ".3s" would say "8.39MB")
        if data.y_range is not None:
            vals, text = binary_ticks(*data.y_range)
            fig.layout.yaxis.update(title_text=data.y_title, range=list(data.y_range), tickvals=vals,
                                    ticktext=text, autorange=False)
        else:
            top = max((float(np.nanmax(t["y"])) for t in data.traces if len(t.get("y", [])) and
                       t.get("type") == "scattergl"), default=1.0)
            vals, text = binary_ticks(0.0, top)
            fig.layout.yaxis.update(title_text=data.y_title, range=None, autorange=True, tickvals=vals,
                                    ticktext=text)


def status_html(state, geom, mask, data) -> str:
    """The status line for `state`: the device, how many blocks of `geom` the selection `mask` holds and
    their bytes, the time range shown; for the blocks view, how they were drawn."""
    lo, hi = geom.to_time(np.array(data.x_range), state.axis)
    text = (f"<b>{safe(state.device)}</b>: {int(mask.sum()):,} of {geom.n:,} blocks selected "
            f"({safe(format_bytes(float(geom.size[mask].sum())))} allocated in total), "
            f"{safe(format_ns(lo))} to {safe(format_ns(hi))}")
    if state.view == "blocks":
        text += (f"; {data.drawn:,} drawn one by one, {data.rastered:,} aggregated below pixel size, "
                 f"{data.accesses_shown:,} access marks")
        missing = int(np.isnan(geom.y0).sum())
        if missing:
            text += f"; {missing:,} blocks have no address (see the stacked view)"
    return text


def block_hover_text(trace, geom, positions, cache: dict) -> list[str]:
    """Hover text of blocks (positions in `geom`): id, size, category, op, then the allocation stack
    (Python frames innermost first, C++ frames folded), escaped; stacks are formatted once each (`cache`:
    stack id -> text, kept by the caller across calls)."""
    from memlens.analysis.peak_cause import stack_lines

    blocks = trace.blocks
    rows = geom.rows[positions]
    sids = blocks["stack_id"].to_numpy(dtype="float64", na_value=np.nan)[rows]
    out = []
    for p, r, sid in zip(positions, rows, sids):
        key = None if np.isnan(sid) else int(sid)
        if key not in cache:
            lines = stack_lines(trace.stacks, key, 10) if key is not None else []
            cache[key] = ("<br>stack:<br>" + "<br>".join(safe(ln) for ln in lines)) if lines else ""
        out.append(f"block {int(geom.block_id[p])}: {safe(format_bytes(geom.size[p]))}, "
                   f"{safe(blocks['category'].iat[r])} / {safe(blocks['op'].iat[r]) or '(unknown)'}{cache[key]}")
    return out


def show_figure(output: W.Output, fig, *more) -> None:
    """Show `fig` (and `more` figures below it) in `output` as plotly's JSON mime bundles (rendered by the
    notebook's plotly extension)."""
    output.outputs = tuple(
        {"output_type": "display_data", "metadata": {},
         "data": {"application/vnd.plotly.v1+json": json.loads(f.to_json()), "text/plain": "plotly figure"}}
        for f in (fig, *more))
