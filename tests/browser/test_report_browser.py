"""The report in headless Chromium with the network cut off: loads, no errors, every plot has data, no XSS."""
from __future__ import annotations

from pathlib import Path

import pytest

import memlens
from report_support import XSS_NAMES, OfflineBrowser, constructed_trace, require_chromium

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    require_chromium()
    b = OfflineBrowser()
    yield b
    b.close()


def check_page(result: dict, n_figures_min: int):
    """The page made no request, logged no error, opened no dialog, and every figure has data."""
    assert result["blocked"] == [], "the page tried to reach the network"
    assert result["console_errors"] == [] and result["page_errors"] == []
    assert result["dialogs"] == []
    assert len(result["plots"]) >= n_figures_min
    for plot in result["plots"]:
        assert plot["traces"] > 0 and plot["points"] > 0 and plot["svg"] > 0, plot
    assert not [s for s in result["status"]["sections"] if s["status"] == "error"]


def test_report_of_a_recorded_training_run_renders_offline(browser, artifacts_dir):
    sample = ROOT / "sample_traces" / "transformer_train_adamw.memlens"
    if not sample.exists():
        pytest.skip("sample_traces/transformer_train_adamw.memlens is not in this checkout")
    path = memlens.report(sample, artifacts_dir / "report_transformer_train.html", whatif_time_limit_s=0.2)
    result = browser.open(path, screenshot=artifacts_dir / "report_transformer_train.png")
    check_page(result, n_figures_min=8)  # live x2, timeline, ATI x3, outliers, iterations, what-if
    assert {s["key"]: s["status"] for s in result["status"]["sections"]}["ati"] == "ok"
    assert (artifacts_dir / "report_transformer_train.png").stat().st_size > 10_000


@pytest.mark.shared
def test_report_of_a_cuda_snapshot_renders_offline(browser, shared, artifacts_dir):
    path = memlens.report(shared("snapshots/cs336_wedsonlin_medium_128_training.pickle"),
                          artifacts_dir / "report_cs336_training.html")
    result = browser.open(path, screenshot=artifacts_dir / "report_cs336_training.png")
    check_page(result, n_figures_min=3)
    status = {s["key"]: s for s in result["status"]["sections"]}
    assert status["ati"]["status"] == "unavailable" and "per-access data" in status["ati"]["message"]


def test_hostile_names_execute_nothing(browser, artifacts_dir):
    path = memlens.report(constructed_trace(names=XSS_NAMES), artifacts_dir / "report_xss.html")
    result = browser.open(path, screenshot=artifacts_dir / "report_xss.png")
    check_page(result, n_figures_min=3)
    assert result["pwned"] is None, f"injected script ran: {result['pwned']}"
    assert result["injected_nodes"] == 0


def test_diff_page_with_hostile_names_renders_and_executes_nothing(browser, artifacts_dir):
    from memlens.reporting.diff_page import diff_report

    a = constructed_trace(names=XSS_NAMES)
    b = constructed_trace(n_iter=6, names=XSS_NAMES[::-1])
    d = memlens.diff(a, b, name_a=XSS_NAMES[0], name_b=XSS_NAMES[1])
    page = diff_report(d, artifacts_dir / "diff_xss.html")
    assert not page.failed
    result = browser.open(artifacts_dir / "diff_xss.html", screenshot=artifacts_dir / "diff_xss.png")
    check_page(result, n_figures_min=1)
    assert result["pwned"] is None and result["injected_nodes"] == 0
