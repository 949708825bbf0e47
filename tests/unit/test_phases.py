"""The run's phases from a recording's ops (`memlens.analysis.phases`), on hand-made ops, and in the report
and `info --json` of a recorded sample trace."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

import memlens
from memlens.analysis.phases import phases_from_ops, trace_phases
from memlens.trace import Trace

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "transformer_train_adamw.memlens"


def _trace(rows, metadata=None):
    ops = pd.DataFrame(rows, columns=["op_id", "name", "start_ns", "end_ns", "phase", "iteration"])
    blocks = pd.DataFrame({"block_id": [0], "device": "cpu", "size": 64, "alloc_ns": [0], "free_ns": [None]})
    return Trace.from_tables(blocks, ops=ops, metadata=metadata)


def test_runs_of_ops_in_one_phase_within_one_iteration():
    trace = _trace([
        (0, "mm", 10, 20, "forward", 0), (1, "relu", 20, 25, "forward", 0),
        (2, "mse", 30, 31, "other", 0),                    # a loss outside modules: no phase, breaks nothing
        (3, "mm_bw", 40, 60, "backward", 0), (4, "add_", 70, 75, "optimizer", 0),
        (5, "mm", 80, 90, "forward", 1), (6, "mm_bw", 95, 99, "backward", 1),
        (7, "mm", 100, 130, "forward", 2),                  # a new iteration: a new run though the phase repeats
        (8, "relu", 120, 125, "forward", 2),               # ends before the op it follows: the run ends at 130
    ])
    want = [("forward", 10, 25), ("backward", 40, 60), ("optimizer_step", 70, 75), ("forward", 80, 90),
            ("backward", 95, 99), ("forward", 100, 130)]
    got = trace_phases(trace)
    assert [(p["name"], p["start_ns"], p["end_ns"]) for p in got] == want
    assert {p["source"] for p in got} == {"recorded ops"}
    assert all(type(p["name"]) is str for p in got)


def test_an_importers_phases_win_and_ops_without_phases_give_none():
    told = [{"name": "forward", "start_ns": 0, "end_ns": 5, "source": "annotation"}]
    trace = _trace([(0, "mm", 10, 20, "forward", 0)], metadata={"phases": told})
    assert trace_phases(trace) == told
    assert phases_from_ops(pd.DataFrame({"start_ns": [1], "end_ns": [2]})) == []
    assert phases_from_ops(_trace([(0, "mm", 1, 2, "other", 0)]).ops) == []


def test_a_recording_shows_its_phases_in_the_report_and_info():
    trace = memlens.load(SAMPLE)
    phases = trace_phases(trace)
    ops = trace.ops
    # by hand: per iteration, the recorded forward ops' first start and last end
    for it in (0, 1):
        fwd = ops[(ops["iteration"] == it) & (ops["phase"] == "forward")]
        run = [p for p in phases if p["name"] == "forward"][it]
        assert (run["start_ns"], run["end_ns"]) == (int(fwd["start_ns"].min()), int(fwd["end_ns"].max()))
    from memlens.analysis.peak_story import peak_story
    assert peak_story(trace)["phases"] == [{k: p[k] for k in ("name", "start_ns", "end_ns", "source")} for p in phases]
    from memlens.reporting import build_report
    report = build_report(trace, sections=["phases"])
    assert report.status() == {"phases": "ok"}
    assert f"{len(phases):,} phases: the forward pass" in report.html() and "host clock" in report.html()
