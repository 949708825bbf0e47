"""Figure data of the explorer's timeline for a given state and view: plotly trace dicts, screen-sized.

Two views of one device:
- ``blocks``: every selected block as a rectangle in time (or event index) x compacted address; blocks big
  enough on screen are WebGL polygons (one trace per colour group), the rest a coverage raster (one heatmap
  trace, which also receives clicks anywhere in the plot); accesses of the drawn blocks as marks (reads and
  writes, one mark per pixel at most).
- ``stacked``: live bytes over time stacked by colour group (one filled WebGL trace per group).

Trace names and hover text from the trace are escaped (`memlens.viz.labels.safe`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from memlens.units import format_bytes
from memlens.viz.labels import safe, time_axis
from memlens.widgets.geometry import BlockGeometry
from memlens.widgets.lod import dedupe_pixels, rectangles_lod, stacked_live, visible
from memlens.widgets.state import ExplorerState

PLOT_WIDTH_PX, PLOT_HEIGHT_PX = 660, 360   # plot area (inside the margins) that LOD is computed for


@dataclass
class AccessMarks:
    """Accesses of one device's blocks: geometry position, time (ns), write flag, op; the event-index
    coordinate is computed on first use of that axis."""

    pos: np.ndarray
    t_ns: np.ndarray
    is_write: np.ndarray
    op_id: np.ndarray
    geom: BlockGeometry = field(repr=False)
    _event: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def of(cls, trace, geom: BlockGeometry) -> "AccessMarks":
        """The accesses in `trace` that touch `geom`'s blocks."""
        acc = trace.accesses
        order = np.argsort(geom.block_id, kind="stable")
        ids = acc["block_id"].to_numpy(dtype=np.int64)
        hit = np.zeros(len(ids), dtype=bool)
        where = np.zeros(len(ids), dtype=np.int64)
        if len(order):
            sorted_ids = geom.block_id[order]
            where = np.clip(np.searchsorted(sorted_ids, ids), 0, len(order) - 1)
            hit = sorted_ids[where] == ids
        t = acc["t_ns"].to_numpy(dtype=np.float64)[hit]
        return cls(pos=order[where[hit]] if len(order) else np.zeros(0, np.int64), t_ns=t,
                   is_write=acc["is_write"].to_numpy(dtype=bool)[hit],
                   op_id=acc["op_id"].to_numpy(dtype=np.int64)[hit], geom=geom)

    def x(self, axis: str) -> np.ndarray:
        """Access coordinates on `axis`."""
        if axis == "time":
            return self.t_ns
        if self._event is None:
            self._event = self.geom.time_to_event(self.t_ns)
        return self._event


@dataclass
class TimelineData:
    """What the timeline figure shows: trace dicts plus the numbers the widget reports and hit-tests with."""

    traces: list = field(default_factory=list)
    x_range: tuple[float, float] = (0.0, 1.0)   # raw axis units (ns or event index)
    y_range: tuple[float, float] | None = None
    scale: float = 1.0                          # divide raw x by this for the figure (ns -> ms)
    x_title: str = ""
    y_title: str = ""
    drawn: int = 0
    rastered: int = 0
    accesses_shown: int = 0
    cell: tuple[float, float] = (1.0, 1.0)      # raster cell size in raw units (x, y)


def _rgba(hex_colour: str, alpha: float) -> str:
    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha:.2f})"


def band_colourscale(colours: list[str]) -> list:
    """Colourscale (zmin 0, zmax len(colours) + 1) for rasters valued 0 (empty: transparent) or
    ``1 + group + 0.15 + 0.8 * coverage``: each group's band fades in with coverage."""
    n = len(colours) + 1
    stops = [[0.0, "rgba(0,0,0,0)"], [0.999 / n, "rgba(0,0,0,0)"]]
    for g, colour in enumerate(colours):
        stops.append([(g + 1) / n, _rgba(colour, 0.15)])
        stops.append([(g + 1.999) / n, _rgba(colour, 0.95)])
    stops.append([1.0, stops[-1][1]])
    return stops


def default_ranges(geom: BlockGeometry, axis: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """The whole device: x over every lifetime, y over the compacted address span."""
    return geom.full_x_range(axis), (0.0, max(geom.address_span, 1.0))


HOVER_BLOCKS = 3000


def blocks_view(geom: BlockGeometry, marks: AccessMarks | None, state: ExplorerState, mask: np.ndarray,
                group: np.ndarray, names: list[str], colours: list[str],
                width_px: int = PLOT_WIDTH_PX, height_px: int = PLOT_HEIGHT_PX, hover=None) -> TimelineData:
    """Blocks as rectangles in time x address for the selected blocks (`mask`) in the state's ranges.

    `hover(positions)` (positions in `geom`) returns the hover text of the blocks drawn one by one (their
    stacks, escaped): an invisible marker at the middle of each block's visible part shows it."""
    scale, x_title = time_axis(state.axis, clock=geom.clock or None)
    full_x, full_y = default_ranges(geom, state.axis)
    x_range = state.x_range or full_x
    y_range = state.y_range or full_y
    sel = np.flatnonzero(mask)
    x0, x1 = geom.x0(state.axis)[sel], geom.x1(state.axis)[sel]
    y0 = geom.y0[sel]
    y1 = y0 + geom.size[sel]
    lod = rectangles_lod(x0, x1, y0, y1, group[sel], len(names), x_range, y_range, width_px, height_px)
    nx, ny = lod.raster.shape[1], lod.raster.shape[0]
    traces = [dict(type="heatmap", name="small blocks (coverage)", x=lod.raster_x / scale, y=lod.raster_y,
                   z=lod.raster, zmin=0, zmax=len(names) + 1, colorscale=band_colourscale(colours),
                   showscale=False, hoverongaps=True, hoverinfo="none", showlegend=False)]
    for g, (name, colour) in enumerate(zip(names, colours)):
        px, py = lod.polygons.get(g, (np.zeros(0), np.zeros(0)))
        traces.append(dict(type="scattergl", mode="lines", name=safe(name), x=px / scale, y=py,
                           fill="toself", fillcolor=_rgba(colour, 0.85),
                           line=dict(color="rgba(255,255,255,0.9)", width=0.5),
                           hoverinfo="skip", legendgroup=safe(name)))
    if hover is not None:
        # the blocks drawn one by one, and the largest in view even when they are thinner than a pixel (a
        # multi-GiB device draws most blocks into the raster): at most HOVER_BLOCKS markers
        in_view = np.flatnonzero(visible(x0, x1, y0, y1, x_range, y_range) & np.isfinite(y0))
        biggest = in_view[np.argsort(-geom.size[sel[in_view]], kind="stable")[:HOVER_BLOCKS]]
        pos = sel[np.union1d(lod.drawn, biggest).astype(np.int64)]
        cx = (np.clip(geom.x0(state.axis)[pos], *x_range) + np.clip(geom.x1(state.axis)[pos], *x_range)) / 2
        cy = geom.y0[pos] + geom.size[pos] / 2
        traces.append(dict(type="scattergl", mode="markers", name="block details (hover)", x=cx / scale, y=cy,
                           marker=dict(size=10, color="rgba(0,0,0,0)"), text=list(hover(pos)),
                           hovertemplate="%{text}<extra></extra>", showlegend=False))
    shown = 0
    for is_write, label, colour in ((False, "reads", "#222222"), (True, "writes", "#d00000")):
        ax, ay = np.zeros(0), np.zeros(0)
        if marks is not None and len(lod.drawn):
            drawn_blocks = np.zeros(geom.n, dtype=bool)
            drawn_blocks[sel[lod.drawn]] = True
            pick = np.flatnonzero(drawn_blocks[marks.pos] & (marks.is_write == is_write))
            ax = marks.x(state.axis)[pick]
            ay = geom.y0[marks.pos[pick]] + geom.size[marks.pos[pick]] / 2
            keep = dedupe_pixels(ax, ay, x_range, y_range, width_px, height_px)
            ax, ay = ax[keep], ay[keep]
        shown += len(ax)
        traces.append(dict(type="scattergl", mode="markers", name=f"accesses ({label})", x=ax / scale, y=ay,
                           marker=dict(size=3, color=colour, symbol="line-ns-open" if is_write else "circle"),
                           hoverinfo="skip"))
    return TimelineData(traces=traces, x_range=tuple(x_range), y_range=tuple(y_range), scale=scale,
                        x_title=x_title, y_title="address (empty ranges shrunk)", drawn=len(lod.drawn),
                        rastered=lod.rastered, accesses_shown=shown,
                        cell=((x_range[1] - x_range[0]) / nx, (y_range[1] - y_range[0]) / ny))


def live_events(geom: BlockGeometry, mask: np.ndarray, axis: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Alloc/free events of the selected blocks sorted on `axis`: (x, delta bytes, block position)."""
    x, delta, pos = geom.sorted_events(axis)
    keep = mask[pos]
    return x[keep], delta[keep], pos[keep]


def stacked_view(geom: BlockGeometry, state: ExplorerState, mask: np.ndarray, group: np.ndarray,
                 names: list[str], colours: list[str], width_px: int = PLOT_WIDTH_PX) -> TimelineData:
    """Live bytes over time, stacked by colour group, for the selected blocks."""
    scale, x_title = time_axis(state.axis, clock=geom.clock or None)
    x_range = state.x_range or geom.full_x_range(state.axis)
    x, delta, pos = live_events(geom, mask, state.axis)
    xs, live = stacked_live(x, delta, group[pos], len(names), x_range, width_px)
    stacked = np.cumsum(live, axis=0)
    traces = []
    for g, (name, colour) in enumerate(zip(names, colours)):
        traces.append(dict(type="scattergl", mode="lines", name=safe(name), x=xs / scale, y=stacked[g],
                           fill="tozeroy" if g == 0 else "tonexty", fillcolor=_rgba(colour, 0.7),
                           line=dict(color=colour, width=1),
                           # binary units, as everywhere else (plotly's ".4s" would say "8.389MB")
                           customdata=np.array([format_bytes(v) for v in live[g]], dtype=object),
                           hovertemplate=f"{safe(name)}: %{{customdata}}<extra></extra>"))
    total = stacked[-1] if len(stacked) else np.zeros(0)
    if len(total):
        i = int(np.argmax(total))
        traces.append(dict(type="scattergl", mode="markers+text", name="peak", x=[xs[i] / scale], y=[total[i]],
                           text=[f"peak {format_bytes(int(total[i]))}"],
                           textposition="top center", marker=dict(size=9, color="black", symbol="x"),
                           hoverinfo="skip"))
    return TimelineData(traces=traces, x_range=tuple(x_range), y_range=None, scale=scale, x_title=x_title,
                        y_title="live bytes", drawn=int(mask.sum()), rastered=0,
                        cell=((x_range[1] - x_range[0]) / max(width_px, 1), 1.0))
