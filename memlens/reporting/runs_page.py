"""One HTML report for several runs (the ranks of a job): their peaks side by side, and a run selector.

``memlens report rank0.json rank1.json ... -o job.html`` writes it. The top of the page compares the runs
(a bar per run and device: peak allocated bytes and, when the files record it, peak reserved bytes; the
imbalance sentence; the peaks table). Below, a selector shows one run's own report sections at a time;
clicking a run's bar selects it too. Runs are loaded one at a time (`RunSet.trace`), so the page for 64
ranks never holds 64 traces. Self-contained and offline like the single-run report (`page.document`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from memlens.reporting.markup import Safe, esc, script_json, tag

DEFAULT_SECTIONS = ("summary", "live", "peak", "largest")

SELECT_JS = """
(function(){
  function setup(){
    var sel=document.getElementById('memlens-run-select');
    function show(){
      var v=sel.value, runs=document.querySelectorAll('div.memlens-run');
      for(var i=0;i<runs.length;i++){
        var on=runs[i].getAttribute('data-run')===v;
        runs[i].style.display=on?'':'none';
        if(on&&window.Plotly){
          var figs=runs[i].querySelectorAll('.memlens-figure');
          for(var j=0;j<figs.length;j++){try{Plotly.Plots.resize(figs[j]);}catch(e){}}
        }
      }
      document.body.setAttribute('data-run-shown',v);
    }
    sel.addEventListener('change',show);
    var bars=document.getElementById('memlens-runs-peaks');
    if(bars&&bars.on){bars.on('plotly_click',function(ev){
      var p=ev.points&&ev.points[0]; if(!p||p.customdata===undefined)return;
      sel.value=String(p.customdata); show();
    });}
    show();
  }
  if(document.readyState==='loading'){document.addEventListener('DOMContentLoaded',setup);}else{setup();}
})();
"""


@dataclass
class RunsReport:
    """A built multi-run report: the `RunSet`, each run's `memlens.reporting.Report`, and the HTML."""

    title: str
    runset: object
    reports: list = field(default_factory=list)
    seconds: float = 0.0
    notes: list = field(default_factory=list)   # sentences shown above the comparison (e.g. "predicted")
    peaks: object = None   # a `RunSet.peaks()` frame to show instead of the runs' own (a prediction's numbers)
    shown_paths: dict = field(default_factory=dict)  # run path -> what the page says instead (a deleted file)

    def shown(self, path: str) -> str:
        """What the page shows for a run's `path`: the path, or what `shown_paths` says instead."""
        return self.shown_paths.get(path, path)

    def status(self) -> dict:
        """{run name: {section key: status}}."""
        return {r.name: rep.status() for r, rep in zip(self.runset.runs, self.reports)}

    def html(self) -> str:
        from plotly.offline import get_plotlyjs

        from memlens.reporting.page import BOOT, STYLE, figure_block
        from memlens.analysis.runs import imbalance_sentence, imbalance_stats
        peaks = self.peaks if self.peaks is not None else self.runset.peaks()
        peaks = peaks.assign(path=[self.shown(p) for p in peaks["path"]])
        overview = [*(tag("p", n) for n in self.notes), tag("p", imbalance_sentence(imbalance_stats(peaks))),
                    figure_block(peaks_figure(peaks), "memlens-runs-peaks"), _peaks_table(peaks)]
        options = "".join(f'<option value="{i}">{esc(r.name)} - {esc(self.shown(r.path))}</option>'
                          for i, r in enumerate(self.runset.runs))
        selector = Safe(f'<label for="memlens-run-select"><b>Run shown below:</b></label> '
                        f'<select id="memlens-run-select">{options}</select>')
        blocks, n_fig, statuses = [], 0, []
        for i, (run, rep) in enumerate(zip(self.runset.runs, self.reports)):
            body = [tag("h2", f"{run.name}: {rep.subtitle}")]
            for s in rep.sections:
                parts = []
                for part in s.parts:
                    if isinstance(part, str):
                        parts.append(esc(part))
                    else:
                        n_fig += 1
                        parts.append(figure_block(part, f"memlens-fig-{n_fig}"))
                body.append(f'<section id="run{i}-{esc(s.key)}">{tag("h2", s.title)}{"".join(parts)}</section>')
                statuses.append({"run": run.name, **s.to_dict()})
            blocks.append(f'<div class="memlens-run" data-run="{i}">{"".join(body)}</div>')
        status_json = script_json(json.dumps({"runs": [r.name for r in self.runset.runs], "sections": statuses},
                                             default=str))
        subtitle = f"{len(self.runset)} runs - {', '.join(r.name for r in self.runset.runs[:16])}" \
                   f"{', ...' if len(self.runset) > 16 else ''}"
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
                "script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:; "
                "font-src data:\">"
                f"<title>{esc(self.title)}</title><style>{STYLE}</style>"
                f"<script>{get_plotlyjs()}</script></head><body>"
                f"<header>{tag('h1', self.title)}{tag('p', subtitle)}</header><main>"
                f'<section id="runs">{tag("h2", "Runs compared: peak memory per run")}{"".join(overview)}'
                f"{selector}</section>{''.join(blocks)}</main>"
                f'<script type="application/json" id="memlens-report-status">{status_json}</script>'
                f"<script>{BOOT}</script><script>{SELECT_JS}</script></body></html>\n")

    def write(self, path):
        """Write the HTML atomically (a temporary sibling renamed into place); returns the path."""
        from memlens.reporting.page import write_html
        return write_html(self.html(), path)


def peaks_figure(peaks):
    """Grouped bars: peak allocated (and reserved, where known) bytes per run and device, in the binary unit
    that suits the largest (the unit the table beside it uses for such values). Each bar's ``customdata`` is
    the run's index in the set (the page's selector uses it)."""
    import pandas as pd
    import plotly.graph_objects as go

    from memlens.viz.labels import byte_unit
    runs = list(dict.fromkeys(peaks["run"]))
    index = {r: i for i, r in enumerate(runs)}
    largest = max([0.0] + [float(v) for v in (peaks["allocated_bytes"].max(), peaks["reserved_bytes"].max())
                           if len(peaks) and not pd.isna(v)])
    div, unit = byte_unit(largest)
    fig = go.Figure()
    for dev, rows in peaks.groupby("device", sort=True):
        x = [f"{r}" for r in rows["run"]]
        custom = [index[r] for r in rows["run"]]
        fig.add_bar(name=f"{dev} allocated", x=x, y=rows["allocated_bytes"].to_numpy() / div, customdata=custom,
                    hovertemplate=f"%{{x}}: %{{y:.3f}} {unit} allocated at the peak<extra>" + esc(dev) + "</extra>")
        reserved = rows["reserved_bytes"]
        if reserved.notna().any():
            fig.add_bar(name=f"{dev} reserved", x=x, y=reserved.astype("Float64").fillna(0).to_numpy() / div,
                        customdata=custom, opacity=0.55,
                        hovertemplate=f"%{{x}}: %{{y:.3f}} {unit} reserved<extra>" + esc(dev) + "</extra>")
    fig.update_layout(barmode="group", height=360, margin=dict(l=60, r=20, t=30, b=40),
                      yaxis_title=f"peak ({unit})", xaxis_title="run (click a bar to show it below)")
    return fig


def _peaks_table(peaks) -> Safe:
    from memlens.reporting.markup import table
    from memlens.units import format_bytes, format_ns
    cols = ["run", "device", "allocated_bytes", "reserved_bytes", "peak_ns", "clock", "top_category", "op_at_peak",
            "rank_source", "path"]
    import pandas as pd
    fmt = {"allocated_bytes": format_bytes,
           "reserved_bytes": lambda v: "n/a" if pd.isna(v) else format_bytes(v),
           "peak_ns": lambda v: "n/a" if pd.isna(v) else format_ns(v)}
    return table(peaks[cols], formats=fmt, headers={"allocated_bytes": "peak allocated",
                                                    "reserved_bytes": "peak reserved", "peak_ns": "when"})


def build_runs_report(runs, *, title: str | None = None, sections=DEFAULT_SECTIONS, shown_paths: dict | None = None,
                      **options) -> RunsReport:
    """Build the multi-run report of `runs` (a `RunSet`, or paths / a glob for `load_many`). `sections` are
    each run's report sections (default: summary, live memory, peak, largest blocks); `shown_paths` ({run
    path: text}) says what the page shows instead of a path that will not exist (a temporary file);
    `options` as `memlens.reporting.build_report`."""
    import time

    from memlens.analysis.runs import RunSet, load_many
    from memlens.reporting import build_report
    runset = runs if isinstance(runs, RunSet) else load_many(runs)
    start = time.perf_counter()
    runset.peaks()  # parallel, once
    shown_paths = dict(shown_paths or {})
    reports = [build_report(runset.trace(r.rank), sections=list(sections),
                            source_name=shown_paths.get(r.path, r.path), **options) for r in runset.runs]
    return RunsReport(title=title or f"memlens report: {len(runset)} runs", runset=runset, reports=reports,
                      seconds=time.perf_counter() - start, shown_paths=shown_paths)
