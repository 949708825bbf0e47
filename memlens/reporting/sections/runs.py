"""Report sections about the run as a whole: iterations, the recorded allocator state, trace metadata."""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.reporting.markup import bytes_text, key_values, note, ns_text, paragraph, share_text, table, tag
from memlens.reporting.sections.base import ReportContext, SectionUnavailable
from memlens.units import format_bytes, format_ns, format_share

MAX_TABLE_ROWS = 200  # per-iteration rows listed in the page (the figure shows every iteration)


MAX_PHASE_ROWS = 200


def phases(ctx: ReportContext) -> list:
    """The run's phases (forward, backward, optimizer step, zero_grad, record_function ranges) as the source
    tells them: a snapshot's ``external_annotations`` and, where its stacks show them, phases read from frames;
    a recording's ops' phases."""
    from memlens.analysis.phases import trace_phases
    from memlens.clock import clock_label

    rows = trace_phases(ctx.trace)
    if not rows:
        raise SectionUnavailable("the source tells no phases (no record_function annotations, no stack "
                                 "frames showing the forward pass, backward pass or optimizer step, and no "
                                 "recorded ops in a phase)")
    df = pd.DataFrame([{"phase": p["name"], "start": p["start_ns"], "end": p["end_ns"],
                        "duration": p["end_ns"] - p["start_ns"], "from": p.get("source", ""),
                        "annotation": p.get("label", "")} for p in rows])
    if rows[0].get("source") == "recorded ops":
        how = ("the forward pass, backward pass and optimizer step as the recorder saw each op (module hooks, "
               "the autograd engine, optimizer hooks), one row per run of consecutive ops in one phase")
    else:
        how = ("annotated ranges (record_function) as recorded, and the forward pass, backward pass and "
               "optimizer step where the allocation stacks show them (module calls, the autograd engine, "
               "torch.optim)")
    parts = [paragraph(f"{len(df):,} phases: {how}. Times are since the trace start, on the "
                       f"{clock_label(ctx.trace)}.")]
    if len(df) > MAX_PHASE_ROWS:
        parts.append(note(f"The table lists the first {MAX_PHASE_ROWS} of {len(df):,} phases."))
    parts.append(table(df.head(MAX_PHASE_ROWS), {"start": ns_text, "end": ns_text, "duration": ns_text}))
    return parts


def iterations(ctx: ReportContext) -> list:
    """Iteration boundaries, per-iteration statistics and how stable they are."""
    from memlens.analysis.stability import iteration_stability, iteration_stats

    its = ctx.iterations
    source = str(its["source"].iloc[0]) if len(its) else "none"
    if source == "none":
        raise SectionUnavailable("no iterations found: the trace has no step markers or optimizer steps, and "
                                 "its allocation sequence does not repeat")
    intervals = ctx.intervals if ctx.trace.has_accesses else None  # computed once for the whole report
    stats = iteration_stats(ctx.trace, its, intervals=intervals)
    parts = [paragraph(f"{len(its):,} iterations found (from {source}).")]
    stability = iteration_stability(ctx.trace, its, intervals=intervals)
    if stability["score"] is not None:
        components = ", ".join(f"{k} {format_share(v)}" for k, v in stability["components"].items())
        parts.append(paragraph(f"Consecutive iterations are {format_share(stability['score'])} alike (median over pairs; "
                               f"{components}); the least alike pair scores {format_share(stability['min_score'])}."))
    parts.append(_iteration_figure(stats))
    fmt = {c: (lambda v: "" if pd.isna(v) else format_bytes(v)) for c in stats.columns
           if c.endswith("bytes") or c.startswith("peak")}
    fmt.update({c: (lambda v: "" if pd.isna(v) else format_ns(v)) for c in stats.columns if c.endswith("_ns")})
    if len(stats) > MAX_TABLE_ROWS:
        parts.append(note(f"The table lists the first {MAX_TABLE_ROWS} of {len(stats):,} iterations; the figure "
                          "shows all of them."))
    parts.append(table(stats.head(MAX_TABLE_ROWS), fmt))
    return parts


def _iteration_figure(stats: pd.DataFrame):
    """Peak live memory per iteration (bars) and each iteration's duration (line, right axis)."""
    import plotly.graph_objects as go

    from memlens.viz.labels import byte_unit

    div, unit = byte_unit(float(stats["peak_live_bytes"].max()) if len(stats) else 0)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=stats["iteration"], y=stats["peak_live_bytes"] / div, name=f"peak live ({unit})",
                         marker_color="#4C78A8", hovertemplate=f"iteration %{{x}}: %{{y:,.2f}} {unit}<extra></extra>"))
    fig.add_trace(go.Scatter(x=stats["iteration"], y=stats["duration_ns"] / 1e6, name="duration (ms)", yaxis="y2",
                             mode="lines+markers", marker_color="#E45756",
                             hovertemplate="iteration %{x}: %{y:,.2f} ms<extra></extra>"))
    # iterations are whole numbers: ticks only on them (a single iteration had ticks at -0.5, 0, 0.5)
    step = max(1, int(np.ceil(len(stats) / 20)))
    fig.update_layout(height=320, margin=dict(l=60, r=60, t=30, b=50),
                      xaxis=dict(title="iteration", tickmode="linear", tick0=0, dtick=step),
                      yaxis=dict(title=f"peak live memory ({unit})", rangemode="tozero"),
                      yaxis2=dict(title="duration (ms)", overlaying="y", side="right", rangemode="tozero",
                                  showgrid=False), legend=dict(orientation="h", y=1.12))
    return fig


def metadata(ctx: ReportContext) -> list:
    """Everything the trace says about itself: source, settings, notes, table sizes."""
    trace = ctx.trace
    meta = dict(trace.metadata)
    notes = meta.pop("notes", []) or []
    tables = [("blocks", len(trace.blocks)), ("accesses", len(trace.accesses)), ("ops", len(trace.ops))]
    for name in ("segments", "segment_blocks", "events", "stacks"):
        df = trace.table(name)
        tables.append((name, "absent" if df is None else len(df)))
    counts = trace.blocks["category"].value_counts()
    sizes = trace.blocks.groupby("category")["size"].sum()
    cat = pd.DataFrame({"category": counts.index, "blocks": counts.to_numpy(),
                        "bytes allocated": sizes.reindex(counts.index).to_numpy(np.int64)})
    return metadata_parts(meta, notes, tables, cat)


def metadata_parts(meta: dict, notes: list, tables: list, categories: pd.DataFrame) -> list:
    """The metadata section from the trace's metadata (less its notes), the notes, (table, rows) pairs and
    the blocks by category (category, blocks, bytes allocated)."""
    parts = [tag("h3", "tables"), key_values(tables)]
    if notes:
        parts.append(tag("h3", "notes from the source"))
        parts.extend(note(n) for n in notes)
    parts.append(tag("h3", "metadata"))
    parts.append(key_values(sorted(meta.items())))
    parts.append(tag("h3", "blocks by category"))
    parts.append(table(categories, {"bytes allocated": format_bytes}))
    return parts


def allocator(ctx: ReportContext) -> list:
    """The recorded allocator state (CUDA snapshots): reserved vs allocated vs requested bytes, per pool."""
    from memlens.analysis.fragmentation import fragmentation

    frag = fragmentation(ctx.trace)
    if not frag:
        raise SectionUnavailable("the trace has no allocator segments: only CUDA memory snapshots record them "
                                 "(the what-if section simulates the caching allocator for any trace)")
    parts = [paragraph("What PyTorch's caching allocator held when the recording ended: reserved segments "
                       "(cudaMalloc), the blocks handed out of them (allocated, rounded up) and the bytes the "
                       "program asked for (requested). Reserved minus allocated is cached but unused.")]
    rows = []
    for dev, f in frag.items():
        rows.append({"device": dev, "at": f.get("at", ""), "segments": f.get("segments"),
                     "reserved": f.get("reserved_bytes"), "allocated": f.get("allocated_bytes"),
                     "requested": f.get("requested_bytes"), "cached unused": f.get("reserved_unallocated_bytes"),
                     "fragmentation": f.get("fragmentation"), "largest free block": f.get("largest_free_block"),
                     "external fragmentation": f.get("external_fragmentation")})
    size_cols = ("reserved", "allocated", "requested", "cached unused", "largest free block")
    fmt = {c: bytes_text for c in size_cols}
    fmt.update({"fragmentation": share_text, "external fragmentation": share_text})
    parts.append(table(pd.DataFrame(rows), fmt))
    pools = [{"device": dev, "pool": pool, "segments": p.get("segments"), "reserved": p.get("reserved_bytes"),
              "allocated": p.get("allocated_bytes"), "fragmentation": p.get("fragmentation")}
             for dev, f in frag.items() for pool, p in (f.get("by_pool") or {}).items()]
    if pools:
        parts += [tag("h3", "by pool"), table(pd.DataFrame(pools), fmt)]
    return parts
