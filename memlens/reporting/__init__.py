"""The HTML report: one self-contained file to attach to a bug or a pull request.

``memlens.report(trace, "report.html")`` writes it (plotly.js inlined, works offline); `build_report`
returns the `Report` with every `Section` and its status for programmatic checks.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from memlens.reporting.sections.base import ReportContext, ReportOptions, Section, run_section

# (key, title, builder "module:function"), in page order
SECTIONS = (
    ("summary", "Summary", "memlens.reporting.sections.memory:summary"),
    ("live", "Live memory over time", "memlens.reporting.sections.memory:live_memory"),
    ("peak", "What is live at the peak", "memlens.reporting.sections.memory:peak"),
    ("largest", "Largest blocks", "memlens.reporting.sections.memory:largest"),
    ("allocator", "Allocator segments (recorded)", "memlens.reporting.sections.runs:allocator"),
    ("timeline", "Block timeline", "memlens.reporting.sections.memory:timeline"),
    ("ati", "Access time intervals (ATI)", "memlens.reporting.sections.access:ati"),
    ("outliers", "Outliers: large blocks idle for long", "memlens.reporting.sections.access:outliers"),
    ("phases", "Phases", "memlens.reporting.sections.runs:phases"),
    ("iterations", "Iterations", "memlens.reporting.sections.runs:iterations"),
    ("whatif", "What if: allocator settings, static plan, swapping", "memlens.reporting.sections.whatif:whatif"),
    ("advice", "Advice: verified plans, modeled step times", "memlens.reporting.sections.advice:advice"),
    ("metadata", "Trace metadata", "memlens.reporting.sections.runs:metadata"),
)
# sections built only when their input is given (otherwise left out of the page, not shown as unavailable)
GIVEN_ONLY = {"advice": "advice"}

# sections whose figures and numbers are times: their headings name the clock
TIMED_SECTIONS = frozenset({"live", "timeline", "ati", "outliers", "iterations", "whatif"})


@dataclass
class Report:
    """A built report: its `sections` (with status ok / unavailable / error) and the HTML text."""

    title: str
    subtitle: str
    sections: list[Section] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[Section]:
        """Sections whose builder raised an unexpected error."""
        return [s for s in self.sections if s.status == "error"]

    def status(self) -> dict[str, str]:
        """{section key: status}."""
        return {s.key: s.status for s in self.sections}

    def write(self, path) -> Path:
        """Write the HTML atomically (a temporary sibling renamed into place); returns the path."""
        from memlens.reporting.page import write_html
        return write_html(self.html(), path)

    def html(self) -> str:
        """The complete self-contained HTML document."""
        from memlens.reporting.markup import Safe, esc
        from memlens.reporting.page import document, figure_block

        rendered = []
        n_fig = 0
        for s in self.sections:
            body = []
            for part in s.parts:
                if isinstance(part, str):
                    body.append(esc(part))  # a Safe part passes through, plain text is escaped
                else:
                    n_fig += 1
                    body.append(figure_block(part, f"memlens-fig-{n_fig}"))
            rendered.append((s.key, s.title, Safe("".join(body))))
        return document(self.title, self.subtitle, rendered, [s.to_dict() for s in self.sections])


def _builder(spec: str):
    import importlib
    module, func = spec.split(":")
    return getattr(importlib.import_module(module), func)


def checked_options(sections, options: dict) -> ReportOptions:
    """The report's options, with unknown section names or option keywords refused as bad input."""
    from memlens.errors import InputError

    unknown = set(sections or ()) - {k for k, _, _ in SECTIONS}
    if unknown:
        raise InputError(f"unknown report sections {sorted(unknown)}; known: {[k for k, _, _ in SECTIONS]}")
    try:
        return ReportOptions(**options)
    except TypeError as exc:
        raise InputError(f"bad report option: {exc}") from None


def _wanted(key: str, sections, opts: ReportOptions) -> bool:
    """Whether the section `key` is built: the ones `sections` names, else every section whose input (see
    `GIVEN_ONLY`) was given."""
    if sections is not None:
        return key in sections
    needs = GIVEN_ONLY.get(key)
    return needs is None or getattr(opts, needs) is not None


def build_report(trace, *, title: str | None = None, sections: list[str] | None = None, progress: bool = False,
                 source_name: str | None = None, **options) -> Report:
    """Build every section of the report for `trace` (a Trace or a path `memlens.load` reads).

    `sections` limits it to those keys (see `SECTIONS`); `progress` shows a tqdm bar on stderr;
    `source_name` is the name shown in the header. Other keyword options are `ReportOptions` fields
    (bandwidth, max_points, top, x, timeline_blocks, whatif, memory_limit, advice: an `Advice` of
    `memlens.advise`, which adds its section).
    """
    from memlens.units import format_ns

    if isinstance(trace, (str, os.PathLike)):
        from memlens.io import load
        source_name = source_name or os.fspath(trace)
        trace = load(trace)
    elif source_name is None:
        source_name = str(trace.metadata.get("source_path", "") or trace.metadata.get("name", "") or "trace")
    opts = checked_options(sections, options)
    start = time.perf_counter()
    recorded = None
    if opts.gpu is not None:
        from memlens.devicetime.gpus import gpu as resolve_gpu
        from memlens.devicetime.retiming import retime
        g = resolve_gpu(opts.gpu)
        recorded, trace = trace, retime(trace, gpu=g, tf32=opts.tf32, source_gpu=opts.source_gpu)
        if opts.bandwidth is None:   # the GPU's own host link, unless the caller chose one
            from memlens.analysis.bandwidth import BandwidthModel
            opts.bandwidth = BandwidthModel(h2d_bytes_per_s=g.host_bw[1], d2h_bytes_per_s=g.host_bw[0],
                                            latency_ns=g.latency_ns, name=f"{g.name} {g.host_link}")
    from memlens.clock import clock_label
    clock = clock_label(trace)
    ctx = ReportContext(trace, opts, recorded=recorded)
    chosen = [(k, f"{h} - {clock}" if k in TIMED_SECTIONS else h, spec) for k, h, spec in SECTIONS
              if _wanted(k, sections, opts)]
    if progress:
        from tqdm import tqdm
        chosen = tqdm(chosen, desc="report sections", unit="section", leave=False)
    built = [run_section(key, heading, _builder(spec), ctx) for key, heading, spec in chosen]
    s = trace.summary()
    subtitle = (f"{source_name} - {s['source_kind']}, {s['blocks']:,} blocks, {s['accesses']:,} accesses, "
                f"{format_ns(s['duration_ns'])} on the {clock}")
    return Report(title=title or f"memlens report: {os.path.basename(source_name.rstrip('/')) or 'trace'}",
                  subtitle=subtitle, sections=built, seconds=time.perf_counter() - start)


def report(trace, path, *, title: str | None = None, sections: list[str] | None = None, **options) -> Path:
    """Write the HTML report of `trace` (a Trace or a path) to `path`; returns the path written.

    The file is self-contained (plotly.js inlined, no network needed). A section that cannot run on this
    trace says why; a section that fails shows its error without stopping the others.
    """
    return build_report(trace, title=title, sections=sections, **options).write(path)



__all__ = ["report", "build_report", "Report", "Section", "SECTIONS"]
