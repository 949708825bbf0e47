"""The explorer in a real JupyterLab, driven by headless Chromium through Playwright.

Starts `jupyter lab` on a free port over a temporary directory holding a small notebook, opens it in
Debian's chromium, runs every cell, and checks that the widget rendered: the timeline's plot exists with the
number of traces the Python side built, and clicking a block shows that block's details. A notebook of
`memlens.advise` checks the advisor's frontier the same way: clicking a frontier point shows that plan's details
and its timeline. Screenshots go to the test artifacts. Skips with the reason when chromium, Playwright or
JupyterLab is missing.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from _predict_cases import built_shim  # noqa: F401  (the shim fixture, for the advice notebook)

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_traces" / "transformer_train_adamw.memlens"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-quic"]

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(420)]


def _chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if path is None:
        pytest.skip("chromium is not installed (apt-get install chromium); the browser test needs it")
    return path


def _requirements():
    chromium = _chromium()
    pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
    jupyter = Path(sys.executable).with_name("jupyter")
    if not jupyter.exists():
        pytest.skip(f"no jupyter launcher next to {sys.executable}")
    if not SAMPLE.exists():
        pytest.skip(f"sample trace {SAMPLE} is missing")
    return chromium, jupyter


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _target(trace_path: Path, zoom_x, zoom_y):
    """The block the test clicks: the largest block, zoomed so that it fills a good part of the plot."""
    import numpy as np

    import memlens
    from memlens.widgets.explorer import Explorer
    explorer = Explorer(memlens.load(trace_path))
    geom = explorer.geometry()
    sizes = np.where(np.isnan(geom.y0), -1.0, geom.size)
    i = int(np.argmax(sizes))
    x0, x1, y0, size = geom.t0[i], geom.t1[i], geom.y0[i], geom.size[i]
    zoom_x[:] = [float(x0 - 0.5 * (x1 - x0)), float(x1 + 0.5 * (x1 - x0))]
    zoom_y[:] = [float(y0 - size), float(y0 + 2 * size)]
    explorer.zoom(zoom_x, zoom_y)
    data = explorer.view_data
    return {"block_id": int(geom.block_id[i]), "x": float((x0 + x1) / 2 / data.scale), "y": float(y0 + size / 2),
            "traces": len(explorer.timeline.data), "drawn": data.drawn}


def _notebook(path: Path, trace_path: Path, zoom_x, zoom_y) -> None:
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import memlens\nfrom memlens.widgets import explore\n"
                                  f"trace = memlens.load({str(trace_path)!r})"),
        nbformat.v4.new_code_cell(f"w = explore(trace)\nw.zoom({list(zoom_x)!r}, {list(zoom_y)!r})\nw"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"jupyter lab did not answer {url} within {timeout_s} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@pytest.fixture
def lab(tmp_path):
    """A running JupyterLab over a temporary root with `explore.ipynb`; yields (base url, token, target)."""
    chromium, jupyter = _requirements()
    root = tmp_path / "root"
    root.mkdir()
    # a private copy: the notebook and this process must read the same trace
    trace_path = shutil.copytree(SAMPLE, root / SAMPLE.name)
    zoom_x, zoom_y = [], []
    target = _target(trace_path, zoom_x, zoom_y)
    _notebook(root / "explore.ipynb", trace_path, zoom_x, zoom_y)
    with _running_lab(jupyter, root, tmp_path) as (base, token):
        yield base, token, target, chromium, tmp_path


@contextlib.contextmanager
def _running_lab(jupyter, root: Path, tmp_path: Path):
    """JupyterLab serving `root` on a free port with this checkout's memlens; yields (base url, token)."""
    port, token = _free_port(), secrets.token_hex(16)
    # the kernel must import this checkout's memlens whatever else the environment has installed
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    log = open(tmp_path / "lab.log", "wb")
    proc = subprocess.Popen(
        [str(jupyter), "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None", "--LabApp.extension_manager=readonly",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         f"--LabApp.user_settings_dir={tmp_path / 'settings'}", f"--LabApp.workspaces_dir={tmp_path / 'ws'}",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_http(f"{base}/api/status?token={token}", proc, 90)
        except (RuntimeError, TimeoutError) as exc:
            log.flush()
            raise AssertionError(f"{exc}; server log tail:\n{(tmp_path / 'lab.log').read_text()[-3000:]}") from None
        yield base, token
    finally:
        _stop(proc)
        log.close()


def test_explorer_renders_and_a_click_shows_block_details(lab, artifacts_dir):
    from playwright.sync_api import sync_playwright
    base, token, target, chromium, tmp_path = lab
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=chromium, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1500, "height": 1300})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{base}/lab/tree/explore.ipynb?token={token}", timeout=120_000)
            page.wait_for_selector(".jp-Notebook", timeout=120_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands", timeout=60_000)
            # wait until the notebook's kernel session is ready, then run every cell (without awaiting the
            # command's promise, which settles only when every cell has replied)
            page.wait_for_function(
                "() => { const w = window.jupyterapp.shell.currentWidget;"
                " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
                " && w.sessionContext.session.kernel.status === 'idle'; }", timeout=120_000)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); return true; }")
            plot = ".memlens-explorer .js-plotly-plot"
            try:
                page.wait_for_selector(plot, timeout=180_000)
                page.wait_for_function(
                    "(n) => { const gd = document.querySelector('.memlens-explorer .js-plotly-plot');"
                    " return gd && gd.data && gd.data.length === n && gd._fullLayout; }",
                    arg=target["traces"], timeout=60_000)
            except Exception:
                page.screenshot(path=str(artifacts_dir / "jupyterlab_explorer_failed.png"), full_page=True)
                raise
            n_traces = page.evaluate("() => document.querySelector('.memlens-explorer .js-plotly-plot').data.length")
            assert n_traces == target["traces"]
            # the zoomed view draws the target block as a WebGL polygon: the browser ends up with exactly the
            # polygons Python built (6 points each), once the zoom's update has arrived
            polygon_points = ("() => document.querySelector('.memlens-explorer .js-plotly-plot').data"
                              ".filter(t => t.type === 'scattergl' && t.fill === 'toself')"
                              ".reduce((n, t) => n + (t.x ? t.x.length : 0), 0)")
            try:
                page.wait_for_function(f"(n) => ({polygon_points})() === n", arg=6 * target["drawn"],
                                       timeout=60_000)
            except Exception:
                page.screenshot(path=str(artifacts_dir / "jupyterlab_explorer_failed.png"), full_page=True)
                seen = page.evaluate("() => document.querySelector('.memlens-explorer .js-plotly-plot').data"
                                     ".map(t => [t.name, t.x ? t.x.length : -1])")
                raise AssertionError(f"browser traces {seen}, expected {target}") from None
            assert target["drawn"] > 0
            # the ATI panel's figure (plotly's mimetype renderer inside an Output widget): swappable / too short
            page.wait_for_function(
                "() => { const p = document.querySelectorAll('.memlens-explorer .js-plotly-plot');"
                " return p.length >= 2 && p[1].data && p[1].data.length === 2; }", timeout=60_000)
            ati_names = page.evaluate("() => document.querySelectorAll('.memlens-explorer .js-plotly-plot')[1]"
                                      ".data.map(t => t.name)")
            assert sorted(ati_names) == ["swappable", "too short to swap"]
            xy = page.evaluate(
                "([x, y]) => { const gd = document.querySelector('.memlens-explorer .js-plotly-plot');"
                " const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.getBoundingClientRect();"
                " return [r.left + xa._offset + xa.l2p(x), r.top + ya._offset + ya.l2p(y)]; }",
                [target["x"], target["y"]])
            page.mouse.move(xy[0] - 5, xy[1])
            page.mouse.move(xy[0], xy[1])
            page.wait_for_timeout(300)
            page.mouse.click(xy[0], xy[1])
            page.wait_for_selector(f".memlens-details[data-block-id='{target['block_id']}']", timeout=60_000)
            text = page.inner_text(".memlens-details")
            assert f"Block {target['block_id']}" in text and "size" in text
            page.screenshot(path=str(artifacts_dir / "jupyterlab_explorer.png"), full_page=True)
            # nothing a newcomer reads is clipped: the details panel wraps within its width, the panel tabs'
            # titles show whole, and the ATI histogram's count axis reads whole numbers (not "0.00 / 50.0")
            clipped = page.evaluate(
                "() => [...document.querySelectorAll('.memlens-explorer .lm-TabBar-tabLabel')]"
                ".filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText.slice(0, 60))")
            assert clipped == [], clipped
            overflowing = page.evaluate(
                "() => { const d = document.querySelector('.memlens-details');"
                " const right = Math.min(d.closest('.widget-html').getBoundingClientRect().right,"
                "  d.closest('.jp-OutputArea-output').getBoundingClientRect().right);"
                " return [...d.querySelectorAll('td, th, b, span')]"
                ".filter(e => e.getBoundingClientRect().right > right + 1).map(e => e.innerText.slice(0, 60)); }")
            assert overflowing == [], overflowing
            # ... and sits beside the timeline (not wrapped below it) in a 1,500 px window with the file browser open
            beside = page.evaluate(
                "() => { const t = document.querySelector('.memlens-explorer .js-plotly-plot').getBoundingClientRect();"
                " const d = document.querySelector('.memlens-details').closest('.widget-html').getBoundingClientRect();"
                " return d.left >= t.right - 1 && d.top < t.bottom; }")
            assert beside
            tabs = page.evaluate("() => [...document.querySelectorAll('.memlens-explorer .lm-TabBar-tabLabel')]"
                                 ".map(e => e.innerText)")
            assert tabs == ["intervals (ATI)", "what-if"], tabs
            ticks = page.evaluate("() => [...document.querySelectorAll('.memlens-explorer .js-plotly-plot')[1]"
                                  ".querySelectorAll('.ytick text')].map(e => e.textContent)")
            assert ticks and all(t.replace("k", "").isdigit() for t in ticks), ticks
            # zooming with the mouse (a relayout event) reaches Python and redraws the linked views:
            # the status line's time range changes
            status = ".memlens-explorer .widget-html-content"
            before = page.inner_text(status)
            box = page.evaluate(
                "() => { const gd = document.querySelector('.memlens-explorer .js-plotly-plot');"
                " const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.getBoundingClientRect();"
                " return [r.left + xa._offset, xa._length, r.top + ya._offset, ya._length]; }")
            y_mid = box[2] + 0.8 * box[3]
            page.mouse.move(box[0] + 0.2 * box[1], y_mid)
            page.mouse.down()
            page.mouse.move(box[0] + 0.35 * box[1], y_mid + 1, steps=5)
            page.mouse.move(box[0] + 0.5 * box[1], y_mid + 1, steps=5)
            page.mouse.up()
            page.wait_for_function("([sel, old]) => document.querySelector(sel).innerText !== old",
                                   arg=[status, before], timeout=60_000)
            assert page.inner_text(status) != before
            page.screenshot(path=str(artifacts_dir / "jupyterlab_explorer_zoomed.png"), full_page=True)
            assert not [e for e in errors if "memlens" in e.lower() or "plotly" in e.lower()], errors
        finally:
            context.close()
    (artifacts_dir / "jupyterlab_explorer.json").write_text(json.dumps(target, indent=1))


# ---- the advisor's frontier widget: a click on a plan's point shows that plan ---------------------------------
ADVICE_CELLS = ('''import memlens
import torch
import memlens.widgets
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                                              torch.nn.Linear(1024, 256)) for _ in range(4))
    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x.sum()
def step(model, opt):
    model(torch.randn(32, 256, 256, device="cuda")).backward(); opt.step(); opt.zero_grad()
advice = memlens.advise(Net, step, gpu="H100", capacity="900MiB")''', "w = memlens.widgets.explore(advice)\nw")


def _advice_target() -> dict:
    """The same advice in a child (prediction needs memlens imported before torch): a frontier plan the widget
    does not show first, its point, its changes, and the timeline's trace count: the frontier plan (not the
    baseline) farthest from every other point on the chart's axes, so that a click there picks it alone; the
    notebook first shows the baseline (`select`), whose timeline has one curve."""
    from _predict_cases import run_child
    return run_child(ADVICE_CELLS[0].split("\n", 2)[2] + """
import numpy as np
from memlens.widgets.advice_panel import AdviceExplorer
w = AdviceExplorer(advice)
xs = np.concatenate([t.x for t in w.frontier.data]); ys = np.concatenate([t.y for t in w.frontier.data])
span_x, span_y = np.ptp(xs) or 1.0, np.ptp(ys) or 1.0
base = next(i for i, p in enumerate(advice.plans, 1) if p is advice.baseline)
front = [t for t in w.frontier.data if t.name == "frontier"][0]
def room(k):
    d = np.hypot((xs - front.x[k]) / span_x, (ys - front.y[k]) / span_y)
    return np.sort(d)[1]
i = max((k for k, r in enumerate(front.customdata) if int(r) != base), key=room)
rank = int(front.customdata[i])
w.select(rank)
result = dict(rank=rank, base=base, x=float(front.x[i]), y=float(front.y[i]), changes=advice.plans[rank - 1].changes,
              timeline=len(w.timeline_figure.data))
""")


def test_advice_frontier_click_shows_the_plans_timeline(tmp_path, artifacts_dir, built_shim):
    import nbformat
    from playwright.sync_api import sync_playwright
    chromium, jupyter = _requirements()
    target = _advice_target()
    root = tmp_path / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    cells = [ADVICE_CELLS[0], ADVICE_CELLS[1].replace("\nw", f"\nw.select({target['base']})\nw")]
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "advice.ipynb")
    plots = "document.querySelectorAll('.memlens-advice .js-plotly-plot')"
    with _running_lab(jupyter, root, tmp_path) as (base, token), sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=chromium, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1500, "height": 1300})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{base}/lab/tree/advice.ipynb?token={token}", timeout=120_000)
            page.wait_for_function(
                "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
                " && w.sessionContext.session.kernel.status === 'idle'; }", timeout=120_000)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); return true; }")
            try:   # the frontier (a FigureWidget) and the first plan's timeline (an Output's figure)
                page.wait_for_function(f"() => {{ const p = {plots}; return p.length >= 2 && p[0]._fullLayout; }}",
                                       timeout=240_000)
            except Exception:
                page.screenshot(path=str(artifacts_dir / "jupyterlab_advice_failed.png"), full_page=True)
                raise
            tabs = page.evaluate("() => [...document.querySelectorAll('.memlens-advice .lm-TabBar-tabLabel')]"
                                 ".map(e => e.innerText)")
            assert tabs == ["frontier", "ranked plans"], tabs
            assert page.locator(f".memlens-advice-plan[data-rank='{target['rank']}']").count() == 0
            # the notebook's code cell is long: bring the frontier into the window before pointing at it
            page.evaluate(f"() => {plots}[0].scrollIntoView({{block: 'center'}})")
            page.wait_for_timeout(500)
            xy = page.evaluate(
                f"([x, y]) => {{ const gd = {plots}[0]; const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;"
                " const r = gd.getBoundingClientRect();"
                " return [r.left + xa._offset + xa.l2p(x), r.top + ya._offset + ya.l2p(y)]; }",
                [target["x"], target["y"]])
            page.mouse.move(xy[0] - 5, xy[1])
            page.mouse.move(xy[0], xy[1])
            page.wait_for_timeout(300)
            page.mouse.click(xy[0], xy[1])
            try:
                page.wait_for_selector(f".memlens-advice-plan[data-rank='{target['rank']}']", timeout=60_000)
            except Exception:
                page.screenshot(path=str(artifacts_dir / "jupyterlab_advice_failed.png"), full_page=True)
                raise AssertionError(f"no plan #{target['rank']} after a click at {xy}: {target}") from None
            text = page.inner_text(".memlens-advice-plan")
            assert text.startswith(f"#{target['rank']}: {target['changes']}"), text
            # the clicked plan's timeline replaced the first plan's: its curves and peaks beside the baseline's
            page.wait_for_function(
                f"(n) => {{ const p = {plots}; return p.length >= 2 && p[1].data && p[1].data.length === n"
                f" && p[1].data.some(t => (t.name || '').includes({json.dumps(target['changes'][:40])})); }}",
                arg=target["timeline"], timeout=60_000)
            page.screenshot(path=str(artifacts_dir / "jupyterlab_advice.png"), full_page=True)
            assert not [e for e in errors if "memlens" in e.lower() or "plotly" in e.lower()], errors
        finally:
            context.close()
