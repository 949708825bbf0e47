"""Report sections about memory over time: summary, live memory, what is live at the peak, largest blocks."""
from __future__ import annotations

import pandas as pd

from memlens.reporting.markup import bullet_list, bytes_text, note, ns_text, paragraph, share_text, table, tag
from memlens.reporting.sections.base import ReportContext, SectionUnavailable
from memlens.units import format_bytes, format_ns

MAX_TIMELINES = 4  # one timeline per device, for this many devices at most


def summary(ctx: ReportContext) -> list:
    """Summary: the trace's findings in sentences with numbers (`memlens.analysis.findings`)."""
    from memlens.analysis.findings import findings

    return [bullet_list(findings(ctx.trace, bandwidth=ctx.options.bandwidth))]


def live_memory(ctx: ReportContext) -> list:
    """Live memory over time per device, stacked by category and by module, peak marked."""
    from memlens.viz.live import live_memory as live_figure

    trace = ctx.trace
    if len(trace.blocks) == 0:
        raise SectionUnavailable(f"{trace.no_blocks}: there is no live memory to plot")
    parts = [paragraph("Live bytes (the sum of the sizes of blocks allocated and not yet freed) after every "
                       "allocation and free; each pixel column keeps its minimum and maximum, so the peak "
                       "(triangle) is exact.")]
    parts.append(live_figure(trace, by="category", x=ctx.options.x, max_points=ctx.options.max_points,
                             curves=ctx.curves))
    if (trace.blocks["module"].astype(str) != "").any():
        parts.append(tag("h3", "By module"))
        parts.append(live_figure(trace, by="module", x=ctx.options.x, max_points=ctx.options.max_points,
                                 curves=ctx.curves))
    else:
        parts.append(note("The trace attributes no block to a module (its source does not record modules), "
                          "so only the split by category is shown."))
    return parts


def timeline(ctx: ReportContext) -> list:
    """Blocks as bars in time x address, small ones aggregated, accesses as marks; one figure per device
    (the `MAX_TIMELINES` devices with the highest peaks)."""
    from memlens.viz.timeline import timeline as timeline_figure

    if len(ctx.trace.blocks) == 0:
        raise SectionUnavailable("the trace has no blocks to draw")
    devices = sorted(ctx.peaks, key=lambda d: -ctx.peaks[d].peak_bytes)
    parts = [paragraph("Each block is a bar from its allocation to its free at its address (gaps between "
                       "address regions shrunk). The largest blocks on screen are drawn one by one; the others "
                       "are painted as a density layer; dots mark accesses.")]
    if len(devices) > MAX_TIMELINES:
        parts.append(note(f"Showing the {MAX_TIMELINES} devices with the highest peaks of {len(devices)}."))
    for dev in devices[:MAX_TIMELINES]:
        parts.append(timeline_figure(ctx.trace, device=dev, x=ctx.options.x, max_blocks=ctx.options.timeline_blocks,
                                     curve=ctx.curves[dev]))
    return parts


def peak(ctx: ReportContext) -> list:
    """What is live at the peak of each device, by category / module / allocating op, and the largest."""
    if not ctx.peaks:
        raise SectionUnavailable("the trace has no allocation events, so it has no peak")
    from memlens.analysis.peak import live_at
    from memlens.analysis.peak_cause import peak_cause

    by = "module" if (ctx.trace.blocks["module"].astype(str) != "").any() else "op"
    return peak_parts(ctx.peaks, peak_cause(ctx.trace), ctx.trace,
                      lambda dev, pb: live_at(ctx.trace, dev, pb.peak_seq, pb.peak_ns), by, ctx.options.top,
                      source_root=ctx.options.source_root)


def peak_parts(peaks: dict, causes: dict, sites_trace, live_of, by: str, top: int, source_root=None) -> list:
    """The peak section from its data: `peaks` ({device: `PeakBreakdown`}), `causes` ({device:
    `PeakCause`}, may lack devices), `sites_trace` (anything with the trace's ``stacks``), `live_of(device,
    breakdown)` (the blocks live at that peak), `by` (the composition figure's grouping), `source_root` (where
    the sites' source files are; None: where the frames point)."""
    from memlens.analysis.source import SourceReader
    from memlens.viz.peak import peak_composition

    reader = SourceReader(source_root)
    fmt = {"bytes": bytes_text, "share": share_text, "size": bytes_text, "alloc_ns": ns_text, "free_ns": ns_text}
    parts = [peak_composition(peaks, by=by, top=min(top, 15))]
    for dev, pb in peaks.items():
        parts.append(tag("h3", f"{dev}: peak {format_bytes(pb.peak_bytes)} at {format_ns(pb.peak_ns)}"))
        if dev in causes:
            parts.append(paragraph(tag("strong", causes[dev].cause)))
        parts.append(paragraph(pb.describe() + (f" The allocation that reached it came from {pb.op_at_peak}."
                                                if pb.op_at_peak else "")))
        parts.append(tag("h4", "allocation sites live at the peak (hover a site for its stack)"))
        live = live_of(dev, pb)
        parts.append(sites_table(sites_trace, live, top, reader))
        parts += files_table(sites_trace, live, top, reader)
        for note_text in pb.notes:
            parts.append(note(note_text))
        for key, frame in (("category", pb.by_category), ("module", pb.by_module), ("op", pb.by_op)):
            parts.append(tag("h4", f"by {key}"))
            parts.append(table(frame.head(top), fmt))
        parts.append(tag("h4", "largest blocks live at the peak"))
        parts.append(table(pb.largest, fmt))
    return parts


def sites_table(trace, blocks, top: int, reader=None):
    """Bytes by allocation site (`memlens.analysis.peak_cause.sites`); each site's cell carries the stack of
    its largest block as hover text (Python frames innermost first, C++ frames folded). With a
    `memlens.analysis.source.SourceReader` that finds the sites' files, a column shows each line's text."""
    from memlens.analysis.peak_cause import sites, stack_lines
    from memlens.analysis.source import add_source_lines
    from memlens.reporting.markup import Safe, esc

    df = sites(trace, blocks=blocks).head(top)
    if reader is not None:
        df = add_source_lines(trace, df, reader=reader)
    with_source = "source" in df.columns and df["source"].notna().any()
    head = "".join(f"<th>{esc(h)}</th>" for h in ("site",) + (("source line",) if with_source else ()) +
                   ("bytes", "blocks", "category", "op"))
    rows = []
    for r in df.itertuples(index=False):
        stack = "\n".join(stack_lines(trace.stacks, r.stack_id, 16)) or "no stack recorded"
        code = f"<td><code>{esc(r.source or '')}</code></td>" if with_source else ""
        rows.append(f"<tr><td>{tag('span', r.site, title=stack, cls='memlens-stack')}</td>{code}"
                    f"<td>{esc(bytes_text(r.bytes))}</td><td>{int(r.blocks):,}</td><td>{esc(r.category)}</td>"
                    f"<td>{esc(r.op)}</td></tr>")
    return Safe(f'<table class="memlens-table"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')


def files_table(trace, blocks, top: int, reader) -> list:
    """Bytes live at the peak per source file of their sites (`memlens.analysis.source.by_file`); nothing when
    no block has a Python frame."""
    from memlens.analysis.source import by_file

    df = by_file(trace, blocks, reader=reader).head(top)
    if len(df) == 0:
        return []
    df["found"] = df["found"].map(lambda v: "yes" if v else "no")
    return [tag("h4", "bytes live at the peak by source file"),
            table(df, {"bytes": bytes_text}, {"lines": "site lines", "found": "source read"})]


def largest(ctx: ReportContext) -> list:
    """The largest blocks of the whole trace."""
    from memlens.viz.tables import largest_blocks

    return largest_parts(largest_blocks(ctx.trace, n=ctx.options.top))


def largest_parts(df: pd.DataFrame) -> list:
    """The largest-blocks section from `viz.tables.largest_blocks`' frame."""
    if len(df) == 0:
        raise SectionUnavailable("the trace has no blocks")
    fmt = {"size": bytes_text, "alloc_ns": lambda v: "before recording" if pd.isna(v) else format_ns(v),
           "free_ns": lambda v: "still alive" if pd.isna(v) else format_ns(v), "lifetime_ns": ns_text}
    headers = {"alloc_ns": "allocated", "free_ns": "freed", "lifetime_ns": "lifetime", "block_id": "block"}
    return [table(df, fmt, headers)]
