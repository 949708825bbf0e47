"""Level of detail for the explorer: figure data whose size depends on the screen, not on the trace.

A block rectangle (x = lifetime, y = address range) is drawn as its own polygon when it is at least
`min_px` pixels in both directions in the current view; everything smaller is rasterised into a coverage
grid of `cell_px`-pixel cells, coloured by the group that covers most of each cell with an opacity that
grows with the covered fraction. Blocks sharing an address at the same time cannot exist, so the polygons
that can be at least a few pixels in both directions are bounded by the plot's area; `max_polygons` only
raises `min_px` further when a view would still need more (those blocks move into the raster, zooming in
brings them back). Nothing is dropped: every selected block is a polygon or part of the raster.

Live memory over time keeps a few events per pixel column, always including each column's maximum, so
every peak survives the reduction exactly. The primitives come from `memlens.viz.lod`; this module decides
what is in view and at which resolution.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class RectLOD:
    """Figure data of one blocks view.

    polygons: per group index, (x, y) float arrays of closed rectangles separated by NaN.
    drawn: positions (into the geometry) of the blocks drawn as polygons.
    raster: (ny, nx), 0 where empty, else ``1 + group + 0.15 + 0.8 * coverage`` rounded to 0.01 (no NaN:
        2-D arrays reach the browser as JSON, which has no NaN).
    raster_x / raster_y: cell centres; rastered: how many blocks went into the raster.
    """

    polygons: dict
    drawn: np.ndarray
    raster: np.ndarray
    raster_x: np.ndarray
    raster_y: np.ndarray
    rastered: int
    min_px: float


def visible(x0, x1, y0, y1, x_range, y_range) -> np.ndarray:
    """Mask of rectangles that intersect the view."""
    return (x1 > x_range[0]) & (x0 < x_range[1]) & (y1 > y_range[0]) & (y0 < y_range[1])


def _pixel_extent(x0, x1, y0, y1, x_range, y_range, width_px, height_px):
    """Clipped width and height of each rectangle in pixels."""
    sx = width_px / (x_range[1] - x_range[0])
    sy = height_px / (y_range[1] - y_range[0])
    w = (np.minimum(x1, x_range[1]) - np.maximum(x0, x_range[0])) * sx
    h = (np.minimum(y1, y_range[1]) - np.maximum(y0, y_range[0])) * sy
    return w, h


def rectangle_polygons(x0, x1, y0, y1) -> tuple[np.ndarray, np.ndarray]:
    """NaN-separated closed rectangles (6 points each) for a scattergl trace with fill='toself'."""
    n = len(x0)
    xs = np.empty((n, 6))
    ys = np.empty((n, 6))
    xs[:, 0], xs[:, 1], xs[:, 2], xs[:, 3], xs[:, 4], xs[:, 5] = x0, x1, x1, x0, x0, np.nan
    ys[:, 0], ys[:, 1], ys[:, 2], ys[:, 3], ys[:, 4], ys[:, 5] = y0, y0, y1, y1, y0, np.nan
    return xs.ravel(), ys.ravel()


def coverage_raster(x0, x1, y0, y1, group, n_groups, x_range, y_range, nx, ny):
    """Per-group covered fraction of each cell of an (ny, nx) grid over the view, shape (n_groups, ny, nx).

    Rectangles are clipped to the view first, then painted with `memlens.viz.lod.rasterize` (each spreads
    its area evenly over the cells it touches, so covered area is exact).
    """
    from memlens.viz.lod import rasterize
    out = np.zeros((n_groups, ny, nx))
    x_edges = np.linspace(x_range[0], x_range[1], nx + 1)
    y_edges = np.linspace(y_range[0], y_range[1], ny + 1)
    cx0, cx1 = np.maximum(x0, x_range[0]), np.minimum(x1, x_range[1])
    cy0, cy1 = np.maximum(y0, y_range[0]), np.minimum(y1, y_range[1])
    for g in np.unique(group):
        pick = group == g
        out[g] = rasterize(cx0[pick], cx1[pick], cy0[pick], cy1[pick], x_edges, y_edges)
    return out


def rectangles_lod(x0, x1, y0, y1, group, n_groups, x_range, y_range, width_px=900, height_px=380,
                   min_px=2.0, cell_px=3, max_polygons=40_000) -> RectLOD:
    """Split the rectangles in view into polygons (big enough to see) and a coverage raster (the rest).

    Inputs are aligned arrays (coordinates on the current axes, `group` an int colour group per block);
    see the module docstring for the rules. All rectangles outside the view are ignored.
    """
    in_view = np.flatnonzero(visible(x0, x1, y0, y1, x_range, y_range) & np.isfinite(y0))
    w, h = _pixel_extent(x0[in_view], x1[in_view], y0[in_view], y1[in_view], x_range, y_range,
                         width_px, height_px)
    extent = np.minimum(w, h)
    threshold = float(min_px)
    big = extent >= threshold
    if big.sum() > max_polygons:   # keep the payload bounded: raise the bar to the max_polygons-th largest
        threshold = float(np.partition(extent, len(extent) - max_polygons)[len(extent) - max_polygons])
        big = extent > threshold
    drawn = in_view[big]
    small = in_view[~big]
    polygons = {}
    for g in np.unique(group[drawn]):
        pick = drawn[group[drawn] == g]
        polygons[int(g)] = rectangle_polygons(x0[pick], x1[pick], y0[pick], y1[pick])
    nx = max(int(width_px // cell_px), 1)
    ny = max(int(height_px // cell_px), 1)
    cover = coverage_raster(x0[small], x1[small], y0[small], y1[small], group[small], max(n_groups, 1),
                            x_range, y_range, nx, ny)
    total = cover.sum(axis=0)
    dominant = cover.argmax(axis=0)
    raster = np.round(np.where(total > 1e-9, 1.15 + dominant + 0.8 * np.clip(total, 0, 1), 0.0), 2)
    xs = x_range[0] + (np.arange(nx) + 0.5) * (x_range[1] - x_range[0]) / nx
    ys = y_range[0] + (np.arange(ny) + 0.5) * (y_range[1] - y_range[0]) / ny
    return RectLOD(polygons=polygons, drawn=drawn, raster=raster, raster_x=xs, raster_y=ys,
                   rastered=int(len(small)), min_px=threshold)


def stacked_live(x: np.ndarray, delta: np.ndarray, group: np.ndarray, n_groups: int, x_range,
                 width_px: int = 900) -> tuple[np.ndarray, np.ndarray]:
    """Live bytes per group over time inside `x_range`, reduced per pixel column.

    `x`, `delta` (bytes, + alloc / - free) and `group` describe alloc/free events sorted by x. The total is
    reduced with `memlens.viz.lod.extrema_indices` (each column keeps its first, last, min and max event, so
    the peak survives), plus the last event before the range so the curve starts at the right level.
    Returns (xs, live) with live of shape (n_groups, len(xs)); sums over groups are the exact totals.
    """
    from memlens.viz.lod import extrema_indices
    total = np.cumsum(delta)
    lo = int(np.searchsorted(x, x_range[0], side="left"))
    hi = int(np.searchsorted(x, x_range[1], side="right"))
    inside = extrema_indices(x[lo:hi], total[lo:hi], max(int(width_px), 1)) + lo
    keep = np.concatenate([[lo - 1], inside]).astype(np.int64) if lo > 0 else inside.astype(np.int64)
    live = np.zeros((n_groups, len(keep)))
    for g in range(n_groups):
        live[g] = np.cumsum(np.where(group == g, delta, 0.0))[keep]
    xs = np.clip(x[keep], x_range[0], x_range[1])
    return xs, live


def dedupe_pixels(x: np.ndarray, y: np.ndarray, x_range, y_range, width_px: int, height_px: int) -> np.ndarray:
    """Indices of points to draw: one per occupied pixel within the view (marks smaller than a pixel)."""
    inside = np.flatnonzero((x >= x_range[0]) & (x <= x_range[1]) & (y >= y_range[0]) & (y <= y_range[1]))
    if len(inside) == 0:
        return inside
    px = ((x[inside] - x_range[0]) / (x_range[1] - x_range[0]) * width_px).astype(np.int64)
    py = ((y[inside] - y_range[0]) / (y_range[1] - y_range[0]) * height_px).astype(np.int64)
    key = px * (height_px + 1) + py
    order = np.argsort(key, kind="stable")
    first = order[np.concatenate([[True], key[order][1:] != key[order][:-1]])]   # first point of each pixel
    return inside[np.sort(first)]
