"""Plain figure functions returning plotly figures, for reports, notebooks and your own dashboards.

- `live_memory(trace, by="category")`: live bytes over time per device, stacked, peak marked
- `peak_composition(trace)`: what is live at each device's peak, by category and by module / op
- `timeline(trace)`: blocks as bars in time x address, small ones aggregated, accesses as marks
- `largest_blocks(trace)` / `largest_blocks_table(trace)`: the biggest blocks with attribution
- `ati_histogram(trace)` / `ati_ecdf(trace)`: access time intervals with the bandwidth threshold
- `diff_overlay(a, b)`: two runs' live memory on one axis
- `whatif_comparison(trace)`: bytes needed under each memory policy (allocator settings, plan, swapping)
- `allocator_timeline(trace)`: the simulated caching allocator's reserved / allocated bytes vs live bytes
- `swap_load_curves(plan)` / `swap_timeline(plan)` / `swap_priorities(plan)`: a `memlens.swap` plan's load
  curve beside the original, its copies on the two copy streams, and its candidates by DOA / AOA / WDOA

All accept the options documented on each function; `memlens.viz.lod` holds the level-of-detail
reductions (max-preserving decimation, rasterised aggregation, address-gap compression) they share.
Text taken from traces is HTML-escaped before it reaches a figure. plotly itself is imported only when a
figure is built.
"""
from __future__ import annotations

# bound eagerly: `timeline` is both a submodule and a function, and the function must win
from memlens.viz.allocator import allocator_timeline
from memlens.viz.ati import ati_ecdf, ati_histogram
from memlens.viz.diff import diff_overlay
from memlens.viz.live import live_memory, live_series
from memlens.viz.peak import peak_composition
from memlens.viz.tables import largest_blocks, largest_blocks_table
from memlens.viz.timeline import block_rects, timeline
from memlens.viz.swap import swap_load_curves, swap_priorities, swap_timeline
from memlens.viz.whatif import whatif_comparison

__all__ = ["allocator_timeline", "ati_ecdf", "ati_histogram", "block_rects", "diff_overlay", "largest_blocks",
           "largest_blocks_table", "live_memory", "live_series", "peak_composition", "swap_load_curves", "swap_priorities", "swap_timeline", "timeline",
           "whatif_comparison"]
