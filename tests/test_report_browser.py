"""The report in headless Chromium with the network cut off: loads, no errors, every plot has data, no XSS."""
from __future__ import annotations

from pathlib import Path

import pytest

import memlens
from test_report_support import XSS_NAMES, constructed_trace, open_offline, require_chromium

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.browser


def _check_page(result: dict, n_figures_min: int):
    assert result["blocked"] == [], "the page tried to reach the network"
    assert result["console_errors"] == [] and result["page_errors"] == []
    assert result["dialogs"] == []
    assert len(result["plots"]) >= n_figures_min
    for plot in result["plots"]:
        assert plot["traces"] > 0 and plot["points"] > 0 and plot["svg"] > 0, plot
    assert not [s for s in result["status"]["sections"] if s["status"] == "error"]


def test_report_of_a_recorded_training_run_renders_offline(tmp_path, artifacts_dir):
    require_chromium()
    sample = ROOT / "sample_traces" / "transformer_train_adamw.memlens"
    if not sample.exists():
        pytest.skip("sample_traces/transformer_train_adamw.memlens is not in this checkout")
    path = memlens.report(sample, artifacts_dir / "report_transformer_train.html")
    result = open_offline(path, screenshot=artifacts_dir / "report_transformer_train.png")
    _check_page(result, n_figures_min=4)
    assert (artifacts_dir / "report_transformer_train.png").stat().st_size > 10_000


@pytest.mark.shared
def test_report_of_a_cuda_snapshot_renders_offline(shared, artifacts_dir):
    require_chromium()
    path = memlens.report(shared("snapshots/cs336_wedsonlin_medium_128_training.pickle"),
                          artifacts_dir / "report_cs336_training.html")
    result = open_offline(path, screenshot=artifacts_dir / "report_cs336_training.png")
    _check_page(result, n_figures_min=3)


def test_hostile_names_execute_nothing(artifacts_dir):
    require_chromium()
    path = memlens.report(constructed_trace(names=XSS_NAMES), artifacts_dir / "report_xss.html")
    result = open_offline(path, screenshot=artifacts_dir / "report_xss.png")
    _check_page(result, n_figures_min=3)
    assert result["pwned"] is None, f"injected script ran: {result['pwned']}"
    assert result["injected_nodes"] == 0
