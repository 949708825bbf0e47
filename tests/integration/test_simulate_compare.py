"""Baseline allocators, the side-by-side comparison and `memlens simulate` on the command line."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from memlens.cli import main
from memlens.simulate import compare, compare_figure, simulate
from memlens.simulate.baselines import BestFitHeap, BumpArena, DeviceMalloc
from memlens.trace import Trace

MiB = 1 << 20


def lifetimes_trace(rows, device="cuda:0") -> Trace:
    """rows: (size, alloc_ns, free_ns or None)."""
    blocks = pd.DataFrame({"block_id": range(len(rows)), "device": device,
                           "size": [r[0] for r in rows], "alloc_ns": [r[1] for r in rows],
                           "free_ns": pd.array([r[2] for r in rows], dtype="Int64")})
    return Trace.from_tables(blocks)


# ---- baselines -------------------------------------------------------------------------------------
def test_device_malloc_reserves_exactly_what_is_live():
    a = DeviceMalloc()
    a.malloc(1, 1000, 0)
    a.malloc(2, 3 * MiB, 0)
    assert a.reserved == a.allocated == 1024 + 3 * MiB
    a.free(1)
    assert a.reserved == 3 * MiB
    assert [e[2] for e in a.segment_events] == ["segment_alloc", "segment_alloc", "segment_free"]


def test_best_fit_heap_reuses_the_smallest_hole_and_coalesces():
    h = BestFitHeap()
    for bid, size in enumerate([4096, 1024, 2048, 512]):  # addresses 0, 4096, 5120, 7168; top 7680
        h.malloc(bid, size, 0)
    h.free(0)  # hole 4096 at 0
    h.free(2)  # hole 2048 at 5120
    assert h.malloc(10, 1536, 0) == 5120  # the 2048 hole is the best fit
    h.free(10)
    h.free(1)  # 0..4096 + 4096..5120 + 5120..7168 coalesce into one hole
    assert h.malloc(11, 7168, 0) == 0
    h.free(11)
    h.free(3)  # everything free: the heap top shrinks to 0
    assert h.reserved == 0


def test_bump_arena_reclaims_only_from_the_top():
    b = BumpArena()
    b.malloc(1, 1024, 0)
    b.malloc(2, 1024, 0)
    b.free(1)
    assert b.reserved == 2048  # block 1 is below a live block
    b.free(2)
    assert b.reserved == 0


def test_baselines_oom_under_a_capacity():
    for cls in (DeviceMalloc, BestFitHeap, BumpArena):
        a = cls(capacity=2048)
        assert a.malloc(1, 1024, 0) is not None
        assert a.malloc(2, 2048, 0) is None
        assert len(a.ooms) == 1 and a.ooms[0]["requested"] == 2048


def test_baselines_through_simulate_report_the_same_measures():
    trace = lifetimes_trace([(30 * MiB, 0, 20), (10 * MiB, 10, 30), (30 * MiB, 25, None)])
    peaks = {}
    for name in ("caching", "malloc", "bestfit", "bump"):
        dev = simulate(trace, allocator=name).devices["cuda:0"]
        assert dev.peak_allocated == 40 * MiB
        peaks[name] = dev.peak_reserved
    assert peaks["malloc"] == 40 * MiB
    assert peaks["bestfit"] == 40 * MiB  # the 30 MiB hole at 0 is reused
    assert peaks["bump"] == 70 * MiB  # block 0's space lies below live block 1
    assert peaks["caching"] == 40 * MiB  # 30 MiB segment reused, 10 MiB one (10 MiB rounds to 10 MiB)


# ---- compare -----------------------------------------------------------------------------------------
def test_compare_table_and_figure():
    trace = lifetimes_trace([(5 * MiB, 0, 10), (30 * MiB, 5, 20), (6 * MiB, 15, None)])
    df = compare(trace, {"default": ("caching", None), "expandable": "expandable_segments:True",
                         "cudaMalloc": "malloc"})
    assert df["config"].tolist() == ["default", "expandable", "cudaMalloc"]
    row = df.set_index("config")
    # default: 5 MiB takes a 20 MiB segment, 30 MiB its own; the 6 MiB request reuses the first segment
    assert row.loc["default", "peak_reserved"] == 50 * MiB
    # expandable: 5 + 30 MiB fit two 20 MiB pages, but the 6 MiB request finds only two free 5 MiB
    # blocks (best fit fails) and maps a third page at the tail
    assert row.loc["expandable", "peak_reserved"] == 60 * MiB
    assert row.loc["cudaMalloc", "peak_reserved"] == 36 * MiB  # 30 + 6 MiB live at t = 15
    assert row.loc["default", "vs_first"] == 1.0
    fig = compare_figure(df)
    assert [t.name for t in fig.data] == ["default", "expandable", "cudaMalloc"]
    assert max(fig.data[1].y) == pytest.approx(60 / 1024)


def test_compare_puts_the_recording_first(shared):
    df = compare(str(shared("snapshots/decomfl_memory.pickle")),
                 {"recorded settings": ("caching", None), "expandable": "expandable_segments:True"})
    assert df["config"].tolist()[0] == "recorded"
    assert df.loc[0, "peak_reserved"] == df.loc[1, "peak_reserved"] == 1_897_922_560
    assert df.loc[2, "peak_reserved"] < df.loc[0, "peak_reserved"]  # expandable reserves less here


# ---- CLI -----------------------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "t.memlens"
    lifetimes_trace([(30 * MiB, 0, 20), (10 * MiB, 10, 30), (30 * MiB, 25, None)]).save(path)
    return str(path)


def test_cli_json(saved, capsys):
    assert main(["simulate", saved, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cuda:0"]["peak_reserved"] == 40 * MiB
    assert out["cuda:0"]["peak_allocated"] == 40 * MiB
    assert out["cuda:0"]["segment_allocs"] == [30 * MiB, 10 * MiB]


def test_cli_capacity_reports_ooms(saved, capsys):
    assert main(["simulate", saved, "--capacity", "35MiB", "--allocator", "bump"]) == 0
    text = capsys.readouterr().out
    assert "OOM at seq" in text and "peak reserved" in text


def test_cli_conf_and_text(saved, capsys):
    assert main(["simulate", saved, "--conf", "expandable_segments:True"]) == 0
    text = capsys.readouterr().out
    assert "expandable_segments:True" in text and "segment allocs" in text


def test_cli_bad_input_exits_2(saved, tmp_path, capsys):
    assert main(["simulate", saved, "--conf", "max_split_size_mb:1"]) == 2
    assert "max_split_size_mb" in capsys.readouterr().err
    assert main(["simulate", str(tmp_path / "missing.pickle")]) == 2
    assert main(["simulate", saved, "--capacity", "huge"]) == 2


def test_cli_snapshot_shows_the_recorded_peak(shared, capsys):
    assert main(["simulate", str(shared("snapshots/decomfl_memory.pickle"))]) == 0
    text = capsys.readouterr().out
    assert "recorded peak reserved: 1.8 GiB (simulated +0 B), 61 recorded segment allocs" in text
