"""Open a local HTML file in headless Chromium with the network cut off, for the report tests."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-quic"]

# per figure: traces and points as plotly computed them (gd._fullData decodes typed arrays; heatmaps count
# rows of z), and the SVG layers drawn
PLOT_DATA_JS = """() => Array.from(document.querySelectorAll('.memlens-figure')).map(gd => ({
  id: gd.id,
  traces: (gd._fullData || []).length,
  points: (gd._fullData || []).reduce((n, t, i) => n + (t._length || (t.z && t.z.length) ||
      ((gd.calcdata && gd.calcdata[i]) ? gd.calcdata[i].length : 0)), 0),
  svg: gd.querySelectorAll('.main-svg').length
}))"""


def require_chromium():
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium (/usr/bin/chromium) for the headless browser test")
    pytest.importorskip("playwright.sync_api", reason="needs the playwright python package")


class OfflineBrowser:
    """One headless Chromium (fresh profile) whose pages may load only file:// URLs."""

    def __init__(self):
        from playwright.sync_api import sync_playwright

        self._profile = tempfile.TemporaryDirectory()
        self._pw = sync_playwright().start()
        # a persistent context on a fresh temporary directory is Playwright's way to pass --user-data-dir
        self._context = self._pw.chromium.launch_persistent_context(
            self._profile.name, executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1400, "height": 1000})

    def close(self):
        try:
            self._context.close()
        finally:
            self._pw.stop()
            self._profile.cleanup()

    def open(self, path: Path, screenshot: Path | None = None, settle_ms: int = 500,
             evaluate: dict[str, str] | None = None) -> dict:
        """Load `path` with every non-file request aborted; returns what the page did.

        Keys: ``console_errors``, ``page_errors``, ``blocked`` (URLs the page tried to fetch), ``dialogs``
        (alert/confirm/prompt messages), ``plots`` (per figure div: traces, points, svg count), ``status``
        (the report's section status JSON), ``pwned`` (``window.__pwned``), ``injected_nodes`` (img, iframe,
        object or svg script elements inside the page's main content), and for each key of `evaluate` what
        its JavaScript function returned once the figures were drawn.
        """
        result = {"console_errors": [], "page_errors": [], "blocked": [], "dialogs": []}
        page = self._context.new_page()
        try:
            def route(r):
                if r.request.url.startswith("file://"):
                    r.continue_()
                else:
                    result["blocked"].append(r.request.url)
                    r.abort()

            def on_dialog(d):
                result["dialogs"].append(d.message)
                d.dismiss()

            page.route("**/*", route)
            page.on("console", lambda m: m.type == "error" and result["console_errors"].append(m.text))
            page.on("pageerror", lambda e: result["page_errors"].append(str(e)))
            page.on("dialog", on_dialog)
            page.goto(Path(path).resolve().as_uri(), wait_until="load", timeout=120_000)
            page.wait_for_function("document.body.hasAttribute('data-figures-drawn')", timeout=120_000)
            page.wait_for_timeout(settle_ms)
            result["plots"] = page.evaluate(PLOT_DATA_JS)
            result["status"] = page.evaluate(
                "() => JSON.parse(document.getElementById('memlens-report-status').textContent)")
            result["pwned"] = page.evaluate("() => window.__pwned === undefined ? null : window.__pwned")
            result["injected_nodes"] = page.evaluate(
                "() => document.querySelectorAll('main img, main iframe, main svg script, main object').length")
            for key, js in (evaluate or {}).items():
                result[key] = page.evaluate(js)
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            page.close()
        return result

    def hover_texts(self, path: Path, points: str, label: str) -> dict:
        """Load `path` offline, move the mouse onto each element matching the CSS selector `points` in turn and
        read the text of `label` (the hover label's layer) each time: what a user reads on hovering.

        Keys: ``labels`` (one text per point), ``injected_nodes`` (img, script, iframe or object elements seen
        in `label`), ``dialogs`` and ``pwned`` (``window.__pwned`` after the last hover)."""
        page = self._context.new_page()
        dialogs, injected = [], 0
        try:
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://") else r.abort())
            page.goto(Path(path).resolve().as_uri(), wait_until="load", timeout=120_000)
            page.wait_for_function("document.body.hasAttribute('data-figures-drawn')", timeout=120_000)
            texts = []
            found = page.locator(points)
            for i in range(found.count()):
                found.nth(i).scroll_into_view_if_needed()
                box = found.nth(i).bounding_box()
                page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                page.wait_for_timeout(300)
                texts.append(page.locator(label).first.evaluate("e => e.textContent"))
                injected += page.locator(label).first.evaluate(
                    "e => e.querySelectorAll('img, script, iframe, object').length")
                page.mouse.move(1, 1)
                page.wait_for_timeout(100)
            pwned = page.evaluate("() => window.__pwned === undefined ? null : window.__pwned")
            return {"labels": texts, "injected_nodes": injected, "dialogs": dialogs, "pwned": pwned}
        finally:
            page.close()


def open_offline(path: Path, screenshot: Path | None = None, settle_ms: int = 500) -> dict:
    """`OfflineBrowser.open` in a browser of its own (for one-off checks)."""
    browser = OfflineBrowser()
    try:
        return browser.open(path, screenshot, settle_ms)
    finally:
        browser.close()


# ---- constructed traces ---------------------------------------------------------------------------------
XSS_NAMES = ('<script>window.__pwned="script";alert(1)</script>',
             '"><img src=x onerror="window.__pwned=\'img\';alert(2)">',
             "</script><script>window.__pwned='json'</script>",
             "<!--<script>window.__pwned='comment'</script>",
             "javascript:alert(3)//<svg onload=alert(4)>")


def constructed_trace(n_iter: int = 4, names=None, with_accesses: bool = True):
    """A small two-device training-like trace whose numbers are easy to compute by hand.

    Per iteration on cuda:0: an activation of 1000 B (alloc at +10, free at +60) and a temporary of 300 B
    (+20..+30); on cpu a 50 B input (+5..+15). A 4000 B parameter lives from before recording to the end.
    Iteration k spans [100k, 100k+100) ns. Names come from `names` (cycled) so tests can inject markup; with
    `names` given, the cpu blocks' category is one of them as well.
    """
    import pandas as pd

    from memlens import Trace

    hostile = names is not None
    names = list(names or ["model.layer1", "model.layer2"])
    input_category = names[1] if hostile else "input"  # hostile names reach categories too
    rows, acc, ops = [], [], []
    rows.append(dict(block_id=0, device="cuda:0", addr=1 << 20, size=4000, alloc_ns=None, free_ns=None,
                     category="parameter", op="", module=names[0], allocated_before=True))
    bid, op_id = 1, 0
    for k in range(n_iter):
        base = 100 * k
        ops.append(dict(op_id=op_id, name=names[k % len(names)] + "::forward", start_ns=base + 10,
                        end_ns=base + 20, module=names[k % len(names)], iteration=k))
        ops.append(dict(op_id=op_id + 1, name="aten::mm", start_ns=base + 20, end_ns=base + 50,
                        module=names[(k + 1) % len(names)], iteration=k))
        rows.append(dict(block_id=bid, device="cuda:0", addr=(1 << 20) + 4096, size=1000, alloc_ns=base + 10,
                         free_ns=base + 60, category="activation", op=names[k % len(names)], module=names[0]))
        rows.append(dict(block_id=bid + 1, device="cuda:0", addr=(1 << 20) + 8192, size=300, alloc_ns=base + 20,
                         free_ns=base + 30, category="temporary", op="aten::mm", module=names[-1]))
        rows.append(dict(block_id=bid + 2, device="cpu", addr=4096, size=50, alloc_ns=base + 5,
                         free_ns=base + 15, category=input_category, op="aten::empty", module=""))
        if with_accesses:
            acc += [dict(block_id=0, t_ns=base + 20, op_id=op_id + 1, is_write=False),
                    dict(block_id=bid, t_ns=base + 10, op_id=op_id, is_write=True),
                    dict(block_id=bid, t_ns=base + 50, op_id=op_id + 1, is_write=False),
                    dict(block_id=bid + 1, t_ns=base + 20, op_id=op_id + 1, is_write=True),
                    dict(block_id=bid + 2, t_ns=base + 10, op_id=op_id, is_write=False)]
        bid += 3
        op_id += 2
    blocks = pd.DataFrame(rows)
    blocks["alloc_ns"] = pd.array(blocks["alloc_ns"], dtype="Int64")
    blocks["free_ns"] = pd.array(blocks["free_ns"], dtype="Int64")
    meta = {"source_kind": "constructed", "iteration_source": "memlens.step",
            "user_metadata": {names[0]: names[-1]}, "notes": [f"note about {names[0]}"]}
    stacks = pd.DataFrame({"stack_id": [0], "depth": [0], "name": [names[0]], "filename": [names[-1]],
                           "line": [7]})
    blocks["stack_id"] = pd.array([0] + [None] * (len(blocks) - 1), dtype="Int64")
    return Trace.from_tables(blocks, pd.DataFrame(acc) if acc else None, pd.DataFrame(ops), meta, stacks=stacks)


def brute_force_live(trace, device):
    """(peak bytes, live bytes after each event) by walking events one by one in Python."""
    lo, hi = trace.time_span_ns()
    events = []
    for b in trace.blocks[trace.blocks["device"] == device].itertuples():
        a = lo if b.alloc_ns is None or str(b.alloc_ns) == "<NA>" else int(b.alloc_ns)
        events.append((a, int(b.alloc_seq) if str(b.alloc_seq) != "<NA>" else -1, b.size))
        if str(b.free_ns) != "<NA>":
            events.append((int(b.free_ns), int(b.free_seq), -b.size))
    events.sort()
    live, curve = 0, []
    for _, _, d in events:
        live += d
        curve.append(live)
    return (max(curve) if curve else 0), curve


def big_trace(n_blocks: int, seed: int = 0):
    """`n_blocks` random blocks on one device with two accesses each (vectorised; for level-of-detail tests)."""
    import numpy as np
    import pandas as pd

    from memlens import Trace

    rng = np.random.default_rng(seed)
    alloc = np.sort(rng.integers(0, 10**10, n_blocks))
    free = alloc + rng.integers(1_000, 10**8, n_blocks)
    blocks = pd.DataFrame({"block_id": np.arange(n_blocks), "device": "cuda:0",
                           "addr": (1 << 40) + rng.integers(0, 1 << 22, n_blocks) * 512,
                           "size": rng.integers(1, 1 << 22, n_blocks), "alloc_ns": alloc, "free_ns": free,
                           "category": rng.choice(["activation", "gradient", "temporary"], n_blocks),
                           "op": rng.choice([f"aten::op{i}" for i in range(30)], n_blocks),
                           "module": rng.choice([f"layers.{i}" for i in range(20)], n_blocks)})
    bid = np.repeat(np.arange(n_blocks), 2)
    t = alloc[bid] + (rng.uniform(0, 1, len(bid)) * (free[bid] - alloc[bid])).astype(np.int64)
    accesses = pd.DataFrame({"block_id": bid, "t_ns": t, "op_id": np.arange(len(bid)), "is_write": False})
    return Trace.from_tables(blocks, accesses, None, {"source_kind": "synthetic"})
