"""The HTML page of a diff (`memlens diff A B -o diff.html`): same offline, escaped page as the report."""
from __future__ import annotations

import pandas as pd

from memlens.reporting.markup import bullet_list, bytes_text, note, ns_text, paragraph, table
from memlens.reporting.sections.base import SectionUnavailable, run_section
from memlens.units import format_bytes


def _signed(v) -> str:
    return "" if pd.isna(v) else ("+" if v >= 0 else "-") + format_bytes(abs(v))


BYTES = {"peak_a": bytes_text, "peak_b": bytes_text, "delta": _signed, "bytes_a": bytes_text,
         "bytes_b": bytes_text, "size": bytes_text, "delta_bytes": _signed, "peak_ns_a": ns_text, "peak_ns_b": ns_text, "alloc_ns": ns_text, "free_ns": ns_text,
         "ratio": lambda v: "" if pd.isna(v) else f"{v:.3f}"}


class _DiffContext:
    def __init__(self, d, top: int):
        self.d = d
        self.top = top


def _summary(ctx) -> list:
    d = ctx.d
    return [paragraph(f"A: {d.name_a} ({d.source_a}). B: {d.name_b} ({d.source_b})."), bullet_list(d.summary())]


def _overlay(ctx) -> list:
    from memlens.viz.diff import diff_figure
    return [diff_figure(ctx.d)]


def _peak(ctx) -> list:
    d = ctx.d
    if len(d.peak) == 0:
        raise SectionUnavailable("the traces share no device to compare")
    parts = [table(d.peak, BYTES)]
    for by, frame in d.at_peak.items():
        if any(c.startswith(f"live memory at the peak by {by}:") for c in d.cannot_compare):
            continue
        parts += [paragraph(f"Live at the peak by {by} (largest changes first)"),
                  table(frame.head(ctx.top), BYTES)]
    return parts


def _stacks(ctx) -> list:
    d = ctx.d
    frame = getattr(d, "stacks", None)
    if frame is None or len(frame) == 0:
        raise SectionUnavailable("no stack holds different bytes at the two peaks")
    from memlens.analysis.stack_diff import stack_sentence
    parts = [paragraph(stack_sentence(frame) + " A stack is its Python frames, innermost first ('<' reads "
                       "'called from'); blocks without one are keyed by their allocation site.")]
    note_text = next((c for c in d.cannot_compare if c.startswith("stacks at the peak")), None)
    if note_text:
        parts.append(note(note_text))
    return parts + [table(frame.head(ctx.top), BYTES)]


def _blocks(ctx) -> list:
    d = ctx.d
    bl = d.blocks
    parts = [paragraph(f"Signature: ({', '.join(bl['signature'])}, order). {bl['matched']:,} blocks in both, "
                       f"{bl['appeared']:,} only in B ({format_bytes(bl['appeared_bytes'])}), {bl['disappeared']:,} "
                       f"only in A ({format_bytes(bl['disappeared_bytes'])}).")]
    for label, frame in (("Largest blocks only in B (appeared)", d.appeared),
                         ("Largest blocks only in A (disappeared)", d.disappeared)):
        parts.append(paragraph(label))
        parts.append(table(frame.head(ctx.top), BYTES) if len(frame) else note("none"))
    parts += [paragraph("Allocations per allocating op (largest byte changes first)"),
              table(d.by_op.head(ctx.top), BYTES)]
    if d.op_counts is not None:
        parts += [paragraph("Ops executed per name (largest changes first)"), table(d.op_counts.head(ctx.top))]
    return parts


def _iterations(ctx) -> list:
    it = ctx.d.iterations
    if "table" not in it:
        raise SectionUnavailable(next((c for c in ctx.d.cannot_compare if c.startswith("iterations")),
                                      "iterations could not be aligned"))
    fmt = {c: (bytes_text if "bytes" in c else ns_text if c.endswith("_ns_a") or c.endswith("_ns_b") else str)
           for c in it["table"].columns if c != "iteration"}
    return [paragraph(f"{it['count_a']} iterations in A ({it['source_a']}), {it['count_b']} in B ({it['source_b']}); "
                      "aligned by index."), table(it["table"].head(max(ctx.top, 50)), fmt)]


def _ati(ctx) -> list:
    d = ctx.d
    if d.ati is None:
        raise SectionUnavailable(next((c for c in d.cannot_compare if c.startswith("access time")), "no ATI"))
    rows = pd.DataFrame({"statistic": list(d.ati["a"]), "A": list(d.ati["a"].values()),
                         "B": list(d.ati["b"].values()), "B - A": list(d.ati["delta"].values())})
    fmt = {c: (lambda v: "" if v is None or pd.isna(v) else f"{v:,.0f}") for c in ("A", "B", "B - A")}
    by_cat = d.ati["by_category"]
    ns_fmt = {c: ns_text for c in by_cat.columns if "_ns_" in c}
    return [table(rows, fmt), paragraph("Times in ns; count is the number of intervals."),
            paragraph("By category (A, B)"), table(by_cat, ns_fmt)]


def _not_compared(ctx) -> list:
    items = ctx.d.cannot_compare
    return [bullet_list(items)] if items else [paragraph("Everything could be compared.")]


DIFF_SECTIONS = (("summary", "Summary", _summary), ("overlay", "Live memory, both runs", _overlay),
                 ("peak", "Peak and what is live at it", _peak),
                 ("stacks", "Call stacks at the peak: appeared, vanished, grew", _stacks), ("blocks", "Blocks that appear or disappear", _blocks),
                 ("iterations", "Iterations", _iterations), ("ati", "Access time intervals", _ati),
                 ("not_compared", "What could not be compared", _not_compared))


def diff_report(d, path, top: int = 20):
    """Write the HTML page of TraceDiff `d` to `path` (atomic); returns the `Report` written."""
    from memlens.reporting import Report

    from memlens.analysis.stack_diff import has_stacks

    ctx = _DiffContext(d, top)
    # without a stack in either trace the page says nothing about stacks (the blocks by op compare the sites)
    no_stacks = d.trace_a is not None and not (has_stacks(d.trace_a) or has_stacks(d.trace_b))
    sections = [run_section(key, title, fn, ctx) for key, title, fn in DIFF_SECTIONS
                if not (key == "stacks" and no_stacks)]
    built = Report(title="memlens diff", subtitle=f"A: {d.name_a}  vs  B: {d.name_b}", sections=sections)
    built.write(path)
    return built
