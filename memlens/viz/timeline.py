"""Blocks as bars in time x address, with level of detail, and accesses as marks.

Each block is a rectangle from its allocation to its free (x: wall-clock time, idle gaps visible, or the
event index) at its address (y: addresses with empty ranges shrunk by `lod.compress_gaps`; traces without
addresses stack each block on the bytes live when it was allocated). The `max_blocks` blocks with the largest
on-screen area are drawn one by one (hover shows their details); all others are painted into a pixel grid
(`lod.rasterize`) as a density layer, so nothing is dropped and the figure stays small for a million blocks.
"""
from __future__ import annotations

from memlens.clock import clock_label

import numpy as np
import pandas as pd

from memlens.viz.labels import binary_ticks, color_for, plot_text, safe_labels, time_axis
from memlens.viz.lod import compress_gaps, rasterize

WIDTH_PX, HEIGHT_PX = 1200, 480
GRID = (400, 160)  # density layer cells (x, y)


def block_rects(trace, device: str, x: str = "time", curve=None) -> pd.DataFrame:
    """One rectangle per block of `device`: ``x0``/``x1`` (ns or event index), ``y0``/``y1`` (display
    coordinate, bytes) plus ``block_id``, ``size``, ``addr``, ``category``, ``op``, ``module``.

    ``attrs["y_mode"]`` says whether y is "address" (gap-compressed) or "stacked" (no addresses).
    `curve` is ``trace.live_bytes(device)`` when the caller already has it.
    """
    time_axis(x)
    curve = trace.live_bytes(device) if curve is None else curve
    blocks = trace.lifetimes(device)
    n_events = len(curve)
    ids = curve["block_id"].to_numpy()
    # first and last event of each block in the device's event order (a block never freed has one event)
    uniq, first = np.unique(ids, return_index=True)
    _, last_rev = np.unique(ids[::-1], return_index=True)
    last = n_events - 1 - last_rev
    pos = pd.Index(uniq).get_indexer(blocks["block_id"].to_numpy())
    first_ev, last_ev = first[pos], last[pos]
    freed = blocks["free_ns"].notna().to_numpy()
    if x == "time":
        x0 = blocks["start_ns"].to_numpy(dtype=np.float64)
        x1 = blocks["end_ns"].to_numpy(dtype=np.float64)
    else:
        x0 = first_ev.astype(np.float64)
        x1 = np.where(freed & (last_ev > first_ev), last_ev, n_events).astype(np.float64)
    size = blocks["size"].to_numpy(dtype=np.float64)
    has_addr = blocks["addr"].notna().all() and len(blocks)
    if has_addr:
        y0, info = compress_gaps(blocks["addr"].to_numpy(dtype=np.float64), size)
        y_mode = "address"
    else:
        live = curve["live"].to_numpy(dtype=np.float64)
        y0 = live[first_ev] - size
        info = {}
        y_mode = "stacked"
    out = pd.DataFrame({"block_id": blocks["block_id"].to_numpy(), "x0": x0, "x1": np.maximum(x1, x0),
                        "y0": y0, "y1": y0 + size, "size": blocks["size"].to_numpy(),
                        "addr": blocks["addr"].to_numpy(), "category": blocks["category"].to_numpy(),
                        "op": blocks["op"].to_numpy(), "module": blocks["module"].to_numpy(),
                        "stack_id": pd.array(blocks["stack_id"], dtype="Int64")})
    out.attrs["y_mode"] = y_mode
    out.attrs["regions"] = info
    return out


def _pick_drawn(rects: pd.DataFrame, max_blocks: int) -> np.ndarray:
    """Mask of the `max_blocks` blocks drawn one by one: largest screen area first (a sub-pixel bar still
    shows when the reader zooms in; everything beyond the cap goes to the density layer)."""
    if len(rects) == 0:
        return np.zeros(0, dtype=bool)
    xs = max(rects["x1"].max() - rects["x0"].min(), 1.0)
    ys = max(rects["y1"].max() - rects["y0"].min(), 1.0)
    w_px = (rects["x1"] - rects["x0"]).to_numpy() / xs * WIDTH_PX
    h_px = (rects["y1"] - rects["y0"]).to_numpy() / ys * HEIGHT_PX
    area = w_px * h_px
    drawn = np.zeros(len(rects), dtype=bool)
    k = min(max_blocks, len(rects))
    if k > 0:
        drawn[np.argpartition(-area, k - 1)[:k]] = True
    return drawn


def _access_marks(trace, rects: pd.DataFrame, curve: pd.DataFrame, x: str, max_marks: int):
    """(x, y) of the accesses of the drawn blocks, one per pixel cell when there are more than `max_marks`."""
    acc = trace.accesses
    if len(acc) == 0 or len(rects) == 0:
        return np.zeros(0), np.zeros(0)
    pos = pd.Index(rects["block_id"].to_numpy()).get_indexer(acc["block_id"].to_numpy())
    hit = pos >= 0
    pos = pos[hit]
    t = acc["t_ns"].to_numpy(dtype=np.float64)[hit]
    if x == "event":
        curve_t = curve["t_ns"].to_numpy(dtype=np.float64)
        t = np.searchsorted(curve_t, t, side="right").astype(np.float64) - 0.5
    y = ((rects["y0"].to_numpy() + rects["y1"].to_numpy()) / 2)[pos]
    if len(t) > max_marks:
        xs = max(np.ptp(t), 1.0)
        ys = max(np.ptp(y), 1.0)
        cell = (np.floor((t - t.min()) / xs * WIDTH_PX) * (HEIGHT_PX + 1) +
                np.floor((y - y.min()) / ys * HEIGHT_PX)).astype(np.int64)
        _, keep = np.unique(cell, return_index=True)
        t, y = t[keep], y[keep]
    return t, y


def timeline(trace, device: str | None = None, x: str = "time", color_by: str = "category",
             max_blocks: int = 4000, accesses: bool = True, max_access_marks: int = 20000, top_groups: int = 10,
             curve=None):
    """Figure: the blocks of `device` (default: the one with the highest peak) in time x address.

    `x` is "time" (unit chosen by the trace's span) or "event" (event index); `color_by` a block column (category, module, op);
    `max_blocks` caps the individually drawn bars (the rest form the density layer); `accesses` adds a
    mark per access of drawn blocks (reduced to one per pixel above `max_access_marks`); `curve` is
    ``trace.live_bytes(device)`` when the caller already has it.
    """
    import plotly.graph_objects as go

    from memlens.units import format_bytes

    if device is None:
        peaks = trace.peak_live_bytes()
        device = max(peaks, key=peaks.get) if peaks else None
    scale, x_title = time_axis(x, span_ns=trace.duration_ns, clock=clock_label(trace))
    fig = go.Figure()
    if device is None:
        fig.update_layout(title="no blocks")
        return fig
    curve = trace.live_bytes(device) if curve is None else curve
    rects = block_rects(trace, device, x, curve=curve)
    drawn = _pick_drawn(rects, max_blocks)
    rest = rects[~drawn]
    if len(rest):
        x_edges = np.linspace(rects["x0"].min(), max(rects["x1"].max(), rects["x0"].min() + 1), GRID[0] + 1)
        y_edges = np.linspace(rects["y0"].min(), max(rects["y1"].max(), rects["y0"].min() + 1), GRID[1] + 1)
        dens = rasterize(rest["x0"], rest["x1"], rest["y0"], rest["y1"], x_edges, y_edges).astype(np.float32)
        dens[dens <= 0] = np.nan
        fig.add_trace(go.Heatmap(
            z=dens, x=((x_edges[:-1] + x_edges[1:]) / 2) / scale, y=(y_edges[:-1] + y_edges[1:]) / 2,
            colorscale=[[0, "rgb(220,220,220)"], [1, "rgb(60,60,60)"]], zmin=0, zmax=1, showscale=False,
            name=f"{len(rest):,} small blocks (density)", showlegend=True,
            hovertemplate="covered %{z:.0%} by small blocks<extra></extra>"))
    shown = rects[drawn]
    labels = safe_labels(shown[color_by]) if len(shown) else np.array([], dtype=object)
    counts = pd.Series(labels).value_counts()
    own = set(counts.index[:top_groups])
    groups = np.where(pd.Series(labels).isin(own).to_numpy(), labels, "other") if len(shown) else labels
    size_txt = np.array([format_bytes(s) for s in shown["size"].to_numpy()], dtype=object)
    custom = np.stack([shown["block_id"].to_numpy().astype(str), size_txt, safe_labels(shown["category"]),
                       safe_labels(shown["op"]), safe_labels(shown["module"]), _stack_hover(trace, shown)],
                      axis=1) if len(shown) else None
    for i, group in enumerate(pd.unique(groups)):
        m = groups == group
        g = shown[m]
        fig.add_trace(go.Bar(
            orientation="h", base=g["x0"].to_numpy() / scale, x=(g["x1"] - g["x0"]).to_numpy() / scale,
            y=((g["y0"] + g["y1"]) / 2).to_numpy(), width=(g["y1"] - g["y0"]).to_numpy(), name=str(group),
            marker=dict(color=color_for(str(group), i, color_by), line=dict(width=0)), customdata=custom[m],
            hovertemplate=("block %{customdata[0]}: %{customdata[1]}<br>%{customdata[2]} / "
                           "%{customdata[3]}<br>%{customdata[4]}%{customdata[5]}<extra></extra>")))
    if accesses:
        ax, ay = _access_marks(trace, shown, curve, x, max_access_marks)
        if len(ax):
            fig.add_trace(go.Scattergl(x=ax / scale, y=ay, mode="markers", name="accesses",
                                       marker=dict(size=3, color="black", opacity=0.6), hoverinfo="skip"))
    y_title = ("address (empty ranges between regions shrunk; ticks at region starts)"
               if rects.attrs["y_mode"] == "address"
               else "bytes live below the block at allocation (no addresses in trace)")
    fig.update_layout(barmode="overlay", bargap=0, height=HEIGHT_PX + 120, margin=dict(l=60, r=20, t=40, b=50),
                      title=f"{plot_text(device)}: {len(shown):,} blocks drawn, {len(rest):,} aggregated",
                      legend=dict(title_text=plot_text(color_by)), xaxis_title=x_title)
    if rects.attrs["y_mode"] == "address":
        vals, text = _address_ticks(rects.attrs["regions"])
        fig.update_yaxes(title_text=y_title, tickvals=vals, ticktext=text)
    else:
        vals, text = binary_ticks(0.0, float(rects["y1"].max()) if len(rects) else 1.0)
        fig.update_yaxes(title_text=y_title, tickvals=vals, ticktext=text)
    return fig


def _address_ticks(regions: dict, max_ticks: int = 12) -> tuple[list[float], list[str]]:
    """Tick positions at the start of address regions (at most `max_ticks`, evenly spread), labelled with the
    real address in hex, so the compressed axis still reads as addresses."""
    ys = np.asarray(regions.get("region_y", []), dtype=np.float64)
    addrs = np.asarray(regions.get("region_addr", []), dtype=np.float64)
    if len(ys) == 0:
        return [], []
    pick = np.unique(np.linspace(0, len(ys) - 1, min(max_ticks, len(ys))).round().astype(np.int64))
    return ys[pick].tolist(), [f"0x{int(a):x}" for a in addrs[pick]]


HOVER_FRAMES = 8


def _stack_hover(trace, shown: pd.DataFrame) -> np.ndarray:
    """Hover text of each drawn block's allocation stack: "<br>" then Python frames innermost first, C++
    frames folded (`memlens.analysis.peak_cause.stack_lines`), escaped; "" for blocks without a stack."""
    from memlens.analysis.peak_cause import stack_lines

    out = np.full(len(shown), "", dtype=object)
    if trace.stacks is None or "stack_id" not in shown.columns or len(shown) == 0:
        return out
    sid = pd.array(shown["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    for s in np.unique(sid[sid >= 0]):
        lines = safe_labels(pd.Series(stack_lines(trace.stacks, int(s), HOVER_FRAMES), dtype=object))
        out[sid == s] = "<br>stack:<br>" + "<br>".join(lines) if len(lines) else ""
    return out
