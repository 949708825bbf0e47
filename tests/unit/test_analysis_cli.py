"""`memlens ati` / `memlens outliers` and the findings sentences, on constructed traces."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from memlens.analysis.findings import findings, findings_html
from memlens.cli import main
from memlens.trace import Trace
from test_analysis_iterations import training_trace
from test_analysis_outliers import idle_trace


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "idle.memlens"
    idle_trace().save(path)
    return str(path)


@pytest.fixture
def snapshot_like(tmp_path):
    blocks = pd.DataFrame({"block_id": [1, 2], "device": ["cuda:0"] * 2, "size": [10, 20],
                           "alloc_ns": [0, 5], "free_ns": [10, 20]})
    path = tmp_path / "noacc.memlens"
    Trace.from_tables(blocks, metadata={"source_kind": "cuda_snapshot"}).save(path)
    return str(path)


def test_ati_json(saved, capsys):
    assert main(["ati", saved, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # the ATIs of idle_trace: 88 (A), 194 (C), 19 (D), from the end of one op to the start of the next
    assert doc["intervals"] == 3
    assert doc["p50_ns"] == 88.0 and doc["max_ns"] == 194
    assert doc["p90_ns"] == pytest.approx(88 + 0.8 * (194 - 88))  # rank 0.9 * 2 = 1.8
    assert sum(row["count"] for row in doc["histogram"]) == 3
    # edges beside it: B's alloc->first 10, last->free 19; A 10 and 7; C 5 and 6; D 25 and 8
    assert doc["edges"]["alloc_to_first"]["count"] == 4 and doc["edges"]["last_to_free"]["count"] == 4
    assert doc["edges"]["last_to_free"]["total_ns"] == 19 + 7 + 6 + 8
    assert doc["clock"]["kind"] == "host" and doc["steady_state"] is False


def test_ati_text_and_grouping(saved, capsys):
    assert main(["ati", saved, "--by", "category"]) == 0
    out = capsys.readouterr().out
    assert "3 intervals over 3 blocks" in out and "optimizer_state" in out and "p90" in out
    assert "host clock" in out and "lifetime edges" in out


def test_outliers_json_and_text(saved, capsys):
    assert main(["outliers", saved, "--bandwidth", "1GB/s", "--latency-us", "0", "--top", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["blocks"]
    assert [r["block_id"] for r in rows] == [3, 1]
    assert rows[0]["size"] == 5 and rows[0]["max_idle_ns"] == 194 and rows[0]["swappable_bytes_ns"] == 920
    assert rows[1]["swappable_bytes_ns"] == 680 and rows[1]["category"] == "activation"
    assert doc["clock"]["kind"] == "host" and doc["bandwidth"]["h2d_latency_ns"] == 0
    assert doc["filter"]["intervals"] == 3 and doc["filter"]["swappable"] == 2
    assert main(["outliers", saved, "--bandwidth", "1GB/s", "--latency-us", "0"]) == 0
    out = capsys.readouterr().out
    assert "33.3% of 3 ATIs (access->access) are too short" in out and "aten::zeros" in out
    assert "host clock" in out


def test_outliers_zhang_priority_and_min_size(saved, capsys):
    assert main(["outliers", saved, "--bandwidth", "1GB/s", "--latency-us", "0", "--priority", "doa",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["blocks"] == [] and doc["min_size"] == 1 << 20  # 1 MiB floor: these blocks are bytes
    assert main(["outliers", saved, "--bandwidth", "1GB/s", "--latency-us", "0", "--priority", "doa",
                 "--min-size", "0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["blocks"]
    assert [(r["block_id"], r["doa_ns"]) for r in rows] == [(3, 184.0), (1, 68.0)]
    assert main(["outliers", saved, "--min-size", "lots"]) == 2


def test_no_accesses_exits_2_with_reason(snapshot_like, capsys):
    for verb in ("ati", "outliers"):
        assert main([verb, snapshot_like]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "noacc.memlens" in err and "per-access data" in err


def test_bad_options_exit_2(saved, capsys):
    assert main(["outliers", saved, "--bandwidth", "fast"]) == 2
    assert "fast" in capsys.readouterr().err
    assert main(["outliers", saved, "--top", "0"]) == 2
    assert main(["ati", saved + "-missing"]) == 2


def test_findings_with_accesses():
    trace, _, _ = training_trace(n_iter=6)
    sentences = findings(trace, bandwidth="inf")
    text = " ".join(sentences)
    assert sentences[0].startswith("The trace (unknown) holds")
    assert "6 iterations were found by detecting the repeating allocation pattern (12 allocations per step)" in text
    assert "0.0% of the ATIs are shorter than the time to move" in text  # infinite bandwidth: none
    assert "idle for more than 40.0% of the step" in text
    assert "cuda:0 peaks at" in text


def test_findings_without_accesses_say_what_is_missing():
    trace, _, _ = training_trace(n_iter=4, with_accesses=False)
    text = " ".join(findings(trace))
    assert "cannot be computed" in text and "4 iterations were found" in text
    assert "peaks at" in text


def test_findings_html_escapes():
    html = findings_html(["a <b> & c", "2 > 1"])
    assert html == '<ul class="memlens-findings"><li>a &lt;b&gt; &amp; c</li><li>2 &gt; 1</li></ul>'
