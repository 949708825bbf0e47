"""Notebook widgets: `explore(trace)` returns the linked explorer (timeline, filters, details, ATI, what-if).

    import memlens.widgets
    memlens.widgets.explore(trace)          # or, after %load_ext memlens, just evaluate `trace`
    memlens.widgets.explore(memlens.load_many("job/rank*.pt.trace.json.gz"))   # a run selector + explorer
    memlens.widgets.explore(memlens.advise(...))  # the advisor's frontier; click a plan for its timeline

The widget's logic lives in plain modules (`state`, `geometry`, `lod`, `timeline`, `details`, `ati_panel`,
`whatif_panel`, `advice_panel`'s `plan_html`) so it runs and is tested without a browser; `explorer` and
`advice_panel` wire it to ipywidgets and plotly.
"""
from __future__ import annotations


def explore(trace, device: str | None = None, advice=None):
    """The explorer widget for `trace` (a Trace or a path `memlens.load` reads); see `memlens.widgets.explorer`.
    A `RunSet` (`memlens.load_many`) gets the run selector linked to the explorer (`explore_runs`); an
    `Advice` (`memlens.advise`) its frontier widget (`memlens.widgets.advice_panel`); `advice` adds that
    widget to the trace explorer as an "advice" tab."""
    from memlens.advice.result import Advice
    from memlens.analysis.runs import RunSet
    if isinstance(trace, RunSet):
        return explore_runs(trace)
    if isinstance(trace, Advice):
        from memlens.widgets.advice_panel import explore_advice
        return explore_advice(trace)
    from memlens.widgets.explorer import explore as _explore
    return _explore(trace, device=device, advice=advice)


def explore_runs(runs, rank: int | None = None):
    """The run selector of a `RunSet` (or a glob of files) linked to the explorer; see `memlens.widgets.runs`."""
    from memlens.widgets.runs import explore_runs as _explore_runs
    return _explore_runs(runs, rank=rank)


__all__ = ["explore", "explore_runs"]
