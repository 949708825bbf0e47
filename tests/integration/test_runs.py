"""Many runs at once: memlens.load_many / RunSet, `memlens info A B C`, `memlens report A B C`."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import memlens
from memlens.analysis.runs import RunSet, rank_from_metadata, rank_from_name
from memlens.errors import InputError
from memlens.trace.read import load_trace

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
BIG, SMALL = SAMPLES / "transformer_train_adamw.memlens", SAMPLES / "mlp_train_sgd_stacks.memlens"


def cli(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "memlens", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


def walk_peak(trace, device) -> int:
    """Peak live bytes by walking alloc/free events in time order (frees first at equal times)."""
    b = trace.blocks[trace.blocks["device"] == device]
    lo, _ = trace.time_span_ns()
    ev = [(int(r.alloc_ns) if pd.notna(r.alloc_ns) else lo, 1, int(r.size)) for r in b.itertuples()]
    ev += [(int(r.free_ns), 0, -int(r.size)) for r in b.itertuples() if pd.notna(r.free_ns)]
    live = peak = 0
    for _, _, d in sorted(ev, key=lambda e: (e[0], e[1])):
        live += d
        peak = max(peak, live)
    return peak


@pytest.fixture
def ranks_dir(tmp_path):
    if not (BIG.exists() and SMALL.exists()):
        pytest.skip("sample traces absent")
    for rank, src in ((0, SMALL), (1, BIG), (2, SMALL)):
        shutil.copytree(src, tmp_path / f"job_rank{rank}.memlens")
    return tmp_path


def test_ranks_from_names_and_lazy_parallel_peaks(ranks_dir, monkeypatch):
    import memlens.io as io
    calls = []
    real = io.load
    monkeypatch.setattr(io, "load", lambda p, *a, **k: calls.append(p) or real(p, *a, **k))
    runs = memlens.load_many(str(ranks_dir / "job_rank*.memlens"))
    assert isinstance(runs, RunSet) and calls == []  # nothing loaded yet
    assert [(r.rank, r.rank_source) for r in runs.runs] == [(0, "file name"), (1, "file name"), (2, "file name")]
    peaks = runs.peaks()
    assert len(calls) == 3
    runs.peaks()
    assert len(calls) == 3  # once
    small, big = load_trace(SMALL), load_trace(BIG)
    assert peaks["allocated_bytes"].tolist() == [walk_peak(small, "cpu"), walk_peak(big, "cpu"),
                                                 walk_peak(small, "cpu")]
    assert peaks["reserved_bytes"].isna().all()  # a CPU recording has no allocator segments
    assert set(peaks.columns) >= {"run", "device", "allocated_bytes", "reserved_bytes", "peak_ns"}
    t0 = big.metadata["t0_unix_ns"]
    assert peaks.loc[1, "peak_unix_ns"] == t0 + peaks.loc[1, "peak_ns"]


def test_imbalance_names_the_rank_and_the_spread(ranks_dir):
    runs = memlens.load_many(sorted(ranks_dir.glob("*.memlens")))
    big, small = walk_peak(load_trace(BIG), "cpu"), walk_peak(load_trace(SMALL), "cpu")
    s = runs.imbalance_stats()
    assert (s["max_rank"], s["max_bytes"], s["min_bytes"], s["spread_bytes"]) == (1, big, small, big - small)
    text = runs.imbalance()
    assert "rank 1 peaks highest" in text and f"across 3 ranks" in text
    assert f"{(big - small) / big:.1%}" in text
    d = runs.diff(0, 1)
    assert int(d.peak["delta"].iloc[0]) == big - small


def test_rank_from_metadata_wins_over_the_name(tmp_path):
    if not SMALL.exists():
        pytest.skip("sample traces absent")
    for name_rank, meta_rank in ((0, 5), (1, 4)):
        t = load_trace(SMALL)
        t.metadata["distributedInfo"] = {"backend": "nccl", "rank": meta_rank, "world_size": 8}
        t.save(tmp_path / f"rank{name_rank}.memlens")
    runs = memlens.load_many(str(tmp_path / "*.memlens"))
    assert [(r.rank, Path(r.path).name, r.rank_source) for r in runs.runs] == [
        (4, "rank1.memlens", "metadata"), (5, "rank0.memlens", "metadata")]
    assert runs.trace(4).metadata["distributedInfo"]["rank"] == 4


def test_kineto_distributed_info_and_reserved_peak(shared, tmp_path):
    path = shared("kineto/hta_df_index_resolver.json.gz")
    assert rank_from_metadata(path) == 1
    runs = memlens.load_many([path])
    assert runs.runs[0].rank == 1 and runs.runs[0].rank_source == "metadata"
    peaks = runs.peaks().set_index("device")
    # independently: the largest "Total Reserved" of the GPU's [memory] events in the raw file
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    reserved = [e["args"]["Total Reserved"] for e in events if e.get("name") == "[memory]"
                and e["args"].get("Device Type") == 1]
    assert peaks.loc["cuda:1", "reserved_bytes"] == max(reserved)
    assert peaks.loc["cuda:1", "allocated_bytes"] <= peaks.loc["cuda:1", "reserved_bytes"]


def test_file_order_when_names_say_nothing(tmp_path):
    if not SMALL.exists():
        pytest.skip("sample traces absent")
    for name in ("b.memlens", "a.memlens"):
        shutil.copytree(SMALL, tmp_path / name)
    runs = memlens.load_many([tmp_path / "b.memlens", tmp_path / "a.memlens"])
    assert [(Path(r.path).name, r.rank, r.rank_source) for r in runs.runs] == [
        ("a.memlens", 0, "file order"), ("b.memlens", 1, "file order")]
    assert "same" in runs.imbalance()


def test_rank_in_names():
    assert [rank_from_name(n) for n in ("trace_rank3.json", "rank-03.pickle", "r7.memlens", "node1_rank_12.pt.trace.json",
                                        "run12.json", "resnet50.json")] == [3, 3, 7, 12, None, None]


def test_bad_inputs(tmp_path):
    with pytest.raises(InputError, match="matches no file"):
        memlens.load_many(str(tmp_path / "nothing*.json"))
    with pytest.raises(InputError, match="no such file"):
        memlens.load_many([tmp_path / "absent.json"])
    rc, _, err = cli("info", str(tmp_path / "x.memlens"), str(tmp_path / "y.memlens"))
    assert rc == 2 and "no such file" in err


def test_info_with_several_files(ranks_dir):
    rc, out, err = cli("info", *sorted(str(p) for p in ranks_dir.glob("*.memlens")), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert [r["rank"] for r in doc["runs"]] == [0, 1, 2]
    assert doc["runs"][1] == {"path": str(ranks_dir / "job_rank1.memlens"), "rank": 1, "rank_source": "file name",
                              **json.loads(json.dumps(load_trace(BIG).summary()))}
    assert doc["imbalance_stats"]["max_rank"] == 1 and "rank 1 peaks highest" in doc["imbalance"]
    rc, out, _ = cli("info", *sorted(str(p) for p in ranks_dir.glob("*.memlens")))
    assert rc == 0 and out.count("== rank") == 3 and "imbalance:" in out


def test_report_with_several_runs(ranks_dir, artifacts_dir):
    out = artifacts_dir / "runs_report.html"
    rc, stdout, err = cli("report", *sorted(str(p) for p in ranks_dir.glob("*.memlens")), "-o", str(out), "--json")
    assert rc == 0, err
    doc = json.loads(stdout)
    assert [r["rank"] for r in doc["runs"]] == [0, 1, 2]
    assert all(v == "ok" for run in doc["sections"].values() for v in run.values())
    html = out.read_text()
    assert html.count("<option value=") == 3 and html.count('class="memlens-run"') == 3
    assert 'id="memlens-runs-peaks"' in html and "https://" not in html.split("<script>")[0]
    status = json.loads(html.split('id="memlens-report-status">')[1].split("</script>")[0])
    assert status["runs"] == ["rank 0", "rank 1", "rank 2"]


def test_report_run_selector_in_a_browser(ranks_dir, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from report_support import OfflineBrowser, require_chromium
    require_chromium()
    out = tmp_path / "runs.html"
    rc, _, err = cli("report", *sorted(str(p) for p in ranks_dir.glob("*.memlens")), "-o", str(out))
    assert rc == 0, err
    browser = OfflineBrowser()
    try:
        page = browser._context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort())
        page.goto(out.as_uri())
        page.wait_for_function("document.body.getAttribute('data-run-shown') !== null")
        shown = "Array.from(document.querySelectorAll('div.memlens-run')).map(d => d.style.display !== 'none')"
        assert page.evaluate(shown) == [True, False, False]
        page.select_option("#memlens-run-select", "2")
        assert page.evaluate(shown) == [False, False, True]
        # clicking rank 1's bar in the peaks chart shows rank 1
        centres = page.evaluate("Array.from(document.querySelectorAll('#memlens-runs-peaks .bars path'))"
                                ".map(p => {const r = p.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]})")
        assert len(centres) == 3
        page.mouse.click(*centres[1])
        page.wait_for_function("document.body.getAttribute('data-run-shown') === '1'")
        assert page.evaluate(shown) == [False, True, False]
        assert errors == []
    finally:
        browser.close()


def test_peaks_figure_uses_the_unit_that_suits_the_runs():
    import pandas as pd

    from memlens.reporting.runs_page import peaks_figure
    mib = pd.DataFrame({"run": ["rank 0", "rank 1"], "device": "cuda:0",
                        "allocated_bytes": [6 << 20, 3 << 19], "reserved_bytes": pd.array([8 << 20, None], "Int64")})
    fig = peaks_figure(mib)
    assert fig.layout.yaxis.title.text == "peak (MiB)"
    assert list(fig.data[0].y) == [6.0, 1.5] and list(fig.data[1].y) == [8.0, 0.0]
    assert "MiB allocated" in fig.data[0].hovertemplate
    gib = mib.assign(allocated_bytes=[5 << 30, 1 << 29], reserved_bytes=pd.array([None, None], "Int64"))
    fig = peaks_figure(gib)
    assert fig.layout.yaxis.title.text == "peak (GiB)" and list(fig.data[0].y) == [5.0, 0.5] and len(fig.data) == 1


def test_report_of_several_runs_says_its_size_in_binary_units(ranks_dir, tmp_path):
    from memlens.units import format_bytes
    out = tmp_path / "runs.html"
    rc, stdout, err = cli("report", *sorted(str(p) for p in ranks_dir.glob("*.memlens")), "-o", str(out))
    assert rc == 0, err
    assert f"report: {out} ({format_bytes(out.stat().st_size)}, 3 runs, " in stdout and " MB" not in stdout
