"""The report's sections: each one a builder that may fail on its own without taking the report down.

A builder takes the shared `ReportContext` and returns a list of parts (`Safe` HTML from `markup`, or plotly
figures). It raises `SectionUnavailable` when the trace lacks what it needs (e.g. no accesses), which the
page shows as an explanation; any other exception is caught, shown in the section as an error and recorded
in the section's status (``Section.status == "error"``), so one broken analysis never loses the rest.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

from memlens.errors import NeedsAccessesError
from memlens.reporting.markup import Safe, esc, note

STATUSES = ("ok", "unavailable", "error")


class SectionUnavailable(Exception):
    """The trace lacks the data a section needs; the message says what and why."""


@dataclass
class Section:
    """One rendered section: ``status`` is ok / unavailable / error, ``message`` explains the latter two."""

    key: str
    title: str
    status: str = "ok"
    message: str = ""
    parts: list = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"key": self.key, "title": self.title, "status": self.status, "message": self.message,
                "seconds": round(self.seconds, 3)}


@dataclass
class ReportOptions:
    """Report settings: ``bandwidth`` (swap link, e.g. "25GB/s" or a preset name; None = default),
    ``max_points`` (points per curve after level-of-detail reduction), ``top`` (rows in tables),
    ``x`` ("time" or "event" axis), ``timeline_blocks`` (blocks drawn one by one before aggregation),
    ``whatif`` (run allocator / plan / swap what-ifs), ``whatif_time_limit_s`` (static planner search time
    per device, s), ``whatif_max_blocks`` (larger traces run the what-ifs on a window around the peak;
    None: 10,000 blocks for traces with accesses, 50,000 without),
    ``memory_limit`` (bytes, for swapping what-ifs), ``gpu`` (put the trace on this GPU's modeled clock
    first: `memlens.retime`; the ATI and what-if sections then show the recorded clock beside it; the
    swap link defaults to the GPU's host link), ``tf32`` (with ``gpu``: True / False runs fp32 matmuls and
    convolutions at the TF32 rate or not; None: what the trace says, else PyTorch's defaults, named in the
    clock), ``source_gpu`` (with ``gpu``, a trace on the measured kernel clock: the GPU that measured it, when
    its device name is not in the GPU table),
    ``source_root`` (a directory: the sites table shows each site's source line from the files found there; None:
    from the files where the frames point, when present), ``advice`` (an `Advice` of `memlens.advise`: the
    report gets its "advice" section, the ranked plans and their memory / time frontier)."""

    bandwidth: Any = None
    max_points: int = 4000
    top: int = 20
    x: str = "time"
    timeline_blocks: int = 4000
    whatif: bool = True
    whatif_time_limit_s: float = 1.0
    whatif_max_blocks: int | None = None
    memory_limit: int | None = None
    gpu: Any = None
    tf32: Any = None
    source_gpu: Any = None
    source_root: Any = None
    advice: Any = None


class ReportContext:
    """The trace, the options, and analyses shared by several sections (computed once, on demand)."""

    def __init__(self, trace, options: ReportOptions, recorded=None):
        self.trace = trace
        self.options = options
        self.recorded = recorded      # the trace on its recorded clock, when `trace` was retimed for the report

    @cached_property
    def curves(self) -> dict:
        """{device: trace.live_bytes(device)}: live bytes after every event, shared by the figures."""
        return {dev: self.trace.live_bytes(dev) for dev in self.trace.devices}

    @cached_property
    def peaks(self) -> dict:
        from memlens.analysis.peak import peak_breakdown
        return peak_breakdown(self.trace, largest=self.options.top)

    @cached_property
    def intervals(self):
        from memlens.analysis.ati import access_intervals
        return access_intervals(self.trace)       # attrs["clock"]: figures built from it name the clock

    @cached_property
    def iterations(self):
        from memlens.analysis.iterations import split_iterations
        return split_iterations(self.trace)

    def require_accesses(self, what: str) -> None:
        """Raise `SectionUnavailable` explaining that `what` needs accesses, when the trace has none."""
        if not self.trace.has_accesses:
            source = self.trace.metadata.get("source_kind", "unknown")
            raise SectionUnavailable(
                f"{what} needs per-access data (which op read or wrote each block); this trace (source: "
                f"{source}) records only allocations and frees. Record the run with memlens.record to get "
                "accesses.")


def run_section(key: str, title: str, builder: Callable[[ReportContext], list], ctx: ReportContext) -> Section:
    """Build one section, turning a missing-data condition or a failure into a visible, recorded status."""
    start = time.perf_counter()
    section = Section(key=key, title=title)
    try:
        section.parts = list(builder(ctx))
    except (SectionUnavailable, NeedsAccessesError) as exc:
        section.status, section.message = "unavailable", str(exc)
        section.parts = [note(str(exc), "unavailable")]
    except Exception as exc:  # one failing analysis must not kill the report: record and show it
        section.status = "error"
        section.message = f"{type(exc).__name__}: {exc}"
        detail = traceback.format_exc(limit=4)
        section.parts = [note(f"This section failed: {section.message}", "error"),
                         Safe(f"<details><summary>traceback</summary><pre>{esc(detail)}</pre></details>")]
    section.seconds = time.perf_counter() - start
    return section
