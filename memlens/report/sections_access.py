"""Report sections that need accesses: the ATI distribution and the outlier blocks."""
from __future__ import annotations

import numpy as np

from memlens.report.markup import bytes_text, ns_text, paragraph, table, tag
from memlens.report.sections import ReportContext
from memlens.units import format_bytes, format_ns, format_share

SCATTER_POINTS = 20_000  # outlier scatter: the highest-scoring blocks, the rest are below notice


def ati(ctx: ReportContext) -> list:
    """ATI histogram and ECDF with the bandwidth filter, overall statistics and statistics per category."""
    from memlens.analysis.ati import ati_by, ati_stats
    from memlens.analysis.outliers import bandwidth_filter, filter_summary
    from memlens.viz.ati import ati_ecdf, ati_histogram

    ctx.require_accesses("The ATI distribution")
    iv = ctx.intervals
    st = ati_stats(iv)
    filtered = bandwidth_filter(iv, ctx.options.bandwidth)
    fs = filter_summary(filtered)
    parts = [paragraph(
        f"{st['count']:,} access intervals over {st['blocks']:,} blocks: median {ns_text(st['p50_ns'])}, 90th "
        f"percentile {ns_text(st['p90_ns'])}, 99th {ns_text(st['p99_ns'])}, longest {ns_text(st['max_ns'])}. "
        f"{format_share(fs['filtered_out_fraction'])} are too short to swap over the link; the {fs['swappable']:,} "
        f"that are long enough hold {format_share(fs['swappable_share'] or 0)} of the idle byte-time.")]
    parts.append(ati_histogram(filtered, ctx.options.bandwidth))
    parts.append(ati_histogram(filtered, ctx.options.bandwidth, weight="bytes_ns"))
    parts.append(ati_ecdf(filtered, ctx.options.bandwidth))
    by_cat = ati_by(ctx.trace, "category", intervals=iv)
    fmt = {c: ns_text for c in by_cat.columns if c.endswith("ns_text")}
    fmt["bytes"] = bytes_text
    parts += [tag("h3", "by category"), table(by_cat.reset_index() if by_cat.index.name else by_cat, fmt)]
    return parts


def outliers(ctx: ReportContext) -> list:
    """Blocks ranked by idle memory (size x longest idle interval), with Zhang et al.'s measures."""
    import plotly.graph_objects as go

    from memlens.analysis.outliers import outliers as rank_outliers
    from memlens.viz.labels import safe_labels

    ctx.require_accesses("Outlier detection")
    ranked = rank_outliers(ctx.trace, ctx.options.bandwidth, top=None, intervals=ctx.intervals)
    if len(ranked) == 0:
        return [paragraph("No block has an idle interval.")]
    top = ranked.head(ctx.options.top)
    parts = [paragraph(
        f"The {len(top)} blocks holding the most idle memory (size x longest idle interval) of {len(ranked):,}. "
        "Large blocks idle for long stretches cause the memory pressure (Li et al.); those idle across the "
        "peak are the swapping candidates (Zhang et al.: DOA, AOA).")]
    shown = ranked.head(SCATTER_POINTS)
    is_top = np.arange(len(shown)) < len(top)
    hover = np.stack([shown["block_id"].astype(str).to_numpy(), safe_labels(shown["category"]),
                      safe_labels(shown["op"]), safe_labels(shown["module"]),
                      np.array([format_bytes(v) for v in shown["size"]], dtype=object),
                      np.array([format_ns(v) for v in shown["max_idle_ns"]], dtype=object)], axis=1)
    fig = go.Figure()
    for mask, name, color in ((~is_top, "other blocks", "#BAB0AC"), (is_top, f"top {len(top)}", "#E45756")):
        fig.add_trace(go.Scattergl(
            x=shown["size"].to_numpy()[mask], y=shown["max_idle_ns"].to_numpy()[mask], mode="markers", name=name,
            marker=dict(color=color, size=6), customdata=hover[mask],
            hovertemplate="block %{customdata[0]} %{customdata[4]} idle %{customdata[5]}<br>%{customdata[1]} / "
                          "%{customdata[2]}<br>%{customdata[3]}<extra></extra>"))
    fig.update_layout(height=380, margin=dict(l=60, r=20, t=30, b=50),
                      xaxis=dict(type="log", title="block size (bytes)"),
                      yaxis=dict(type="log", title="longest idle interval (ns)"))
    parts.append(fig)
    cols = ["block_id", "device", "size", "max_idle_ns", "idle_fraction", "accesses", "crosses_peak", "doa_ns",
            "category", "op", "module"]
    fmt = {"size": bytes_text, "max_idle_ns": ns_text, "doa_ns": ns_text,
           "idle_fraction": format_share}
    parts.append(table(top[[c for c in cols if c in top.columns]], fmt))
    return parts
