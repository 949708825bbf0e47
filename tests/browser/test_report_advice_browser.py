"""The report's Advice section in headless Chromium with the network cut off: what the page shows (the ranked
table, the frontier chart's drawn points, each plan's heading and snippet) is the advice computed in Python, on
a real advice (a small model predicted on the fake CUDA device) and on hand-made plans whose module names,
allocator settings, notes and errors are markup that must stay text."""
from __future__ import annotations

import re

import pytest

import memlens
from memlens.units import format_bytes
from _predict_cases import built_shim, run_child  # noqa: F401  (the shim fixture)
from report_support import XSS_NAMES, OfflineBrowser, constructed_trace, require_chromium

pytestmark = pytest.mark.browser

MiB = 1 << 20
# markup plotly itself would draw (bold, a javascript: link) in a hover label or title
PLOTLY_MARKUP = '<b>bold</b><a href="javascript:window.__pwned=\'link\'">link</a>'

# The Advice section as the user sees it: table cells by column heading, the h3 headings, the snippets, and
# per figure and per scatter trace the points plotly computed and the markers it drew.
ADVICE_JS = """() => {
  const s = document.getElementById('advice');
  if (!s) return null;
  const heads = Array.from(s.querySelectorAll('table thead th')).map(th => th.textContent);
  const rows = Array.from(s.querySelectorAll('table tbody tr')).map(tr =>
      Object.fromEntries(Array.from(tr.cells).map((td, i) => [heads[i], td.textContent])));
  const figures = Array.from(s.querySelectorAll('.memlens-figure')).map(gd => {
    const drawn = Array.from(gd.querySelectorAll('.scatterlayer .trace')).map(
        t => t.querySelectorAll('.points path.point').length);
    return (gd._fullData || []).filter(t => t.type === 'scatter').map((t, i) => ({
      name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || []),
      rank: Array.from(t.customdata || []), drawn: drawn[i]}));
  });
  return {heads, rows, figures,
          headings: Array.from(s.querySelectorAll('h3')).map(h => h.textContent),
          verdicts: Array.from(s.querySelectorAll('h3')).map(h => h.nextElementSibling.textContent),
          snippets: Array.from(s.querySelectorAll('pre.memlens-advice-snippet')).map(p => p.textContent),
          text: s.textContent};
}"""


@pytest.fixture(scope="module")
def browser():
    require_chromium()
    b = OfflineBrowser()
    yield b
    b.close()


def open_advice(browser, path, screenshot):
    """The page opened offline; asserts it made no request, logged no error, ran nothing injected."""
    result = browser.open(path, screenshot=screenshot, evaluate={"advice": ADVICE_JS})
    assert result["blocked"] == [], "the page tried to reach the network"
    assert result["console_errors"] == [] and result["page_errors"] == []
    assert result["dialogs"] == [] and result["pwned"] is None and result["injected_nodes"] == 0
    assert {s["key"]: s["status"] for s in result["status"]["sections"]}["advice"] == "ok"
    assert result["advice"] is not None, "no Advice section on the page"
    return result["advice"]


def check_against_plans(shown: dict, plans: list[dict]):
    """`shown` (ADVICE_JS) says what `plans` (rank order; changes, fits, step_ns, needed, error, snippet,
    frontier) say: one table row per plan, one heading and snippet per plan, and the frontier chart has one
    drawn point per timed plan, the frontier's at their (step ms, bytes) in step order."""
    assert [r["#"] for r in shown["rows"]] == [str(i) for i in range(1, len(plans) + 1)]
    assert [r["changes"] for r in shown["rows"]] == [p["changes"] for p in plans]
    assert [r["fits"] for r in shown["rows"]] == ["error" if p["fits"] is None else str(p["fits"]) for p in plans]
    assert [r["frontier"] == "yes" for r in shown["rows"]] == [p["frontier"] for p in plans]
    assert [r["error"] for r in shown["rows"]] == [p["error"] or "" for p in plans]
    assert shown["headings"] == [f"#{i}: {p['changes']}" for i, p in enumerate(plans, 1)]
    assert shown["verdicts"] == [verdict(p) for p in plans]
    assert not re.search(r"\bnan\b", shown["text"]), "a missing figure shows as nan"
    assert shown["snippets"] == [p["snippet"] for p in plans]

    ranked = [dict(p, rank=i) for i, p in enumerate(plans, 1)]
    timed = [p for p in ranked if p["error"] is None and p["step_ns"] is not None]
    front = sorted((p for p in timed if p["frontier"]), key=lambda p: p["step_ns"])
    assert len(shown["figures"]) == 1
    traces = {t["name"]: t for t in shown["figures"][0]}
    assert traces["frontier"]["rank"] == [p["rank"] for p in front]
    assert traces["frontier"]["x"] == pytest.approx([p["step_ns"] / 1e6 for p in front], rel=1e-12)
    assert traces["frontier"]["y"] == [float(p["needed"]) for p in front]
    others = traces.get("other plans", {"rank": [], "drawn": 0})
    assert sorted(others["rank"]) == [p["rank"] for p in timed if not p["frontier"]]
    assert traces["frontier"]["drawn"] == len(front) and others["drawn"] == len(timed) - len(front)


def verdict(plan: dict) -> str:
    """The line under a plan's heading: its error, or whether it fits, what it needs and its step."""
    if plan["error"] is not None:
        return f"error: {plan['error']}."
    return (f"{'fits' if plan['fits'] else 'does not fit'}; needs {format_bytes(plan['needed'])} per rank; "
            f"modeled step {plan['step_ns'] / 1e6:.2f} ms.")


def rows_of(advice) -> list[dict]:
    """The plans of `advice` in rank order, with `Advice.frontier` membership, as `check_against_plans` wants."""
    front = {id(p) for p in advice.frontier()}
    table = advice.table()
    return [dict(changes=row.changes, fits=None if p.error else bool(row.fits), step_ns=p.step_ns,
                 needed=p.device_bytes_needed, error=p.error, snippet=p.snippet, frontier=id(p) in front)
            for p, row in zip(advice.plans, table.itertuples(index=False))]


REAL_ADVICE = """
import torch.nn as nn
class Block(nn.Module):
    def __init__(self, d=256):
        super().__init__(); self.ln = nn.LayerNorm(d); self.fc1 = nn.Linear(d, 4 * d); self.fc2 = nn.Linear(4 * d, d)
    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
class Net(nn.Module):
    def __init__(self, n=4, d=256):
        super().__init__(); self.layers = nn.ModuleList(Block(d) for _ in range(n)); self.head = nn.Linear(d, 10)
    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).sum()
def step(model, opt):
    model(torch.randn(32, 256, 256, device="cuda")).backward(); opt.step(); opt.zero_grad()
a = memlens.advise(Net, step, gpu="H100", capacity="900MiB")
memlens.report(a.baseline.trace, OUT, advice=a, whatif=False)
front = {id(p) for p in a.frontier()}
result = [dict(changes=row.changes, fits=None if p.error else bool(row.fits), step_ns=p.step_ns,
               needed=p.device_bytes_needed, error=p.error, snippet=p.snippet, frontier=id(p) in front)
          for p, row in zip(a.plans, a.table().itertuples(index=False))]
"""


def test_real_advice_section_shows_the_advice(built_shim, browser, artifacts_dir):
    out = artifacts_dir / "report_advice.html"
    plans = run_child(f"OUT = {str(out)!r}\n" + REAL_ADVICE)
    # the model is big enough that the plans differ: some fit 900 MiB and some do not, two on the frontier
    assert len(plans) >= 4 and {p["fits"] for p in plans} == {True, False}
    assert sum(p["frontier"] for p in plans) >= 2
    shown = open_advice(browser, out, artifacts_dir / "report_advice.png")
    check_against_plans(shown, plans)


def hostile_advice():
    """Five hand-made plans whose module names, allocator settings, freed lines, error and note are the
    XSS_NAMES and PLOTLY_MARKUP (MiB per rank / ms of modeled step, capacity 850 MiB): baseline 1000 / 3.0,
    A 800 / 3.5 and C 700 / 5.0 on the frontier; B 900 / 6.0 beaten by A; D failed."""
    from memlens.advice import Advice, Plan

    trace = constructed_trace(names=XSS_NAMES)

    def plan(needed, ms, **kw):
        return Plan(peak_allocated=(needed - 600) * MiB, peak_reserved=(needed - 500) * MiB,
                    device_bytes_needed=needed * MiB, fits=needed <= 850, step_ns=int(ms * 1e6),
                    baseline_step_ns=3_000_000, verified=True, **kw)
    baseline = plan(1000, 3.0, trace=trace)
    a = plan(800, 3.5, checkpoint={XSS_NAMES[0]: "full", XSS_NAMES[1]: "selective"},
             freed=[f"{XSS_NAMES[2]} (full): 100 MiB off the peak"])
    b = plan(900, 6.0, checkpoint={XSS_NAMES[2]: "full"})
    c = plan(700, 5.0, checkpoint={XSS_NAMES[3]: "full", PLOTLY_MARKUP: "full"}, conf=XSS_NAMES[4])
    d = Plan(checkpoint={XSS_NAMES[4]: "offload"}, error=f"RuntimeError: {XSS_NAMES[0]}", verified=True)
    return Advice([baseline, a, c, b, d], baseline, 850 * MiB, "fit", [f"note {XSS_NAMES[1]}"])


def test_hostile_names_in_the_advice_render_as_text(browser, artifacts_dir):
    advice = hostile_advice()
    out = memlens.report(advice.baseline.trace, artifacts_dir / "report_advice_xss.html", whatif=False,
                         advice=advice)
    shown = open_advice(browser, out, artifacts_dir / "report_advice_xss.png")
    plans = rows_of(advice)
    # the frontier by hand: baseline 1000 MiB / 3.0 ms, A 800 / 3.5, C 700 / 5.0 (B is beaten by A)
    assert sorted((p["needed"] // MiB, p["step_ns"]) for p in plans if p["frontier"]) == [
        (700, 5_000_000), (800, 3_500_000), (1000, 3_000_000)]
    check_against_plans(shown, plans)
    # every hostile string reached the page as the characters it is made of
    for name in (*XSS_NAMES, PLOTLY_MARKUP):
        assert name in shown["text"], name
    assert f"note {XSS_NAMES[1]}" in shown["text"] and f"RuntimeError: {XSS_NAMES[0]}" in shown["text"]
    # hovering a frontier point shows its plan's changes as the same characters, and runs nothing
    front = sorted((dict(p, rank=i) for i, p in enumerate(plans, 1) if p["frontier"]), key=lambda p: p["step_ns"])
    hovered = browser.hover_texts(out, "#advice .scatterlayer .trace:last-child path.point", "#advice .hoverlayer")
    assert [t[:t.index("step ")] for t in hovered["labels"]] == [f"#{p['rank']}: {p['changes']}" for p in front]
    assert hovered["injected_nodes"] == 0 and hovered["dialogs"] == [] and hovered["pwned"] is None
