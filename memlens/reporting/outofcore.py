"""The report of a trace larger than memory (`memlens report TRACE --engine dask`).

The same page as `build_report`, with each section built from what fits in memory whatever the trace's
length (`memlens.analysis.outofcore.overview.report_data`):

- from the out-of-core engine's exact aggregates: the summary, live memory (the same reduced points as the
  in-memory figure, peak exact), what is live at the peak, the largest blocks, the ATI statistics and
  histogram, the outliers and the metadata;
- on a window around the highest peak (the whole trace when it is small; `overview.WINDOW_BLOCKS` blocks /
  `overview.WINDOW_ACCESSES` accesses): the block timeline, iterations, the what-ifs (allocator replay,
  static plan, swapping) and the recorded allocator state, which need every block at once; each says so;
- left out, saying why and what memory they would need: the parts of the ATI section that need every
  interval at once (ECDF, byte-weighted histogram, per-category table, per-block stability).
"""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd

from memlens.reporting import SECTIONS, TIMED_SECTIONS, Report, _wanted, checked_options
from memlens.reporting.markup import bullet_list, note, paragraph, tag
from memlens.reporting.sections.advice import advice as advice_section
from memlens.reporting.sections.base import ReportContext, ReportOptions, SectionUnavailable, run_section
from memlens.units import format_bytes, format_ns, format_share

# the sections that run the in-memory builder on the window around the peak
WINDOW_SECTIONS = ("timeline", "allocator", "iterations", "whatif")


class OutOfCoreContext:
    """What the out-of-core sections share: ``data`` (`report_data`'s result), ``options``, ``window`` (a
    `report.window.Window`) and ``window_ctx`` (a `ReportContext` on the window's trace)."""

    def __init__(self, data: dict, options: ReportOptions):
        from memlens.reporting.window import Window, cut_window
        from memlens.trace import Trace
        self.data = data
        self.options = options
        self.files = data["files"]
        w = data["window"]
        tables = dict(w["tables"])
        blocks, accesses, ops = tables.pop("blocks"), tables.pop("accesses"), tables.pop("ops")
        optional = {k: v for k, v in tables.items() if v is not None}
        total = self.files.rows["blocks"]
        if w["whole"]:
            trace = Trace.from_tables(blocks, accesses, ops, dict(self.files.metadata), **optional)
            self.window = Window(trace, w["t0"], w["t1"], total, total, w["how"])
        else:
            optional.pop("events", None)  # allocator events are not cut at the window's edges: left out
            self.window = cut_window(blocks, accesses, ops, self.files.metadata, w["t0"], w["t1"], total, w["how"],
                                     **optional)
        self.window_ctx = ReportContext(self.window.trace, options)
        self.stacks = optional.get("stacks")

    @property
    def whole(self) -> bool:
        return bool(self.data["window"]["whole"])

    def window_note(self, what: str) -> list:
        """A note saying `what` ran on the window (nothing when the window is the whole trace)."""
        if self.whole:
            return []
        w = self.window
        return [note(f"The trace has {w.total_blocks:,} blocks, more than fit in memory at once: {what} ran on "
                     f"{w.how} ({format_ns(w.start_ns)} to {format_ns(w.end_ns)}, {w.blocks:,} blocks; times in "
                     "this section are since the window's start, blocks alive across its edges count as allocated "
                     "before / never freed). The live memory, peak, largest blocks, ATI and outlier sections cover "
                     "the whole trace.")]

    def peaks(self) -> dict:
        """{device: `PeakBreakdown`} of the whole trace."""
        from memlens.analysis.peak import breakdown_of_live
        from memlens.trace import conform
        out = {}
        for dev, p in sorted(self.data["peaks"].items()):
            e = p["event"]
            live = p["live"] if p["live"] is not None else conform("blocks", None)  # nothing live at the peak
            out[dev] = breakdown_of_live(dev, live, int(e["peak"]), int(e["t_ns"]), int(e["seq"]),
                                         int(e["block_id"]) if e["delta"] > 0 else None, p["op"], self.options.top)
        return out


# ---- sections from the whole-trace aggregates -------------------------------------------------------------
def summary(octx: OutOfCoreContext) -> list:
    """Findings in sentences, from the aggregates (`analysis.findings`' sentences where they need only
    those)."""
    d = octx.data
    s = d["summary"]
    what = (f"{s['accesses']:,} accesses by {s['ops']:,} ops" if s["has_accesses"] else "no per-access data")
    out = [f"The trace ({s['source_kind']}) holds {s['blocks']:,} blocks ({format_bytes(d['bytes_allocated'])} "
           f"allocated in total) on {', '.join(s['devices']) or 'no device'} over {format_ns(s['duration_ns'])}, "
           f"with {what}."]
    for pb in octx.peaks().values():
        text = pb.describe()
        module = pb.module_sentence()
        if module:
            text += " " + module
        out.append(text)
    if "ati" in d:
        st, fs = d["ati"], d["outlier_summary"]
        if st["count"]:
            out.append(f"Of {st['count']:,} access time intervals (ATI: from the end of one op using a block to the "
                       f"start of the next; lifetime edges apart), half are shorter than {format_ns(st['p50_ns'])} "
                       f"and 90% shorter than {format_ns(st['p90_ns'])}; "
                       f"{format_share(st['fraction_below']['100us'])} are under 100 us and "
                       f"{format_share(st['fraction_below']['1ms'])} under 1 ms.")
            share = fs["swappable_share"]
            out.append(f"{format_share(fs['filtered_out_fraction'])} of the ATIs are too short to move their block "
                       f"out and back in over the link; the {fs['swappable']:,} that are long enough hold "
                       f"{format_share(share) if share is not None else 'none'} of the idle byte-time.")
        ranked = d["outliers"]
        if len(ranked):
            top = ranked.iloc[0]
            out.append(f"The biggest idle block by size x idle time is block {top['block_id']} "
                       f"({format_bytes(top['size'])}, {top.get('category') or 'unknown'}), idle for "
                       f"{format_ns(top['max_idle_ns'])} ({format_share(top['idle_fraction'])} of its lifetime).")
    else:
        out.append(d.get("ati_error", "The trace has no per-access data."))
    out.append("Computed out of core (--engine dask): iterations, their stability and the what-ifs ran on "
               + ("the whole trace." if octx.whole else f"{octx.window.how} (see their sections)."))
    return [bullet_list(out)]


def live_series_of(octx: OutOfCoreContext, by: str) -> list:
    """`viz.live.LiveSeries` of every device from the out-of-core curves, split by `by`."""
    from memlens.viz.live import LiveSeries
    out = []
    for dev in octx.data["summary"]["devices"]:
        c = octx.data["curves"].get(dev)
        if c is None:
            continue
        out.append(LiveSeries(device=dev, x=c["x"], total=c["total"], groups=c["bands"].get(by, {}),
                              peak_x=c["peak_x"], peak_bytes=c["peak_bytes"], events=c["events"]))
    return out


def live(octx: OutOfCoreContext) -> list:
    """Live memory over time, stacked by category and by module (reduced a time bucket at a time)."""
    from memlens.clock import clock_label
    from memlens.viz.live import series_figure

    if octx.files.rows["blocks"] == 0:
        raise SectionUnavailable("the trace has no blocks, so there is no live memory to plot")
    x, span = octx.options.x, octx.data["summary"]["duration_ns"]
    clock = clock_label(SimpleNamespace(metadata=dict(octx.files.metadata)))
    parts = [paragraph("Live bytes (the sum of the sizes of blocks allocated and not yet freed) after every "
                       "allocation and free; each pixel column keeps its minimum and maximum, so the peak "
                       "(triangle) is exact.")]
    if any(k in octx.files.files for k in ("events", "segments")):
        parts.append(note("The reserved-memory line is not drawn out of core: it is walked back from the "
                          "allocator's final segments through every segment event and checked against the whole "
                          "live curve. `memlens report --engine memory` draws it."))
    parts.append(series_figure(live_series_of(octx, "category"), x=x, span_ns=span, clock=clock, by="category"))
    if octx.data["module_named"]:
        parts.append(tag("h3", "By module"))
        parts.append(series_figure(live_series_of(octx, "module"), x=x, span_ns=span, clock=clock, by="module"))
    else:
        parts.append(note("The trace attributes no block to a module (its source does not record modules), "
                          "so only the split by category is shown."))
    return parts


def peak(octx: OutOfCoreContext) -> list:
    """What is live at each device's peak, from the blocks live then (collected a batch at a time)."""
    from memlens.reporting.sections.memory import peak_parts

    peaks = octx.peaks()
    if not peaks:
        raise SectionUnavailable("the trace has no allocation events, so it has no peak")
    causes = {}
    parts = []
    if octx.whole:
        from memlens.analysis.peak_cause import peak_cause
        causes = peak_cause(octx.window.trace)
    else:
        parts.append(note("The sentence on what pushed each peak is left out: it places the peak in its "
                          "iteration, which needs the whole allocation sequence in memory."))
    sites_trace = SimpleNamespace(stacks=octx.stacks)
    by = "module" if octx.data["module_named"] else "op"
    return parts + peak_parts(peaks, causes, sites_trace, lambda dev, pb: octx.data["peaks"][dev]["live"], by,
                              octx.options.top)


def largest(octx: OutOfCoreContext) -> list:
    """The largest blocks of the whole trace (each batch's largest, merged)."""
    from memlens.reporting.sections.memory import largest_parts
    from memlens.viz.tables import largest_of

    if octx.data["largest"] is None:
        raise SectionUnavailable("the trace has no blocks")
    return largest_parts(largest_of(octx.data["largest"], octx.options.top, octx.data["span"], octx.stacks))


def ati(octx: OutOfCoreContext) -> list:
    """ATI statistics (exact quantiles) and histogram; what needs every interval at once is named."""
    import plotly.graph_objects as go

    from memlens.analysis.outofcore.choose import BYTES_PER_ACCESS
    from memlens.reporting.sections.access import ati_summary_parts

    d = octx.data
    if "ati" not in d:
        raise SectionUnavailable(d["ati_error"])
    parts = ati_summary_parts(d["ati"], d["outlier_summary"])
    hist = d["ati"]["histogram"]
    fig = go.Figure(go.Bar(x=[f"{format_ns(lo)}-{format_ns(hi)}" for lo, hi in zip(hist["lo"], hist["hi"])],
                           y=hist["count"], marker_color="#4C78A8",
                           hovertemplate="%{x}: %{y:,} intervals<extra></extra>"))
    fig.update_layout(height=320, margin=dict(l=60, r=20, t=30, b=80), xaxis=dict(title="ATI length"),
                      yaxis=dict(title="intervals"))
    parts += [tag("h3", "ATI lengths (one bin per decade)"), fig]
    need = octx.files.rows["accesses"] * BYTES_PER_ACCESS
    parts.append(note(f"Left out out of core: the ECDF, the byte-time histogram, the table by category and the "
                      f"per-block stability across iterations. They need every interval in memory at once (about "
                      f"{format_bytes(need)} for {octx.files.rows['accesses']:,} accesses); "
                      "`memlens report --engine memory` draws them where that fits."))
    return parts


def outliers(octx: OutOfCoreContext) -> list:
    """The blocks holding the most idle memory, ranked out of core (the first rows of the exact ranking)."""
    from memlens.reporting.sections.access import outlier_parts

    d = octx.data
    if "outliers" not in d:
        raise SectionUnavailable(d["ati_error"])
    ranked = d["outliers"]
    return outlier_parts(ranked, int(ranked.attrs.get("blocks_ranked", len(ranked))), octx.options.top)


MAX_PHASE_OPS = 2_000_000  # ops rows read whole for a recording's phases (5 columns: <= 80 MB)


def phases(octx: OutOfCoreContext) -> list:
    """The phases the source tells: the trace metadata's, else (a recording) the runs of its ops' phases,
    read from five columns of the ops table when it has at most `MAX_PHASE_OPS` rows."""
    from memlens.reporting.sections.runs import phases as phases_section
    files = octx.files
    ops = None
    if not files.metadata.get("phases") and 0 < files.rows.get("ops", 0) <= MAX_PHASE_OPS:
        wanted = ["op_id", "start_ns", "end_ns", "phase", "iteration"]
        present = [c for c in wanted if c in files.columns("ops")]
        if "phase" in present:
            ops = files.read("ops", columns=present)
    return phases_section(SimpleNamespace(trace=SimpleNamespace(metadata=dict(files.metadata), ops=ops)))


def metadata(octx: OutOfCoreContext) -> list:
    """Table sizes and metadata from the manifest, blocks by category from the blocks pass."""
    from memlens.reporting.sections.runs import metadata_parts
    from memlens.trace import OPTIONAL_TABLES

    meta = dict(octx.window.trace.metadata) if octx.whole else dict(octx.files.metadata)
    notes = meta.pop("notes", []) or []
    rows = octx.files.rows
    tables = [(name, rows.get(name, 0)) for name in ("blocks", "accesses", "ops")]
    tables += [(name, rows[name] if name in rows else "absent") for name in OPTIONAL_TABLES]
    counts = pd.Series({k: v[0] for k, v in octx.data["categories"].items()}, dtype="int64")
    counts = counts.sort_values(ascending=False)  # as `value_counts` orders them (first appearance on ties)
    sizes = {k: v[1] for k, v in octx.data["categories"].items()}
    cat = pd.DataFrame({"category": counts.index, "blocks": counts.to_numpy(),
                        "bytes allocated": np.array([sizes[k] for k in counts.index], dtype=np.int64)})
    return metadata_parts(meta, notes, tables, cat)


def _on_window(key: str):
    """A section builder running the in-memory builder `key` on the window, with the window's note."""
    from memlens.reporting import _builder
    spec = dict((k, s) for k, _, s in SECTIONS)[key]

    def build(octx: OutOfCoreContext) -> list:
        parts = _builder(spec)(octx.window_ctx)
        return octx.window_note({"timeline": "the block timeline", "allocator": "the allocator section",
                                 "iterations": "iteration detection",
                                 "whatif": "the what-if simulations"}[key]) + parts
    return build


BUILDERS = {"summary": summary, "live": live, "peak": peak, "largest": largest, "ati": ati, "outliers": outliers,
            "phases": phases, "metadata": metadata, **{k: _on_window(k) for k in WINDOW_SECTIONS}}
BUILDERS["advice"] = advice_section  # reads only the options' advice, never the trace


def build_report_out_of_core(path, runner, *, title: str | None = None, sections: list[str] | None = None,
                             source_name: str | None = None, rows_per_bucket: int | None = None,
                             **options) -> Report:
    """`build_report` for the saved trace at `path`, out of core on `runner` (an entered
    `outofcore.runner.Runner`). Options as `ReportOptions` (``gpu`` is refused: retiming rewrites the whole
    trace); `rows_per_bucket` sizes the ATI / outlier tasks (accesses each; default the engine's)."""
    from memlens.analysis.outofcore.overview import report_data
    from memlens.errors import InputError

    opts = checked_options(sections, options)
    if opts.gpu is not None:
        raise InputError("--gpu retimes the whole trace in memory; it has no out-of-core engine (use --engine memory)")
    start = time.perf_counter()
    data = report_data(path, runner, bandwidth=opts.bandwidth, top=opts.top, x=opts.x, max_points=opts.max_points,
                       rows_per_bucket=rows_per_bucket)
    octx = OutOfCoreContext(data, opts)
    from memlens.clock import clock_label
    clock = clock_label(SimpleNamespace(metadata=dict(octx.files.metadata)))
    built = []
    for key, heading, _ in SECTIONS:
        if not _wanted(key, sections, opts):
            continue
        heading = f"{heading} - {clock}" if key in TIMED_SECTIONS else heading
        built.append(run_section(key, heading, BUILDERS[key], octx))
    s = data["summary"]
    source_name = source_name or os.fspath(path)
    subtitle = (f"{source_name} - {s['source_kind']}, {s['blocks']:,} blocks, {s['accesses']:,} accesses, "
                f"{format_ns(s['duration_ns'])} on the {clock} (out of core)")
    return Report(title=title or f"memlens report: {os.path.basename(source_name.rstrip('/')) or 'trace'}",
                  subtitle=subtitle, sections=built, seconds=time.perf_counter() - start)
