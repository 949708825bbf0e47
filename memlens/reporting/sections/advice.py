"""Report section: the advisor's answer (`memlens.advise`), when the report is given one (``advice=``).

The ranked table, the memory / time frontier chart, and each plan's changes in words with its code. The
sentence above the chart and the table are written from the same `memlens.viz.advice.plan_points` rows the
chart draws, so they cannot disagree. The step times are modeled (the plans' predicted GPU clock), whatever
clock the report's trace is on; the heading says so.
"""
from __future__ import annotations

from memlens.reporting.markup import bullet_list, bytes_text, note, paragraph, table, tag
from memlens.reporting.sections.base import ReportContext, SectionUnavailable
from memlens.units import format_bytes

TABLE_COLUMNS = ("rank", "fits", "changes", "device_bytes_needed", "peak_allocated", "peak_reserved", "step_ns",
                 "baseline_step_ns", "delta_ns", "on_frontier", "error")


def _missing(v) -> bool:
    """True for a figure or text a plan lacks: None, or the NaN pandas puts in its place in a column where
    other plans have one (the error column as soon as one plan failed, the bytes once one is missing)."""
    import pandas as pd
    return v is None or (not isinstance(v, str) and bool(pd.isna(v)))


def _delta(v) -> str:
    from memlens.units import format_ns
    if v is None or v != v:
        return ""
    return ("+" if v > 0 else "-" if v < 0 else "") + format_ns(abs(v))


def advice(ctx: ReportContext) -> list:
    """The ranked plans, the frontier figure and each plan's changes and snippet."""
    from memlens.viz.advice import advice_clock, frontier_figure, frontier_sentence, plan_points

    given = ctx.options.advice
    if given is None:
        raise SectionUnavailable("no advice was given to this report (memlens.report(..., advice=memlens.advise(...)) "
                                 "or `memlens advise --report FILE`)")
    points = plan_points(given)
    clock = advice_clock(given)
    parts = [paragraph(f"{given.summary()}."),
             paragraph(f"Every plan was predicted again with its change applied (step times on the {clock}, "
                       f"device memory per rank: peak reserved plus the CUDA context and NCCL buffers). "
                       f"{frontier_sentence(points, given.capacity)}.")]
    if given.notes:
        parts.append(note(bullet_list(given.notes)))
    shown = points[list(TABLE_COLUMNS)]
    size = {c: bytes_text for c in ("device_bytes_needed", "peak_allocated", "peak_reserved")}
    parts.append(table(shown, {"fits": lambda v: "error" if _missing(v) else str(bool(v)), "delta_ns": _delta,
                               "on_frontier": lambda v: "yes" if v else "",
                               "error": lambda v: "" if _missing(v) else str(v), **size},
                       {"rank": "#", "device_bytes_needed": "needs per rank", "peak_allocated": "peak allocated",
                        "peak_reserved": "peak reserved", "step_ns": "step (modeled)",
                        "baseline_step_ns": "as it is", "delta_ns": "vs as it is", "on_frontier": "frontier"}))
    if points["step_ms"].notna().any():
        parts.append(frontier_figure(points, given.capacity, clock))
    for plan, row in zip(given.plans, points.itertuples(index=False)):
        parts.append(tag("h3", f"#{row.rank}: {row.changes}"))
        if not _missing(row.error):
            words = [f"error: {row.error}"]
        else:
            words = ["fits" if row.fits else "does not fit"]
            if not _missing(row.device_bytes_needed):
                words.append(f"needs {format_bytes(int(row.device_bytes_needed))} per rank")
            if not _missing(row.step_ms):
                words.append(f"modeled step {row.step_ms:.2f} ms")
        parts.append(paragraph("; ".join(words) + "."))
        if plan.freed:
            parts.append(bullet_list(plan.freed))
        parts.append(tag("pre", plan.snippet, cls="memlens-advice-snippet"))
    return parts
