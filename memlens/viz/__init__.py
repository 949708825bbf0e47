"""Plain figure functions returning plotly figures, for reports, notebooks and your own dashboards.

- `live_memory(trace, by="category")`: live bytes over time per device, stacked, peak marked
- `timeline(trace)`: blocks as bars in time x address, small ones aggregated, accesses as marks
- `largest_blocks(trace)` / `largest_blocks_table(trace)`: the biggest blocks with attribution
- `ati_histogram(trace)` / `ati_ecdf(trace)`: access time intervals with the bandwidth threshold
- `diff_overlay(a, b)`: two runs' live memory on one axis

All accept the options documented on each function; `memlens.viz.lod` holds the level-of-detail
reductions (max-preserving decimation, rasterised aggregation, address-gap compression) they share.
Text taken from traces is HTML-escaped before it reaches a figure.
"""
from __future__ import annotations

_LAZY = {
    "live_memory": ("memlens.viz.live", "live_memory"),
    "live_series": ("memlens.viz.live", "live_series"),
    "timeline": ("memlens.viz.timeline", "timeline"),
    "block_rects": ("memlens.viz.timeline", "block_rects"),
    "largest_blocks": ("memlens.viz.tables", "largest_blocks"),
    "largest_blocks_table": ("memlens.viz.tables", "largest_blocks_table"),
    "ati_histogram": ("memlens.viz.ati", "ati_histogram"),
    "ati_ecdf": ("memlens.viz.ati", "ati_ecdf"),
    "diff_overlay": ("memlens.viz.diff", "diff_overlay"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'memlens.viz' has no attribute {name!r}")


__all__ = sorted(_LAZY)
