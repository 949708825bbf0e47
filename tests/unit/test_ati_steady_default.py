"""`memlens ati --steady-state` without --iteration reads one iteration, the last after the warm-up, and says
which: the warm-up's long intervals (parameters idle from construction to the first forward) never enter the
headline."""
from __future__ import annotations

import json
from pathlib import Path

from memlens.analysis.ati import access_intervals, ati_stats
from memlens.analysis.iterations import split_iterations, steady_iteration
from memlens.cli import main
from memlens.io import load

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "transformer_train_adamw.memlens"


def test_steady_state_headline_is_the_default_iteration(capsys):
    trace = load(SAMPLE)
    its = split_iterations(trace)
    k = steady_iteration(its)
    assert k is not None and k != int(its["iteration"].iloc[0])  # not the warm-up
    explicit = ati_stats(access_intervals(trace, steady_state=True, iteration=k))
    assert main(["ati", str(SAMPLE), "--steady-state", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["iteration"] == k and doc["iteration_default"] is True
    for key in ("count", "p50_ns", "p90_ns", "max_ns", "wrap_around"):
        assert doc[key] == explicit[key], key
    # nothing from before the chosen iteration: every interval starts in its window
    iv = access_intervals(trace, steady_state=True)
    w0, w1 = iv.attrs["window_ns"]
    assert ((iv["start_ns"] >= w0) & (iv["start_ns"] < w1)).all()
    # the recording's longest intervals start before that window (the warm-up's) and are not in the headline
    linear = access_intervals(trace)
    earlier = linear[(linear["kind"] == "access_to_access") & (linear["start_ns"] < w0)]
    assert int(earlier["length_ns"].max()) > doc["max_ns"]
    assert main(["ati", str(SAMPLE), "--steady-state"]) == 0
    text = capsys.readouterr().out
    assert f"steady state, iteration {k} (the last after the warm-up; --iteration K picks another)" in text
