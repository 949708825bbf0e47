"""Report sections that need accesses: the ATI distribution and the outlier blocks."""
from __future__ import annotations

import numpy as np

from memlens.reporting.markup import bytes_text, ns_text, paragraph, table, tag
from memlens.reporting.sections.base import ReportContext
from memlens.units import format_bytes, format_ns, format_share

SCATTER_POINTS = 20_000  # outlier scatter: the highest-scoring blocks, the rest are below notice


def ati(ctx: ReportContext) -> list:
    """ATI histogram and ECDF with the bandwidth filter, the lifetime edges beside them, statistics per
    category and the blocks whose idle time changes most from step to step."""
    from memlens.analysis.ati import ati_by, ati_stats
    from memlens.analysis.swappable import bandwidth_filter, filter_summary
    from memlens.viz.ati import ati_ecdf, ati_histogram

    ctx.require_accesses("The ATI distribution")
    iv = ctx.intervals
    st = ati_stats(iv)
    filtered = bandwidth_filter(iv, ctx.options.bandwidth)
    filtered.attrs["clock"] = iv.attrs.get("clock")
    fs = filter_summary(filtered)
    parts = ati_summary_parts(st, fs)
    parts.append(ati_histogram(filtered, ctx.options.bandwidth))
    parts.append(ati_histogram(filtered, ctx.options.bandwidth, weight="bytes_ns"))
    parts.append(ati_ecdf(filtered, ctx.options.bandwidth))
    by_cat = ati_by(ctx.trace, "category", intervals=iv)
    parts += [tag("h3", "by category"), table(by_cat.reset_index() if by_cat.index.name else by_cat)]
    if ctx.recorded is not None:
        parts += two_clocks_ati(ctx)
    parts += _block_stability(ctx)
    return parts


def ati_summary_parts(st: dict, fs: dict) -> list:
    """The ATI section's two paragraphs from `ati_stats` and the bandwidth filter's `filter_summary`."""
    from memlens.analysis.clock import describe_clock

    edges = st["edges"]
    bw = fs.get("bandwidth") or {}
    parts = [paragraph(
        f"{st['count']:,} access time intervals (ATI: from the end of the op of one access to the start of the "
        f"op of the next) over {st['blocks']:,} blocks: median {ns_text(st['p50_ns'])}, 90th percentile "
        f"{ns_text(st['p90_ns'])}, 99th {ns_text(st['p99_ns'])}, longest {ns_text(st['max_ns'])}. "
        f"{format_share(fs['filtered_out_fraction'] or 0)} are too short to swap over {bw.get('name', 'the link')} "
        f"(copy latency {bw.get('d2h_latency_ns', 0) / 1e3:g} us out, {bw.get('h2d_latency_ns', 0) / 1e3:g} us "
        f"in); the {fs['swappable']:,} that are long enough hold {format_share(fs['swappable_share'] or 0)} of the idle "
        f"byte-time. Times are on the {describe_clock(st['clock'])}.")]
    parts.append(paragraph(
        "Beside the ATI, not in it, the lifetime edges: "
        + "; ".join(f"{kind.replace('_', ' ')} {e['count']:,} (median {ns_text(e['p50_ns'])})"
                    for kind, e in edges.items() if e["count"])
        + ". They are slack in when blocks are allocated and freed, not idle time a swap can use."))
    return parts


def two_clocks_ati(ctx: ReportContext) -> list:
    """The ATI statistics and the bandwidth filter on the recorded clock beside the modeled one."""
    import pandas as pd

    from memlens.analysis.ati import access_intervals, ati_stats
    from memlens.analysis.swappable import bandwidth_filter, filter_summary
    from memlens.clock import clock_label

    rows = []
    for trace, iv in ((ctx.recorded, access_intervals(ctx.recorded)), (ctx.trace, ctx.intervals)):
        st = ati_stats(iv)
        fs = filter_summary(bandwidth_filter(iv, ctx.options.bandwidth))
        rows.append({"clock": clock_label(trace), "duration_ns": trace.duration_ns, "p50_ns": st["p50_ns"],
                     "p90_ns": st["p90_ns"], "max_ns": st["max_ns"],
                     "too short to swap": f"{fs['filtered_out_fraction']:.1%}",
                     "swappable idle byte-time": f"{(fs['swappable_share'] or 0):.1%}"})
    df = pd.DataFrame(rows)
    fmt = {c: ns_text for c in ("duration_ns", "p50_ns", "p90_ns", "max_ns")}
    return [tag("h3", "recorded clock vs modeled clock"),
            paragraph("The same accesses on the clock the trace was recorded on and on the modeled GPU clock "
                      "(memlens.retime). A CPU recording runs ~100x slower than the GPU, so its idle "
                      "intervals look long enough to swap when on the GPU they are not."),
            table(df, fmt, {"duration_ns": "trace duration", "p50_ns": "ATI p50", "p90_ns": "ATI p90",
                            "max_ns": "ATI max"})]


def _block_stability(ctx: ReportContext) -> list:
    """The logical blocks (matched across iterations) whose idle time varies most from step to step."""
    from memlens.analysis.block_stability import block_stability, per_block_ati

    its = ctx.iterations
    if its is None or len(its) < 2 or str(its["source"].iloc[0]) == "none":
        return []
    scored = block_stability(ctx.trace, per_block=per_block_ati(ctx.trace, its, intervals=ctx.intervals))
    scored = scored[scored["stability"].notna()]
    if len(scored) == 0:
        return []
    big = scored[scored["size"] >= scored["size"].quantile(0.5)].head(ctx.options.top)
    cols = ["block_id", "size", "category", "op", "module", "iterations", "atis_per_step", "mean_idle_ns",
            "cv", "stability"]
    fmt = {"size": bytes_text, "mean_idle_ns": ns_text, "cv": lambda v: f"{v:.2f}",
           "stability": lambda v: f"{v:.2f}"}
    return [tag("h3", "per-block stability across iterations"), paragraph(
        f"Each block matched with itself in every step (parameters and optimizer state by identity, per-step "
        f"blocks by the k-th allocation of the same op, size and module); stability = 1 - the coefficient of "
        f"variation of its idle time per step (first step left out as warm-up). Median stability "
        f"{scored['stability'].median():.2f} over {len(scored):,} blocks; the least stable of the larger "
        "half:"), table(big[[c for c in cols if c in big.columns]], fmt)]


def outliers(ctx: ReportContext) -> list:
    """Blocks ranked by idle memory (size x longest idle interval), with Zhang et al.'s measures."""
    from memlens.analysis.outliers import outliers as rank_outliers

    ctx.require_accesses("Outlier detection")
    ranked = rank_outliers(ctx.trace, ctx.options.bandwidth, top=None, intervals=ctx.intervals)
    return outlier_parts(ranked, len(ranked), ctx.options.top)


def outlier_parts(ranked, n_ranked: int, top_rows: int) -> list:
    """The outliers section from the ranking's first rows (at least `SCATTER_POINTS` of them, or all) and
    the number of blocks ranked in all."""
    import plotly.graph_objects as go

    from memlens.viz.labels import safe_labels

    if len(ranked) == 0:
        return [paragraph("No block has an idle interval.")]
    top = ranked.head(top_rows)
    parts = [paragraph(
        f"The {len(top)} blocks holding the most idle memory (size x longest idle interval) of {n_ranked:,}. "
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
