"""Every summary sentence is computed from the table beside it: the peak's "module holding most of it" and its
largest category are the first rows of the by-module / by-category tables (recomputed here from the live
blocks), "(unknown)" included when it is the largest; a diff between traces without stacks says nothing
about stacks."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

import memlens
from memlens.analysis.findings import findings
from memlens.analysis.peak import live_at, peak_breakdown
from memlens.reporting.diff_page import diff_report
from memlens.units import format_bytes

SAMPLES = sorted(Path(__file__).resolve().parents[2].glob("sample_traces/*.memlens"))
SHARED = ["snapshots/cs336_wedsonlin_medium_128_training.pickle", "snapshots/decomfl_memory.pickle",
          "snapshots/flexgen_opt1.3b_2023format.pickle", "kineto/tracelens_h100_bert_small.json.gz"]


def _first_row(live: pd.DataFrame, key: str) -> tuple[str, int]:
    """The largest group of `live` blocks by `key` ("" read as "(unknown)"), by brute force."""
    totals: dict[str, int] = {}
    for label, size in zip(live[key].astype(str), live["size"]):
        label = label or "(unknown)"
        totals[label] = totals.get(label, 0) + int(size)
    return max(sorted(totals.items()), key=lambda kv: kv[1])


def _check_peak_sentences(trace):
    sentences = findings(trace)
    for dev, pb in peak_breakdown(trace).items():
        sentence = next(s for s in sentences if s.startswith(f"{dev} peaks at"))
        live = live_at(trace, dev, pb.peak_seq, pb.peak_ns)
        module, module_bytes = _first_row(live, "module")
        named = (live["module"].astype(str) != "").any()
        if named:
            assert f"The module holding most of it is {module} ({format_bytes(module_bytes)}" in sentence
        else:
            assert "module holding" not in sentence
        category, category_bytes = _first_row(live, "category")
        if category == "unknown" and (live["category"].astype(str) != "unknown").any():
            assert f"most of it, {format_bytes(category_bytes)}" in sentence and "is unknown" in sentence
        elif category != "unknown":
            assert f"; {category} holds {format_bytes(category_bytes)}" in sentence


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_sample_summaries_match_their_tables(path):
    _check_peak_sentences(memlens.load(path))


def test_unknown_module_is_named_when_largest():
    # transformer_train_adamw: blocks outside any module (the optimizer's, the batch) hold the most at the peak
    trace = memlens.load(Path(__file__).resolve().parents[2] / "sample_traces" / "transformer_train_adamw.memlens")
    pb = next(iter(peak_breakdown(trace).values()))
    assert pb.by_module.iloc[0]["module"] == "(unknown)"
    second = pb.by_module[pb.by_module["module"] != "(unknown)"].iloc[0]
    assert pb.module_sentence() == (f"The module holding most of it is (unknown) "
                                    f"({format_bytes(pb.by_module.iloc[0]['bytes'])}: blocks no module allocated); "
                                    f"next is {second['module']} ({format_bytes(second['bytes'])}).")
    _check_peak_sentences(trace)


@pytest.mark.parametrize("rel", SHARED)
def test_shared_summaries_match_their_tables(rel, shared):
    _check_peak_sentences(memlens.load(shared(rel)))


def test_diff_without_stacks_says_nothing_about_stacks(tmp_path):
    root = Path(__file__).resolve().parents[2] / "sample_traces"
    a, b = memlens.load(root / "cnn_inference.memlens"), memlens.load(root / "transformer_train_adamw.memlens")
    assert (a.stacks is None or len(a.stacks) == 0) and (b.stacks is None or len(b.stacks) == 0)
    d = memlens.diff(a, b)
    assert len(d.stacks) == 0
    assert not any("stack" in s.lower() for s in d.summary())
    assert not any("stack" in c.lower() for c in d.cannot_compare)
    # nor does the page (scripts aside: plotly's code says "stack" for its bar modes)
    diff_report(d, tmp_path / "diff.html")
    text = re.sub(r"<script.*?</script>", "", (tmp_path / "diff.html").read_text(), flags=re.S)
    assert "stack" not in text.lower()


def test_diff_with_stacks_on_one_side_counts_its_table():
    root = Path(__file__).resolve().parents[2] / "sample_traces"
    a, b = memlens.load(root / "cnn_inference.memlens"), memlens.load(root / "mlp_train_sgd_stacks.memlens")
    d = memlens.diff(a, b)
    assert [c for c in d.cannot_compare if "stacks" in c] == [
        "stacks at the peak: A records no call stacks, so its blocks are keyed by their allocation site (op or "
        "'(no stack)') instead"]
    sentence = next(s for s in d.summary() if s.startswith("At the peak, stacks"))
    for change in ("appeared", "vanished", "grew", "shrank"):
        rows = d.stacks[d.stacks["change"] == change]
        if len(rows):
            assert f"{len(rows):,} {change} ({format_bytes(int(rows['delta'].abs().sum()))})" in sentence
        else:
            assert change not in sentence.split(";")[0]
