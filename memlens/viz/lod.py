"""Level of detail: reduce big traces to what a screen can show without losing what matters.

Three reductions, all vectorised:

- `extrema_indices`: decimate a curve (e.g. live bytes after each of millions of events) into pixel-wide
  bins, keeping each bin's first, last, minimum and maximum point. The global maximum, the peak, is therefore
  always kept, which plain stride sampling does not guarantee.
- `rasterize`: paint rectangles (blocks in time x address) that are too small to draw one by one into a
  pixel grid, each spreading its area evenly over the cells it touches, so the grid holds the fraction of each
  cell that is covered.
- `compress_gaps`: map sparse addresses (a CPU heap next to mmap regions terabytes away) onto a dense axis
  by shrinking every empty range between occupied regions to a fixed gap.
"""
from __future__ import annotations

import numpy as np


def extrema_indices(x: np.ndarray, y: np.ndarray, bins: int) -> np.ndarray:
    """Sorted indices of the points to keep so that a plot of `y` over `x` looks the same at `bins` pixels.

    `x` must be non-decreasing. Each of `bins` equal-width bins of `x` keeps its first, last, argmin and
    argmax point (at most ``4 * bins`` points in all); the global argmax is always among them. When the curve
    already has no more than ``4 * bins`` points every index is returned.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = len(x)
    if n <= 4 * max(bins, 1):
        return np.arange(n)
    lo, hi = x[0], x[-1]
    width = (hi - lo) / bins if hi > lo else 1.0
    b = np.minimum(((x - lo) / width).astype(np.int64), bins - 1)
    idx = np.arange(n)
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])  # x sorted -> bins are contiguous runs
    ends = np.r_[starts[1:], n] - 1
    argmax = np.maximum.reduceat(y, starts)
    argmin = np.minimum.reduceat(y, starts)
    # first index in each run where y reaches the run's max / min
    run = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))
    at_max = y == argmax[run]
    at_min = y == argmin[run]
    first_max = np.full(len(starts), n)
    first_min = np.full(len(starts), n)
    np.minimum.at(first_max, run[at_max], idx[at_max])
    np.minimum.at(first_min, run[at_min], idx[at_min])
    keep = np.unique(np.concatenate([starts, ends, first_max, first_min, [int(np.argmax(y))]]))
    return keep


def rasterize(x0, x1, y0, y1, x_edges: np.ndarray, y_edges: np.ndarray) -> np.ndarray:
    """Fraction of each grid cell covered by the rectangles ``[x0, x1) x [y0, y1)``.

    Returns an array of shape ``(len(y_edges) - 1, len(x_edges) - 1)`` (rows are y, as a heatmap wants).
    Each rectangle touches at least one cell and spreads its area evenly over the cells it touches, so the
    total painted area equals the rectangles' area (clipped to the grid). Uses a 2-D difference array:
    O(rectangles + cells).
    """
    x0, x1, y0, y1 = (np.asarray(v, dtype=np.float64) for v in (x0, x1, y0, y1))
    nx, ny = len(x_edges) - 1, len(y_edges) - 1
    grid = np.zeros((ny + 1, nx + 1))
    if len(x0) == 0 or nx <= 0 or ny <= 0:
        return grid[:ny, :nx]
    cw = (x_edges[-1] - x_edges[0]) / nx
    ch = (y_edges[-1] - y_edges[0]) / ny
    ix0 = np.clip(np.floor((x0 - x_edges[0]) / cw), 0, nx - 1).astype(np.int64)
    ix1 = np.clip(np.ceil((x1 - x_edges[0]) / cw), 1, nx).astype(np.int64)
    iy0 = np.clip(np.floor((y0 - y_edges[0]) / ch), 0, ny - 1).astype(np.int64)
    iy1 = np.clip(np.ceil((y1 - y_edges[0]) / ch), 1, ny).astype(np.int64)
    ix1 = np.maximum(ix1, ix0 + 1)
    iy1 = np.maximum(iy1, iy0 + 1)
    area = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None) / (cw * ch)
    per_cell = area / ((ix1 - ix0) * (iy1 - iy0))
    np.add.at(grid, (iy0, ix0), per_cell)
    np.add.at(grid, (iy0, ix1), -per_cell)
    np.add.at(grid, (iy1, ix0), -per_cell)
    np.add.at(grid, (iy1, ix1), per_cell)
    return grid.cumsum(axis=0).cumsum(axis=1)[:ny, :nx]


def compress_gaps(start: np.ndarray, size: np.ndarray, gap: float | None = None) -> tuple[np.ndarray, dict]:
    """Dense coordinates for address ranges ``[start, start + size)``.

    Ranges that overlap or touch form one region; regions are laid out in address order, separated by
    `gap` (default: 2% of the total occupied span, at least 1). Returns ``(y, info)``: `y` the new start of
    each range (same order as given) and `info` with ``regions`` (count), ``region_addr`` / ``region_y``
    (start of each region in address and in the new coordinate, for tick labels) and ``span``.
    """
    start = np.asarray(start, dtype=np.float64)
    size = np.asarray(size, dtype=np.float64)
    n = len(start)
    if n == 0:
        return np.zeros(0), {"regions": 0, "region_addr": np.zeros(0), "region_y": np.zeros(0), "span": 0.0}
    order = np.argsort(start, kind="stable")
    s, e = start[order], start[order] + size[order]
    reach = np.maximum.accumulate(e)
    new_region = np.r_[True, s[1:] > reach[:-1]]
    region = np.cumsum(new_region) - 1
    region_start = s[new_region]
    region_end = np.maximum.reduceat(e, np.flatnonzero(new_region))
    lengths = region_end - region_start
    if gap is None:
        gap = max(float(lengths.sum()) * 0.02, 1.0)
    region_y = np.r_[0.0, np.cumsum(lengths + gap)[:-1]]
    y = np.empty(n)
    y[order] = s - region_start[region] + region_y[region]
    info = {"regions": int(len(region_start)), "region_addr": region_start, "region_y": region_y,
            "span": float(region_y[-1] + lengths[-1])}
    return y, info
