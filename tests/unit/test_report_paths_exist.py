"""No dead or temporary path reaches the user: the per-rank prediction page names the rank traces the command
saved, and says "not saved" for the ones that lived only while the page was built."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import memlens
from memlens.reporting.predicted_ranks import NOT_SAVED, write_predicted_ranks_report

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "mlp_train_sgd_stacks.memlens"


def _gpu_trace():
    """The sample recording as if on cuda:0 (the page replaces the GPU rows' peaks by the prediction's)."""
    trace = memlens.load(SAMPLE)
    return memlens.Trace.from_tables(trace.blocks.assign(device="cuda:0"), trace.accesses, trace.ops,
                                     metadata=dict(trace.metadata))


def _prediction():
    trace = _gpu_trace()
    results = [SimpleNamespace(rank=r, ran=True, stands_for=r, peak_allocated=1, peak_reserved=2) for r in (0, 1)]
    return SimpleNamespace(predictions={r: SimpleNamespace(trace=trace) for r in (0, 1)}, results=results,
                           errors={}, world_size=2, gpu="H100", symmetry=None, notes=[], stages={})


def _paths_named(html: str) -> set[str]:
    return set(re.findall(r"[\w./-]*rank\d\.memlens", html))


def test_unsaved_rank_traces_are_not_named(tmp_path):
    html_path = write_predicted_ranks_report(_prediction(), tmp_path / "ranks.html")
    html = Path(html_path).read_text()
    assert "memlens-ranks-" not in html and not _paths_named(html)
    assert html.count(NOT_SAVED) >= 2  # one per rank in the selector at least


def test_saved_rank_traces_are_named_and_exist(tmp_path):
    saved = {}
    for r in (0, 1):
        saved[r] = str(tmp_path / "out" / f"rank{r}.memlens")
        _gpu_trace().save(saved[r])
    html = Path(write_predicted_ranks_report(_prediction(), tmp_path / "ranks.html", saved=saved)).read_text()
    assert "memlens-ranks-" not in html and NOT_SAVED not in html
    named = _paths_named(html)
    assert named == set(saved.values()) and all(Path(p).exists() for p in named)
