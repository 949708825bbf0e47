"""The HTML report: self-contained, escaped, sections isolated, no section failing on real traces."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import memlens
from memlens.reporting import GIVEN_ONLY, SECTIONS, build_report, report
from report_support import XSS_NAMES, big_trace, constructed_trace

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "sample_traces").glob("*.memlens"))


def _status(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="memlens-report-status">(.*?)</script>', html, re.S)
    return {s["key"]: s for s in json.loads(m.group(1))["sections"]}


def test_report_is_one_offline_file(tmp_path):
    out = memlens.report(constructed_trace(), tmp_path / "sub" / "r.html")
    html = out.read_text()
    assert out == tmp_path / "sub" / "r.html"
    assert html.startswith("<!DOCTYPE html>")
    # plotly.js is inlined, nothing is fetched: no src/href to any URL
    assert "Plotly" in html and len(html) > 3_000_000
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", html)
    status = _status(html)
    assert list(status) == [k for k, _, _ in SECTIONS if k not in GIVEN_ONLY]   # no advice given: no advice section
    assert {s["status"] for s in status.values()} <= {"ok", "unavailable"}
    assert not [k for k, s in status.items() if s["status"] == "error"]


def test_sections_show_numbers_of_the_trace(tmp_path):
    built = build_report(constructed_trace(), sections=["peak", "largest", "iterations", "metadata"])
    html = built.html()
    assert built.status() == {"peak": "ok", "largest": "ok", "iterations": "ok", "metadata": "ok"}
    assert "4 iterations found (from marker)." in html
    assert "cuda:0: peak 5.2 KiB at 20 ns" in html  # 4000 + 1000 + 300 bytes, first reached at t=20
    assert "cpu: peak 50 B at 5 ns" in html


def test_a_failing_section_is_shown_and_recorded_without_killing_the_rest(monkeypatch, tmp_path):
    import memlens.reporting.sections.memory as mem

    def broken(ctx):
        raise RuntimeError("boom in largest")

    monkeypatch.setattr(mem, "largest", broken)
    built = build_report(constructed_trace())
    assert [s.key for s in built.failed] == ["largest"]
    assert built.failed[0].message == "RuntimeError: boom in largest"
    assert all(s.status == "ok" for s in built.sections if s.key not in ("largest", "allocator", "phases"))
    html = built.html()
    assert "This section failed: RuntimeError: boom in largest" in html
    assert ">Largest blocks (failed)</a>" in html  # the navigation bar points at it too
    assert _status(html)["largest"]["status"] == "error"


def test_sections_that_need_accesses_say_why():
    built = build_report(constructed_trace(with_accesses=False))
    unavailable = {s.key: s.message for s in built.sections if s.status == "unavailable"}
    assert not built.failed
    for key in ("ati", "outliers"):
        if key in unavailable:
            assert "per-access data" in unavailable[key]


def test_trace_text_is_escaped_everywhere(tmp_path):
    html = build_report(constructed_trace(names=XSS_NAMES)).html()
    for payload in XSS_NAMES:
        assert payload not in html
    lowered = html.lower()
    assert "<img" not in lowered and "<svg onload" not in lowered and "<!--<script" not in lowered
    # exactly our own script elements: plotly.js, the boot script, the status and one per figure
    scripts = re.findall(r"<script\b[^>]*>", html)
    own = [s for s in scripts if s == "<script>" or 'type="application/json"' in s]
    assert scripts == own and scripts.count("<script>") == 2
    assert "&lt;script&gt;window.__pwned" in html


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_no_section_fails_on_sample_traces(path):
    built = build_report(path, whatif_time_limit_s=0.2)
    assert not built.failed, [(s.key, s.message) for s in built.failed]
    assert built.status()["live"] == "ok" and built.status()["peak"] == "ok"


@pytest.mark.shared
def test_no_section_fails_on_real_snapshots(shared):
    for name in ("snapshots/cs336_wedsonlin_medium_128_training.pickle", "snapshots/decomfl_memory.pickle"):
        built = build_report(shared(name), whatif_time_limit_s=0.2)
        assert not built.failed, (name, [(s.key, s.message) for s in built.failed])
        assert built.status()["live"] == "ok"


@pytest.mark.shared
@pytest.mark.parametrize("name", ["kineto/kineto_resnet50_2021format.pt.trace.json.gz",
                                  "profiler/hta_memory_timeline.raw.gz", "dsa/tflm_person_detection.csv",
                                  "snapshots/flexgen_opt1.3b_2023format.pickle", "snapshots/verl_segments_only.pickle"])
def test_no_section_fails_on_every_imported_format(shared, name):
    built = build_report(shared(name), whatif_time_limit_s=0.1)
    assert not built.failed, (name, [(s.key, s.message) for s in built.failed])
    status = built.status()
    assert status["live"] == status["peak"] == status["largest"] == "ok"
    assert status["ati"] == status["outliers"] == "unavailable"  # none of these formats records accesses


def test_an_empty_trace_gives_a_report_that_says_why_each_section_is_empty():
    from memlens.trace import empty_table

    built = build_report(memlens.Trace.from_tables(empty_table("blocks")))
    assert not built.failed
    status = built.status()
    assert status["summary"] == status["metadata"] == "ok"
    assert all(v == "unavailable" for k, v in status.items() if k not in ("summary", "metadata"))
    assert "the trace has no blocks" in built.html()


def test_a_big_trace_is_reduced_not_truncated():
    """200,000 blocks: every figure stays small (level of detail), the peak is exact, nothing is dropped."""
    import numpy as np

    trace = big_trace(200_000)
    built = build_report(trace, sections=["live", "timeline", "largest"], max_points=2000)
    assert not built.failed
    html = built.html()
    assert len(html) < 9_000_000  # plotly.js is ~4.8 MB of it; 400,000 events of raw curve alone would be more
    by_key = {s.key: s for s in built.sections}
    live_fig = by_key["live"].parts[1]
    peak = [t for t in live_fig.data if t.name == "peak"][0]
    unit = {"MiB": 2**20, "GiB": 2**30}[live_fig.layout.yaxis.title.text.split("(")[1].rstrip(")")]
    assert peak.y[0] * unit == pytest.approx(trace.peak_live_bytes()["cuda:0"])
    assert all(len(t.x) <= 2001 for t in live_fig.data)
    timeline_fig = by_key["timeline"].parts[1]
    bars = sum(len(t.x) for t in timeline_fig.data if t.type == "bar")
    heat = [t for t in timeline_fig.data if t.type == "heatmap"][0]
    assert bars == 4000 and f"{200_000 - 4000:,} small blocks" in heat.name
    # the density layer holds the area of every aggregated block (in cell units, up to clipping at the edges)
    assert np.nansum(np.asarray(heat.z, dtype=float)) > 0


def test_unknown_section_or_option_is_an_input_error():
    with pytest.raises(memlens.InputError, match="unknown report sections"):
        build_report(constructed_trace(), sections=["nope"])
    with pytest.raises(memlens.InputError, match="bad report option"):
        build_report(constructed_trace(), colour="red")


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "memlens", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_cli_report_writes_the_file_and_reports_statuses(tmp_path, monkeypatch, capsys):
    from memlens.cli import main

    trace_dir = constructed_trace().save(tmp_path / "t.memlens")
    out = tmp_path / "out.html"
    res = _cli("report", str(trace_dir), "-o", str(out), "--json", "--sections", "live,peak,metadata")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["path"] == str(out) and out.stat().st_size == info["bytes"]
    assert [s["key"] for s in info["sections"]] == ["live", "peak", "metadata"]
    assert res.stderr == ""  # no progress bar when stderr is not a terminal
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(trace_dir), "--no-whatif", "--x", "event"]) == 0
    assert (tmp_path / "t.html").exists() and "report: t.html" in capsys.readouterr().out


@pytest.mark.parametrize("args", [("report", "/no/such/trace"), ("report", "{trace}", "--sections", "bogus"),
                                  ("report", "{trace}", "--memory-limit", "lots"),
                                  ("report", "{trace}", "--bandwidth", "warp-speed")])
def test_cli_report_bad_input_exits_2_with_one_line(tmp_path, capsys, args):
    from memlens.cli import main

    trace_dir = constructed_trace().save(tmp_path / "t.memlens")
    code = main([*[a.format(trace=trace_dir) for a in args], "-o", str(tmp_path / "x.html")])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("memlens: error:")
    assert not (tmp_path / "x.html").exists()


def test_peak_window_keeps_the_peak_and_cuts_blocks_at_its_edges():
    from memlens.analysis.iterations import split_iterations
    from memlens.reporting.window import peak_window

    trace = constructed_trace(n_iter=40)
    whole = peak_window(trace, max_blocks=10_000)
    assert whole.trace is trace and whole.how == "the whole trace"
    # by iteration: every iteration holds the same peak, the first one that reaches it is iteration 0
    w = peak_window(trace, max_blocks=10, iterations=split_iterations(trace))
    assert w.how.startswith("iteration 0") and w.blocks < w.total_blocks == len(trace.blocks)
    assert w.trace.peak_live_bytes()["cuda:0"] == trace.peak_live_bytes()["cuda:0"] == 5300
    # by allocation count, without iterations
    w = peak_window(trace, max_blocks=8)
    assert w.trace.peak_live_bytes()["cuda:0"] == 5300
    blocks = w.trace.blocks
    param = blocks[blocks["block_id"] == 0].iloc[0]
    assert param["allocated_before"] and pd.isna(param["free_ns"])  # lives across both edges
    assert blocks["alloc_ns"].dropna().min() >= 0 and w.start_ns <= 20 <= w.end_ns
    acc = w.trace.accesses
    assert ((acc["t_ns"] >= 0) & (acc["t_ns"] <= w.end_ns - w.start_ns)).all()


def test_big_traces_run_the_whatif_on_a_window(monkeypatch):
    import memlens.whatif as whatif

    seen = {}

    def fake_compare(trace, **kwargs):
        seen["blocks"] = len(trace.blocks)
        return real_compare(trace, **kwargs)

    real_compare = whatif.compare
    monkeypatch.setattr(whatif, "compare", fake_compare)
    built = build_report(constructed_trace(n_iter=40), sections=["whatif"], whatif_max_blocks=12,
                         whatif_time_limit_s=0.1)
    assert built.status() == {"whatif": "ok"}
    assert 0 < seen["blocks"] < 121
    assert "the what-if simulations ran on" in built.html()


def test_huge_metadata_values_are_truncated_in_the_page():
    trace = constructed_trace()
    trace.metadata["external_annotations"] = [{"name": f"step{i}", "time_us": i} for i in range(50_000)]
    html = build_report(trace, sections=["metadata"]).html()
    assert "more characters)" in html and "step49999" not in html and "step10" in html


@pytest.mark.shared
def test_allocator_section_shows_the_recorded_segments(shared):
    from memlens.units import format_bytes

    trace = memlens.load(shared("snapshots/cs336_wedsonlin_medium_128_training.pickle"))
    built = build_report(trace, sections=["allocator"])
    assert built.status() == {"allocator": "ok"}
    html = built.html()
    reserved = int(trace.segments["total_size"].sum())
    allocated = int(trace.segments["allocated_size"].sum())
    assert f"<td>{format_bytes(reserved)}</td><td>{format_bytes(allocated)}</td>" in html
    assert build_report(constructed_trace(), sections=["allocator"]).status() == {"allocator": "unavailable"}
