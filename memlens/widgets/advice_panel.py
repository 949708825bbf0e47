"""The advisor in a notebook: the memory / time frontier of the verified plans; clicking a point shows that
plan's memory timeline beside the baseline's, its changes in words and its code.

`AdviceExplorer(advice)` (or `memlens.widgets.explore(advice)`; also the "advice" tab of the trace explorer,
``explore(trace, advice=advice)``) lays out the frontier (`memlens.viz.advice.frontier_figure`, a plotly
FigureWidget for its click events) beside the selected plan's details, the timeline below, and the ranked
table in a second tab. `select(rank)` is the handler a click calls, public so that tests drive the widget
without a browser; `plan_html` and `ranked_html` are the plain text it shows. Every figure and sentence is
drawn from one `plan_points` table.
"""
from __future__ import annotations

import html

import ipywidgets as W
import plotly.graph_objects as go

from memlens.errors import InputError
from memlens.units import format_bytes
from memlens.viz.advice import advice_clock, frontier_figure, frontier_sentence, plan_points, plan_timeline_figure
from memlens.viz.labels import safe
from memlens.widgets.drawing import show_figure

DETAILS_WIDTH_PX = 460
PROMPT = "<i>Click a point of the frontier to see that plan's memory timeline, its changes and its code.</i>"


def _ms(v) -> str:
    return "n/a" if v is None or v != v else f"{v / 1e6:.2f} ms"


def plan_html(advice, points, rank: int) -> str:
    """The plan of `rank` (1-based, `plan_points` row) in words: fits, device memory, modeled step time
    against the baseline, its changes, what each frees, its error, and its snippet (all escaped)."""
    row = points.iloc[int(rank) - 1]
    plan = advice.plans[int(rank) - 1]
    cap = "the GPU's memory" if advice.capacity is None else format_bytes(advice.capacity)
    verdict = "error" if row["error"] is not None else (f"fits {cap}" if row["fits"] else f"does not fit {cap}")
    lines = [f"<b>#{int(row['rank'])}: {safe(row['changes'])}</b>",
             f"{safe(verdict)}; needs {safe(format_bytes(row['device_bytes_needed']))} per rank "
             f"(peak allocated {safe(format_bytes(row['peak_allocated']))}, reserved "
             f"{safe(format_bytes(row['peak_reserved']))}); modeled step {_ms(row['step_ns'])} against "
             f"{_ms(row['baseline_step_ns'])} as it is"]
    if row["error"] is not None:
        lines.append(f"<span style='color:#b00'>{safe(row['error'])}</span>")
    lines += [f"&bull; {safe(f)}" for f in plan.freed]
    if not row["has_timeline"]:
        lines.append("<i>No timeline: only the baseline's and the frontier plans' predictions are kept.</i>")
    lines.append(f"<pre class='memlens-advice-snippet'>{html.escape(plan.snippet)}</pre>")
    return (f"<div class='memlens-advice-plan' data-rank='{int(row['rank'])}' style='white-space:normal'>"
            + "<br>".join(lines) + "</div>")


def ranked_html(points) -> str:
    """The ranked plans as an HTML table (escaped): rank, fits, device memory, step time, changes."""
    rows = "".join(
        f"<tr><td>{int(r.rank)}</td><td>{'error' if r.error is not None else r.fits}</td>"
        f"<td style='text-align:right'>{safe(format_bytes(r.device_bytes_needed))}</td>"
        f"<td style='text-align:right'>{_ms(r.step_ns)}</td><td>{safe(r.changes)}</td></tr>"
        for r in points.itertuples(index=False))
    return ("<table class='memlens-advice-table'><tr><th>#</th><th>fits</th><th>needs per rank</th>"
            f"<th>step (modeled)</th><th>changes</th></tr>{rows}</table>")


class AdviceExplorer(W.VBox):
    """The frontier, the selected plan and its timeline; see the module docstring."""

    def __init__(self, advice):
        self.advice = advice
        self.points = plan_points(advice)
        self.selected: int | None = None
        self.timeline_figure = None
        clock = advice_clock(advice)
        self.frontier = go.FigureWidget(frontier_figure(self.points, advice.capacity, clock))
        for t in self.frontier.data:
            t.on_click(self._on_point_click)
        self.summary = W.HTML(f"<span>{safe(advice.summary())}. {safe(frontier_sentence(self.points, advice.capacity))}"
                              "</span>")
        self.details = W.HTML(PROMPT, layout=W.Layout(width=f"{DETAILS_WIDTH_PX}px", flex=f"0 0 {DETAILS_WIDTH_PX}px",
                                                       max_height="440px", overflow="auto"))
        self.details.add_class("memlens-advice-details")
        self.timeline_output = W.Output()
        notes = "".join(f"<li>{safe(n)}</li>" for n in advice.notes)
        tabs = W.Tab([W.VBox([W.HBox([self.frontier, self.details], layout=W.Layout(flex_flow="row wrap")),
                              self.timeline_output]),
                      W.HTML(ranked_html(self.points) + (f"<ul>{notes}</ul>" if notes else ""))])
        tabs.set_title(0, "frontier")
        tabs.set_title(1, "ranked plans")
        super().__init__([self.summary, tabs])
        self.add_class("memlens-advice")
        first = advice.best or advice.closest
        if first is not None:
            self.select(next(i for i, p in enumerate(advice.plans, 1) if p is first))

    def select(self, rank: int) -> str:
        """Show the plan of `rank` (1-based, the advice's order): its words and snippet, and its memory timeline
        beside the baseline's when its trace was kept. Returns the details' HTML."""
        rank = int(rank)
        if not 1 <= rank <= len(self.advice.plans):
            raise InputError(f"no plan #{rank}: the advice has {len(self.advice.plans)} plans")
        self.selected = rank
        plan = self.advice.plans[rank - 1]
        self.details.value = plan_html(self.advice, self.points, rank)
        if plan.trace is not None:
            self.timeline_figure = plan_timeline_figure(self.advice, plan)
            show_figure(self.timeline_output, self.timeline_figure)
        else:
            self.timeline_figure = None
            self.timeline_output.outputs = ()
        return self.details.value

    def _on_point_click(self, trace, points, selector):
        if points.point_inds:
            self.select(int(trace.customdata[points.point_inds[0]]))


def explore_advice(advice) -> AdviceExplorer:
    """The advice widget for `advice` (an `Advice` of `memlens.advise`)."""
    if not hasattr(advice, "plans") or not hasattr(advice, "baseline"):
        raise InputError(f"explore_advice takes the Advice memlens.advise returns, not {type(advice).__name__}")
    return AdviceExplorer(advice)
