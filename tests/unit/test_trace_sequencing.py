"""The global event order `Trace.from_tables` gives blocks whose producer left `alloc_seq`/`free_seq` out, and
the same order from the streamed buffer-lifetime CSV conversion, on hand-made lifetimes."""
from __future__ import annotations

import pandas as pd

from memlens.io.lifetimes_csv import ALLOC_SEQ_BASE, _blocks_of
from memlens.trace import Trace


def _events_in_order(blocks: pd.DataFrame) -> list[tuple[str, int]]:
    """(kind, block_id) of every alloc and free, sorted by (time, seq) as every consumer orders them."""
    rows = []
    for b in blocks.itertuples():
        rows.append((b.alloc_ns, b.alloc_seq, "alloc", b.block_id))
        if not pd.isna(b.free_ns):
            rows.append((b.free_ns, b.free_seq, "free", b.block_id))
    return [(kind, bid) for _, _, kind, bid in sorted(rows)]


# A lives [0, 10); B lives zero ns at 10; C lives [10, 20); D lives zero ns at 20 alone; E never freed.
LIFETIMES = [(0, 0, 10), (1, 10, 10), (2, 10, 20), (3, 20, 20), (4, 5, None)]
# at an instant: earlier blocks' frees, then allocs (by block id), then the frees of blocks that live zero ns
WANT = [("alloc", 0), ("alloc", 4), ("free", 0), ("alloc", 1), ("alloc", 2), ("free", 1),
        ("free", 2), ("alloc", 3), ("free", 3)]


def test_from_tables_sequences_a_zero_length_block_alloc_then_free():
    blocks = pd.DataFrame({"block_id": [b for b, _, _ in LIFETIMES], "device": "plan", "size": 64,
                           "alloc_ns": [a for _, a, _ in LIFETIMES],
                           "free_ns": pd.array([f for _, _, f in LIFETIMES], dtype="Int64")})
    got = Trace.from_tables(blocks).blocks
    # ranks 0..8 over the 9 events, exactly
    assert got["alloc_seq"].tolist() == [0, 3, 4, 7, 1]
    assert got["free_seq"].tolist()[:4] == [2, 5, 6, 8] and pd.isna(got["free_seq"].iloc[4])
    assert _events_in_order(got) == WANT


def test_streamed_csv_rows_order_events_as_from_tables():
    rows = pd.DataFrame({"id": ["a", "b", "c", "d"], "lower": [0, 10, 10, 20], "upper": [10, 10, 20, 20],
                         "size": 64})
    got = _blocks_of(rows, first_block=0)
    assert got["alloc_seq"].tolist() == [ALLOC_SEQ_BASE + i for i in range(4)]
    assert got["free_seq"].tolist() == [0, 2 * ALLOC_SEQ_BASE + 1, 2, 2 * ALLOC_SEQ_BASE + 3]
    assert _events_in_order(got) == [e for e in WANT if e[1] != 4]


def test_a_zero_length_block_is_live_at_its_instant():
    # 64 B alive [0, 10) and 100 B allocated and freed at 10: after A's free at 10, B holds 100 B for an instant
    blocks = pd.DataFrame({"block_id": [0, 1], "device": "plan", "size": [64, 100], "alloc_ns": [0, 10],
                           "free_ns": pd.array([10, 10], dtype="Int64")})
    live = Trace.from_tables(blocks).live_bytes("plan")
    assert live["live"].tolist() == [64, 0, 100, 0]
    assert int(live["live"].max()) == 100


def test_one_live_curve_for_the_trace_and_the_analyses():
    """`Trace.live_bytes` and `analysis.live.live_curve` walk the same events (`memlens.trace.live_events`): a
    block alive before recording, a zero-size block, a block never freed and two events at one instant,
    checked by hand."""
    import pandas as pd
    from memlens.analysis.live import live_curve
    from memlens.trace import Trace
    blocks = pd.DataFrame({"block_id": [1, 2, 3, 4], "device": "cpu", "size": [100, 0, 30, 7],
                           "alloc_ns": [None, 10, 10, 20], "free_ns": [40, 15, None, 40]})
    trace = Trace.from_tables(blocks, pd.DataFrame({"block_id": [], "t_ns": [], "op_id": [], "is_write": []}),
                              pd.DataFrame({"op_id": [1], "name": "op", "start_ns": [0], "end_ns": [50]}))
    lb = trace.live_bytes("cpu")
    frame, alloc_at = live_curve(trace, "cpu")
    assert lb["live"].tolist() == frame["live"].tolist() == [100, 100, 130, 130, 137, 37, 30]
    assert lb["delta"].tolist() == [100, 0, 30, 0, 7, -100, -7]
    assert lb["t_ns"].tolist() == frame["t_ns"].tolist() == [0, 10, 10, 15, 20, 40, 40]
    # each block's alloc event position on the curve, in the blocks table's row order
    rows = trace.blocks.set_index("block_id").index.get_indexer([1, 2, 3, 4])
    assert [int(alloc_at[r]) for r in rows] == [0, 1, 2, 4]
    assert trace.peak_live_bytes() == {"cpu": 137}
