"""The what-if comparison: every stage present, in the order the bounds require, honest about gaps."""
from __future__ import annotations

import pandas as pd

from memlens import Trace
from memlens.whatif import STAGES, compare, whatif_figure

MS = 1_000_000
MB = 1 << 20


def small_trace() -> Trace:
    # a 64 MiB block idle for 400 ms across a 128 MiB temporary, plus small blocks that fragment
    blocks = pd.DataFrame([
        {"block_id": 0, "device": "cuda:0", "size": 64 * MB, "alloc_ns": 0, "free_ns": 600 * MS},
        {"block_id": 1, "device": "cuda:0", "size": 128 * MB, "alloc_ns": 200 * MS, "free_ns": 300 * MS},
        {"block_id": 2, "device": "cuda:0", "size": 3 * MB, "alloc_ns": 10 * MS, "free_ns": 250 * MS},
        {"block_id": 3, "device": "cuda:0", "size": 5 * MB, "alloc_ns": 20 * MS, "free_ns": 550 * MS},
    ])
    ops = pd.DataFrame([{"op_id": i, "name": f"op{i}", "start_ns": t, "end_ns": t + MS, "module": ""}
                        for i, t in enumerate([0, 10 * MS, 20 * MS, 200 * MS, 299 * MS, 500 * MS])])
    acc = pd.DataFrame([(0, 0, 0), (2, 10 * MS, 1), (3, 20 * MS, 2), (1, 200 * MS, 3), (1, 299 * MS, 4),
                        (0, 500 * MS, 5), (3, 500 * MS, 5)], columns=["block_id", "t_ns", "op_id"])
    acc["is_write"] = False
    return Trace.from_tables(blocks, acc, ops)


def by_stage(df, stage):
    return df.loc[df["stage"] == stage, "bytes"]


def test_compare_orders_the_bounds():
    df = compare(small_trace(), bandwidth="10GB/s", conf_variants=["expandable_segments:True"], time_limit_s=1)
    assert list(dict.fromkeys(df["stage"])) == list(STAGES)
    assert (df.loc[df["stage"] == "caching allocator", "variant"].tolist()
            == ["recorded settings", "expandable_segments:True"])
    max_live = int(by_stage(df, "max-live").iloc[0])
    assert max_live == (64 + 128 + 3 + 5) * MB
    assert int(by_stage(df, "static plan").iloc[0]) >= max_live
    assert (by_stage(df, "caching allocator").astype(int) >= max_live).all()
    swapped = int(by_stage(df, "swapping").iloc[0])
    bound = int(by_stage(df, "infinite bandwidth").iloc[0])
    assert bound <= swapped <= max_live
    assert swapped == (128 + 3) * MB  # the 64 and 5 MiB blocks idle off the device while the temporary lives
    assert by_stage(df, "recorded reserved").isna().all()
    note = df.loc[df["stage"] == "recorded reserved", "note"].iloc[0]
    assert "segment events" in note
    ratios = df["ratio_to_max_live"].dropna()
    assert (ratios.loc[df["stage"] == "max-live"] == 1.0).all()


def test_trace_without_accesses_says_why_swapping_is_missing(shared):
    from memlens.io import load
    trace = load(shared("snapshots/decomfl_memory.pickle"))
    df = compare(trace, time_limit_s=0.5)
    recorded = by_stage(df, "recorded reserved")
    simulated = by_stage(df, "caching allocator")
    assert recorded.notna().all() and int(recorded.iloc[0]) == int(simulated.iloc[0])  # faithful replay
    assert int(recorded.iloc[0]) >= int(by_stage(df, "static plan").iloc[0]) >= int(by_stage(df, "max-live").iloc[0])
    swap = df[df["stage"].isin(["swapping", "infinite bandwidth"])]
    assert swap["bytes"].isna().all() and swap["note"].str.contains("per-access").all()


def test_whatif_figure_has_one_bar_per_row():
    df = compare(small_trace(), bandwidth="10GB/s", time_limit_s=0.5)
    fig = whatif_figure(df)
    assert len(fig.data) == 1 and len(fig.data[0].y) == len(df)
    assert fig.data[0].x[list(df["stage"]).index("max-live")] == int(by_stage(df, "max-live").iloc[0])
