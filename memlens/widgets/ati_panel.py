"""The explorer's ATI panel: access time intervals of the current selection, split by the bandwidth filter.

An interval counts for the selection when its block is selected and the interval overlaps the time range.
Each interval is swappable or filtered out at the chosen link (`memlens.analysis.swappable.bandwidth_filter`:
length >= the block's round trip out and back in), which is the observation of Li et al. that most ATIs
are too short to hide a transfer. The figures are `memlens.viz.ati_histogram` / `ati_ecdf`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.swappable import bandwidth_filter, filter_summary
from memlens.units import format_bytes, format_ns, format_share
from memlens.viz.labels import safe
from memlens.widgets.geometry import BlockGeometry


def selection_intervals(intervals: pd.DataFrame, geom: BlockGeometry, mask: np.ndarray,
                        t_range_ns: tuple[float, float] | None) -> pd.DataFrame:
    """Rows of `intervals` (from `access_intervals`) whose block is selected and that overlap the range (ns)."""
    selected_ids = geom.block_id[mask]
    keep = np.isin(intervals["block_id"].to_numpy(dtype=np.int64), selected_ids)
    if t_range_ns is not None:
        keep &= (intervals["end_ns"].to_numpy(dtype=np.float64) >= t_range_ns[0]) & \
                (intervals["start_ns"].to_numpy(dtype=np.float64) <= t_range_ns[1])
    return intervals[keep]


def filtered_intervals(intervals: pd.DataFrame, bandwidth) -> pd.DataFrame:
    """`bandwidth_filter` of the selection's intervals at `bandwidth` (preset name, '25GB/s' or a model)."""
    return bandwidth_filter(intervals, bandwidth)


def ati_figure(intervals: pd.DataFrame, bandwidth, as_ecdf: bool = False):
    """The panel's figure for the selection's intervals: `memlens.viz.ati_histogram` or `ati_ecdf`."""
    from memlens.viz.ati import ati_ecdf, ati_histogram
    fig = ati_ecdf(intervals, bandwidth) if as_ecdf else ati_histogram(intervals, bandwidth)
    fig.update_layout(height=300, width=640, title_font_size=13)
    return fig


def ati_summary_html(filtered: pd.DataFrame) -> str:
    """One paragraph: how many intervals, how many the link filters out, the swappable share of idle bytes."""
    if len(filtered) == 0:
        return "<i>No access->access intervals (ATIs) in the current selection.</i>"
    s = filter_summary(filtered)
    bw = s.get("bandwidth") or {}
    share = s["swappable_share"]
    lengths = filtered["length_ns"].to_numpy(dtype=np.float64)
    from memlens.analysis.clock import describe_clock
    return (f"<b>{s['intervals']:,}</b> ATIs (access->access), median {safe(format_ns(float(np.median(lengths))))}; "
            f"at <b>{safe(bw.get('name', ''))}</b> {format_share(s['filtered_out_fraction'])} are too short to swap; "
            f"{s['swappable']:,} swappable in {s['blocks_with_swappable']:,} blocks, holding "
            f"{'n/a' if share is None else format_share(share)} of the idle byte-time "
            f"(largest swappable block {safe(format_bytes(int(filtered.loc[filtered['swappable'], 'size'].max())) if s['swappable'] else '-')}); "
            f"{safe(describe_clock(s['clock']))}, copy latency {format_ns(bw.get('d2h_latency_ns', 0))} out / "
            f"{format_ns(bw.get('h2d_latency_ns', 0))} in.")
