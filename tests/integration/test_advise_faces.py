"""The advisor's faces: which plans keep their predicted trace (against a brute-force frontier), the frontier
figure and its words (one table), the notebook widget driven through its click handler, and the report's
Advice section; on hand-made plans with hand-made traces whose numbers are known, and on a real advice."""
from __future__ import annotations

import base64
import html
import random

import numpy as np
import pandas as pd
import pytest

from _advice_cases import NET, STEP
from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)
from memlens.advice import Advice, Plan
from memlens.trace.schema import make_clock
from memlens.trace import Trace

MiB = 1 << 20
HOSTILE = "<img src=x onerror=alert(1)>"


def timeline_trace(sizes_mib, step_ns: int) -> Trace:
    """Blocks of `sizes_mib` MiB on cuda:0, block k allocated at k * 1000 ns and all freed at `step_ns`: live
    bytes peak at their sum, on a modeled clock."""
    n = len(sizes_mib)
    blocks = pd.DataFrame({"block_id": range(n), "device": "cuda:0", "size": [s * MiB for s in sizes_mib],
                           "alloc_ns": [k * 1000 for k in range(n)], "free_ns": [step_ns] * n,
                           "category": "activation"})
    return Trace.from_tables(blocks, metadata={"source_kind": "test", "clock": make_clock("modeled", gpu="H100 SXM")})


def hand_made_advice(capacity_mib: int = 850) -> Advice:
    """Six plans with known figures (MiB per rank, ms of modeled step):
    baseline 1000 / 3.0 (no fit); A 800 / 3.5 (fits, frontier); B 850 / 4.0 (fits at exactly the capacity,
    beaten by A); C 700 / 5.0 (fits, frontier); E 900 / 3.2 (a hostile module name, frontier); D fails."""
    def plan(checkpoint=None, needed=0, ms=0.0, peak=(), **kw):
        return Plan(checkpoint=checkpoint or {}, peak_allocated=sum(peak) * MiB, peak_reserved=(needed - 500) * MiB,
                    device_bytes_needed=needed * MiB, fits=needed <= capacity_mib, step_ns=int(ms * 1e6),
                    baseline_step_ns=3_000_000, verified=True, trace=timeline_trace(peak, int(ms * 1e6)), **kw)
    baseline = plan(needed=1000, ms=3.0, peak=(300, 200, 100))
    a = plan({"layers.0": "full"}, 800, 3.5, (200, 100, 50), freed=["layers.0 (full): 100 MiB off the peak"])
    b = plan({"layers.0": "full", "layers.1": "full"}, 850, 4.0, (150, 100))
    c = plan({}, 700, 5.0, (100, 100), autocast="bfloat16")
    e = plan({HOSTILE: "selective"}, 900, 3.2, (250, 200))
    d = Plan(checkpoint={"layers.2": "offload"}, error="RuntimeError: boom", fits=False, verified=True)
    return Advice([baseline, a, b, c, e, d], baseline, capacity_mib * MiB, "fit", ["a note <b>"])


def brute_frontier(plans):
    """Plans no other plan beats: q beats p when it is no slower and needs no more, and is earlier in the
    order (step, bytes, number of changes, place in `plans`) that breaks exact ties."""
    from memlens.advice.result import _n_changes
    ok = [p for p in plans if p.error is None and p.step_ns is not None and p.device_bytes_needed is not None]
    place = {id(p): i for i, p in enumerate(plans)}

    def key(p):
        return (p.step_ns, p.device_bytes_needed, _n_changes(p), place[id(p)])
    return [p for p in ok if not any(q is not p and q.step_ns <= p.step_ns and q.device_bytes_needed <=
                                     p.device_bytes_needed and key(q) < key(p) for q in ok)]


# ---- which plans keep their trace -------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(25))
def test_traces_kept_during_the_search_are_the_frontier_so_far(seed):
    from memlens.advice.result import keep_frontier_traces
    rng = random.Random(seed)
    seen = []
    for i in range(rng.randint(1, 14)):
        p = Plan(step_ns=rng.randint(1, 6), device_bytes_needed=rng.randint(1, 6), trace=object(),
                 checkpoint={f"l{k}": "full" for k in range(rng.randint(0, 2))})
        if rng.random() < 0.15:
            p.error, p.step_ns = "failed", None
        seen.append(p)
        keep_frontier_traces(seen, seen[0])
        want = {id(q) for q in brute_frontier(seen)} | {id(seen[0])}
        assert {id(q) for q in seen if q.trace is not None} == want


def test_advice_keeps_traces_of_the_baseline_and_the_frontier_only():
    advice = hand_made_advice()
    kept = [p.changes for p in advice.plans if p.trace is not None]
    assert sorted(kept) == sorted(["no change", "checkpoint layers.0 (full)", "autocast bfloat16 (changes the numerics)",
                                   f"checkpoint {HOSTILE} (selective: GEMM and attention outputs kept)"])


# ---- one table for the chart and the words ----------------------------------------------------------------------
def test_points_figure_and_sentence_agree_with_the_plans():
    from memlens.viz.advice import frontier_figure, frontier_sentence, plan_points
    advice = hand_made_advice()
    points = plan_points(advice)
    assert list(points["rank"]) == list(range(1, 7))
    assert list(points["changes"]) == [p.changes for p in advice.plans]
    front = brute_frontier(advice.plans)
    assert list(points["on_frontier"]) == [any(p is q for q in front) for p in advice.plans]
    fig = frontier_figure(points, advice.capacity)
    by_name = {t.name: t for t in fig.data}
    # the frontier line: fastest first, each point its plan's (ms, bytes), customdata its rank
    fastest_first = sorted(front, key=lambda p: p.step_ns)
    assert list(by_name["frontier"].x) == [p.step_ns / 1e6 for p in fastest_first]
    assert list(by_name["frontier"].y) == [p.device_bytes_needed for p in fastest_first]
    ranks = [advice.plans.index(p) + 1 for p in fastest_first]
    assert list(by_name["frontier"].customdata) == ranks
    others = [p for p in advice.plans if p.error is None and not any(p is q for q in front)]
    assert sorted(by_name["other plans"].y) == sorted(p.device_bytes_needed for p in others)
    assert [s.y0 for s in fig.layout.shapes] == [850 * MiB]
    assert all(HOSTILE not in t for tr in fig.data for t in tr.text)
    # frontier: baseline 3.0 ms / 1000 MiB, E 3.2 / 900, A 3.5 / 800, C 5.0 / 700; A, C and B (exactly at the
    # capacity) fit 850 MiB
    text = frontier_sentence(points, advice.capacity)
    assert "6 plans verified, 5 with a modeled step time (3 of 6 fit 850.0 MiB)" in text
    assert "the frontier holds 4" in text
    rank_c = advice.plans.index(next(p for p in advice.plans if p.autocast)) + 1
    assert f"least memory #{rank_c} (autocast bfloat16 (changes the numerics)): 5.00 ms, 700.0 MiB" in text
    assert f"fastest #{advice.plans.index(advice.baseline) + 1} (no change): 3.00 ms, 1000.0 MiB" in text


def test_plan_timeline_is_the_plan_beside_the_baseline():
    from memlens.viz.advice import plan_timeline_figure
    advice = hand_made_advice()
    a = next(p for p in advice.plans if p.changes == "checkpoint layers.0 (full)")
    fig = plan_timeline_figure(advice, a)
    lines = [t for t in fig.data if t.mode == "lines"]
    assert [max(t.y) for t in lines] == [600 * MiB, 350 * MiB]          # the sums of the blocks
    # the plan's allocator budget: 850 MiB less its context and NCCL (needed - reserved = 500 MiB)
    assert [s.y0 for s in fig.layout.shapes] == [350 * MiB]
    assert len([t for t in plan_timeline_figure(advice, advice.baseline).data if t.mode == "lines"]) == 1
    beaten = next(p for p in advice.plans if len(p.checkpoint) == 2)
    with pytest.raises(ValueError, match="only the baseline's and the frontier plans'"):
        plan_timeline_figure(advice, beaten)


# ---- the widget, driven through its click handler -----------------------------------------------------------------
def _click(widget, rank):
    """What the browser does on a click: plotly dispatches the point's index to the trace's callbacks."""
    from plotly.callbacks import Points
    for trace in widget.frontier.data:
        ranks = list(trace.customdata)
        if rank in ranks:
            i = ranks.index(rank)
            trace._dispatch_on_click(Points([i], [trace.x[i]], [trace.y[i]], trace.name, 0), None)
            return
    raise AssertionError(f"rank {rank} is not drawn")


def test_widget_click_shows_the_plans_timeline_changes_and_snippet():
    from memlens.widgets import explore
    from memlens.widgets.advice_panel import AdviceExplorer
    advice = hand_made_advice()
    w = explore(advice)
    assert isinstance(w, AdviceExplorer)
    assert w.selected == 1 and advice.plans[0].fits          # the best plan first
    c_rank = next(i for i, p in enumerate(advice.plans, 1) if p.autocast)
    _click(w, c_rank)
    assert w.selected == c_rank
    assert f"data-rank='{c_rank}'" in w.details.value and "autocast bfloat16" in w.details.value
    assert html.escape(advice.plans[c_rank - 1].snippet) in w.details.value
    assert "needs 700.0 MiB per rank" in w.details.value and "modeled step 5.00 ms against 3.00 ms" in w.details.value
    assert [max(t.y) for t in w.timeline_figure.data if t.mode == "lines"] == [600 * MiB, 200 * MiB]
    shown = w.timeline_output.outputs[0]["data"]["application/vnd.plotly.v1+json"]
    assert [t["name"] for t in shown["data"]] == [t.name for t in w.timeline_figure.data]   # the figure is shown
    # a beaten plan: its words and code, no timeline; a hostile name is escaped
    b_rank = next(i for i, p in enumerate(advice.plans, 1) if len(p.checkpoint) == 2)
    _click(w, b_rank)
    assert w.timeline_figure is None and w.timeline_output.outputs == ()
    assert "No timeline" in w.details.value
    e_rank = next(i for i, p in enumerate(advice.plans, 1) if HOSTILE in p.changes)
    w.select(e_rank)
    assert HOSTILE not in w.details.value and html.escape(HOSTILE) in w.details.value
    assert HOSTILE not in w.summary.value
    with pytest.raises(Exception, match="no plan #7"):
        w.select(7)


def test_explorer_gets_an_advice_tab():
    from memlens.widgets.explorer import explore
    advice = hand_made_advice()
    w = explore(advice.baseline.trace, advice=advice)
    assert [w._panels.get_title(i) for i in range(3)] == ["intervals (ATI)", "what-if", "advice"]
    assert w._panels.children[2] is w.advice_panel and w.advice_panel.selected == 1


# ---- the report section ---------------------------------------------------------------------------------------
def test_report_advice_section_from_the_same_table(tmp_path):
    import json
    import re

    import memlens
    from memlens.reporting import build_report
    from memlens.viz.advice import frontier_sentence, plan_points
    advice = hand_made_advice()
    trace = advice.baseline.trace
    assert "advice" not in build_report(trace, whatif=False).status()      # not given: not on the page
    assert build_report(trace, sections=["advice"]).status() == {"advice": "unavailable"}
    built = build_report(trace, whatif=False, advice=advice)
    assert built.status()["advice"] == "ok"
    page = built.html()
    section = page[page.index('<section id="advice">'):]
    section = section[:section.index("</section>")]
    assert html.escape(frontier_sentence(plan_points(advice), advice.capacity), quote=True) in section
    for p in advice.plans:
        assert html.escape(p.snippet, quote=True) in section
        assert html.escape(p.changes, quote=True) in section
    assert HOSTILE not in page and "a note &lt;b&gt;" in section
    # one failed plan (D) turns the error column's missing values into NaN: the others still read as theirs
    assert "<td>nan</td>" not in section and "nan TiB" not in section
    assert "<p>error: RuntimeError: boom.</p>" in section
    assert "<p>fits; needs 800.0 MiB per rank; modeled step 3.50 ms.</p>" in section          # A
    assert "<p>does not fit; needs 1000.0 MiB per rank; modeled step 3.00 ms.</p>" in section  # baseline
    # the figure drawn is the frontier of the same rows
    spec = re.search(r'<script type="application/json" class="memlens-figure-spec" data-target="([^"]+)">(.*?)'
                     r"</script>", section, re.S).group(2)
    data = json.loads(spec.replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&"))["data"]
    frontier = next(t for t in data if t["name"] == "frontier")
    ys = frontier["y"]          # plotly writes arrays as base64 typed arrays
    ys = np.frombuffer(base64.b64decode(ys["bdata"]), dtype=ys["dtype"]) if isinstance(ys, dict) else ys
    assert list(ys) == [1000 * MiB, 900 * MiB, 800 * MiB, 700 * MiB]
    out = memlens.report(trace, tmp_path / "r.html", whatif=False, advice=advice)
    assert '<section id="advice">' in out.read_text()


# ---- a real advice: the kept traces are the plans' predictions ----------------------------------------------------
WORKLOAD = NET + STEP


def test_real_advice_keeps_each_frontier_plans_own_trace(built_shim):
    r = run_child(WORKLOAD + """
a = memlens.advise(Net, step, gpu="H100", capacity="900MiB")
from memlens.widgets.advice_panel import AdviceExplorer
w = AdviceExplorer(a)
shown = {}
for i, p in enumerate(a.plans, 1):
    if p.trace is not None:
        w.select(i)
        shown[i] = [int(max(t.y)) for t in w.timeline_figure.data if t.mode == "lines"]
result = dict(plans=[dict(step=p.step_ns, needed=p.device_bytes_needed, error=p.error, changes=p.changes,
                          alloc=p.peak_allocated, kept=p.trace is not None, base=p is a.baseline,
                          trace_peak=None if p.trace is None else int(max(p.trace.peak_live_bytes().values())))
                     for p in a.plans], shown=shown)
""")
    plans = r["plans"]
    ok = [p for p in plans if p["error"] is None and p["step"] is not None]
    front = [p for p in ok if not any(q is not p and q["step"] <= p["step"] and q["needed"] <= p["needed"]
                                      and (q["step"], q["needed"]) < (p["step"], p["needed"]) for q in ok)]
    assert len(front) >= 2
    kept = [p for p in plans if p["kept"]]
    # every frontier plan and the baseline hold a trace; nothing else does (ties of equal figures: one kept)
    assert all(p["kept"] for p in front) and any(p["base"] for p in kept)
    assert all(p["base"] or any((p["step"], p["needed"]) == (q["step"], q["needed"]) for q in front) for p in kept)
    assert len(kept) < len(plans)
    # each kept trace is that plan's own prediction: its peak of live bytes is the plan's peak allocated
    for p in kept:
        assert p["trace_peak"] == p["alloc"], p["changes"]
    base = next(p for p in plans if p["base"])
    for rank, peaks in r["shown"].items():
        plan = plans[int(rank) - 1]
        assert peaks == ([base["alloc"], plan["alloc"]] if not plan["base"] else [plan["alloc"]])
