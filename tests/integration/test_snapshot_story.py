"""Real CUDA snapshots tell the whole story, items 1, 2 and 9: robust reading (frame lines out of
range, missing fields noted, `--debug` tracebacks), reserved memory (counting what was reserved before
recording, never below live, agreeing across simulate, fragmentation and `info` on every real snapshot),
and the one-way layers. Phases and iterations are checked in tests/integration/test_snapshot_story_phases.py;
categories, the cause of the peak, `info --json` and stacks in tests/integration/test_snapshot_story_peak.py.
"""
from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pandas as pd
import pytest

import memlens
from memlens.cli import main
from memlens.io.safe_pickle import load_pickle
from memlens.reserved import reserved_curve
from memlens.trace import Trace

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ("cs336_wedsonlin_medium_128_training", "cs336_wedsonlin_medium_128_inference", "decomfl_memory",
             "flexgen_opt1.3b_2023format", "verl_segments_only")


# ---- 2. robust reading -------------------------------------------------------------------------------
def test_frame_line_of_2_64_minus_1_and_negative_lines_load(shared, tmp_path, capsys):
    raw = load_pickle(shared("snapshots/cs336_wedsonlin_medium_128_inference.pickle"))
    entries = raw["device_traces"][0]
    for i, line in ((5, 2**64 - 1), (6, -1)):  # C++ writes an unknown line as unsigned -1
        entries[i]["frames"] = [dict(f) for f in entries[i]["frames"]]
        entries[i]["frames"][0]["line"] = line
    path = tmp_path / "bad_line.pickle"
    path.write_bytes(pickle.dumps(raw))
    trace = memlens.load(path)
    assert len(trace.blocks) == 1503 and trace.stacks["line"].min() >= 0
    assert any("2 stack frames with a negative, out-of-range" in n for n in trace.metadata["notes"])
    assert main(["info", str(path)]) == 0
    assert "peak live: cuda:0" in capsys.readouterr().out


def test_missing_fields_are_read_and_noted():
    snap = {"segments": [{"device": 0}, {"address": 4096, "blocks": [{"size": 512, "state": "active_allocated",
                                                                      "requested_size": 100}, {"state": "inactive"}]}],
            "device_traces": [[{"action": "alloc", "addr": 4096, "size": 100, "time_us": 5},
                               {"addr": 1, "size": 2, "time_us": 6}]]}
    trace = memlens.io.snapshot.importer.snapshot_to_trace(snap)
    notes = " ".join(trace.metadata["notes"])
    for what in ("segments without an address", "segments without a device", "without total_size",
                 "segment blocks without a size", "trace entries without an action"):
        assert what in notes, what
    assert trace.segments["total_size"].tolist() == [512]  # the blocks tile the segment
    assert (trace.events["action"] == "(no action)").sum() == 1
    newer = memlens.io.snapshot.importer.snapshot_to_trace({**snap, "from_a_future_torch": {"x": 1}})
    assert newer.metadata["other_keys"] == ["from_a_future_torch"]
    assert any("from_a_future_torch" in n for n in newer.metadata["notes"])
    assert (trace.events["action"] == "(no action)").sum() == 1


def test_debug_prints_the_traceback_of_input_errors(tmp_path, capsys):
    bad = tmp_path / "x.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": "x", "size": 1}]]}))
    assert main(["info", str(bad)]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert main(["--debug", "info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("memlens: error:")


# ---- 1. reserved memory ------------------------------------------------------------------------------
def _warm_trace():
    """40 MiB reserved before recording; recording sees +20 MiB then -40 MiB of segments; 30 MiB final."""
    blocks = pd.DataFrame({"block_id": [0, 1], "device": ["cuda:0"] * 2, "size": [30 << 20, 15 << 20],
                           "alloc_ns": [pd.NA, 10], "free_ns": [pd.NA, 20], "alloc_seq": [-1, 1],
                           "free_seq": [pd.NA, 2], "allocated_before": [True, False]})
    events = pd.DataFrame({"seq": [0, 1, 2, 3], "t_ns": [5, 10, 20, 30], "device": ["cuda:0"] * 4,
                           "action": ["segment_alloc", "alloc", "free_completed", "segment_free"],
                           "addr": [1 << 30, 1 << 30, 1 << 30, 2 << 30], "size": [20 << 20, 15 << 20, 15 << 20, 20 << 20],
                           "stream": [0] * 4, "block_id": [pd.NA, 1, 1, pd.NA]})
    segments = pd.DataFrame({"device": ["cuda:0"], "addr": [3 << 30], "total_size": [40 << 20],
                             "allocated_size": [30 << 20], "active_size": [30 << 20],
                             "requested_size": [30 << 20], "stream": [0], "pool": ["large"]})
    return Trace.from_tables(blocks, events=events, segments=segments)


def test_reserved_curve_counts_memory_reserved_before_recording():
    trace = _warm_trace()
    curve = reserved_curve(trace, "cuda:0")
    # final 40 MiB, net of the events 0: 40 MiB at the start (a curve from 0 would dip to -20 MiB)
    assert curve.initial == 40 << 20 and curve.peak == 60 << 20 and curve.final == 40 << 20
    assert curve.reserved.min() >= 0 and curve.raised_by == 0
    live = trace.live_bytes("cuda:0")
    assert (curve.at(live["seq"].to_numpy()) >= live["live"].to_numpy()).all()


def test_reserved_never_below_live_even_when_the_file_contradicts_it():
    trace = _warm_trace()
    trace.segments = trace.segments.assign(total_size=[1 << 20])  # a final state too small for the live block
    curve = reserved_curve(trace, "cuda:0")
    live = trace.live_bytes("cuda:0")
    assert (curve.at(live["seq"].to_numpy()) >= live["live"].to_numpy()).all()
    assert curve.raised_by > 0


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_reserved_agrees_everywhere_and_is_at_least_allocated(shared, name):
    from memlens.analysis.fragmentation import fragmentation
    from memlens.analysis.peak_story import peak_story
    from memlens.simulate import simulate

    trace = memlens.load(shared(f"snapshots/{name}.pickle"))
    sim = simulate(trace)
    frag = fragmentation(trace)
    told = peak_story(trace)
    for dev in trace.devices:
        curve = reserved_curve(trace, dev)
        live = trace.live_bytes(dev)
        assert (curve.at(live["seq"].to_numpy()) >= live["live"].to_numpy()).all()
        assert curve.peak >= trace.peak_live_bytes()[dev]
        assert sim.devices[dev].recorded["peak_reserved"] == curve.peak
        assert sim.devices[dev].recorded["initial_reserved"] == curve.initial
        assert frag[dev]["peak_reserved_bytes"] == curve.peak
        assert told["peak"][dev]["reserved_bytes"] == curve.peak
        # the final level is what the file's segments hold
        raw = load_pickle(shared(f"snapshots/{name}.pickle"))
        assert curve.final == sum(s["total_size"] for s in raw["segments"] if f"cuda:{s.get('device', 0)}" == dev)


# ---- 9. layers ---------------------------------------------------------------------------------------
LOWER = {"recording": ("memlens.analysis", "memlens.viz", "memlens.reporting", "memlens.widgets",
                    "memlens.simulate", "memlens.plan", "memlens.swap", "memlens.whatif", "memlens.commands"),
         "io": ("memlens.analysis", "memlens.viz", "memlens.reporting", "memlens.widgets",
                "memlens.simulate", "memlens.plan", "memlens.swap", "memlens.whatif", "memlens.commands"),
         "analysis": ("memlens.viz", "memlens.reporting", "memlens.widgets", "memlens.commands"),
         "simulate": ("memlens.viz", "memlens.reporting", "memlens.widgets", "memlens.commands")}


@pytest.mark.parametrize("package", sorted(LOWER))
def test_flow_stays_one_way(package):
    files = list((ROOT / "memlens" / package).rglob("*.py"))
    assert files, package   # the package exists: an empty glob would pass vacuously
    bad = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [f"{f.name}: {n}" for n in names if n.startswith(LOWER[package])]
    assert not bad
