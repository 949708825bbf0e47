"""A run selector for a `RunSet` (the ranks of one job), linked to the explorer's timeline.

A dropdown lists the runs with their peaks (`RunSet.peaks`); picking one shows that run in an `Explorer`
(timeline, filters, details, ATI, what-if) below it, on the same device when the run has it, else on the
run's highest-peaking device. Only the run on screen is loaded (`RunSet.trace` keeps the last few), so a
job of many ranks costs one trace's memory. `select` is the handler the dropdown calls, public so tests
drive the widget without a browser.
"""
from __future__ import annotations

import ipywidgets as W

from memlens.errors import InputError
from memlens.units import format_bytes
from memlens.viz.labels import safe
from memlens.widgets.explorer import Explorer


def _run_label(peaks, rank: int, name: str) -> str:
    """``rank N: peak X on cuda:0`` (the run's largest device peak)."""
    mine = peaks[peaks["rank"] == rank]
    if not len(mine):
        return name
    top = mine.sort_values(["allocated_bytes", "device"], ascending=[False, True]).iloc[0]
    return f"{name}: peak {format_bytes(int(top['allocated_bytes']))} on {top['device']}"


class RunExplorer(W.VBox):
    """Run selector + the explorer of the selected run. Build with `explore_runs`."""

    def __init__(self, runs, rank: int | None = None):
        self.runs = runs
        peaks = runs.peaks()
        if rank is None:  # the run that peaks highest: where a memory problem of the job shows first
            top = peaks.sort_values(["allocated_bytes", "rank"], ascending=[False, True])
            rank = int(top["rank"].iloc[0]) if len(top) else runs.runs[0].rank
        self.w_run = W.Dropdown(options=[(_run_label(peaks, r.rank, r.name), r.rank) for r in runs.runs],
                                value=None, description="run", style={"description_width": "initial"},
                                layout=W.Layout(width="420px"))
        self.imbalance = W.HTML(f"<span>{safe(runs.imbalance())}</span>" if len(runs) > 1 else "")
        self.explorer: Explorer | None = None
        super().__init__([W.HBox([self.w_run, self.imbalance])])
        self.add_class("memlens-run-explorer")
        self.select(rank)
        self.w_run.observe(self._on_run, names="value")

    @property
    def rank(self) -> int:
        """The rank on screen."""
        return int(self.w_run.value)

    def select(self, rank: int) -> Explorer:
        """Show run `rank` (an int) in the explorer, keeping the device when that run has it."""
        run = self.runs.run(int(rank))
        trace = self.runs.trace(run.rank)
        device = self.explorer.state.device if self.explorer is not None else None
        if device not in (trace.devices or []):
            device = None
        self.explorer = Explorer(trace, device=device)
        if self.w_run.value != run.rank:
            self._syncing = True
            try:
                self.w_run.value = run.rank
            finally:
                self._syncing = False
        self.children = [self.children[0], self.explorer]
        return self.explorer

    _syncing = False

    def _on_run(self, change):
        if self._syncing or change["new"] is None:
            return
        self.select(int(change["new"]))


def explore_runs(runs, rank: int | None = None) -> RunExplorer:
    """The run selector for `runs` (a `RunSet`, or a glob / list of paths `memlens.load_many` reads),
    showing run `rank` first (default: the one that peaks highest)."""
    from memlens.analysis.runs import RunSet, load_many
    if not isinstance(runs, RunSet):
        runs = load_many(runs)
    if not len(runs):
        raise InputError("no runs to show (the RunSet is empty)")
    return RunExplorer(runs, rank=rank)
