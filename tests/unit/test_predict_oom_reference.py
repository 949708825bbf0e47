"""`memlens.prediction.oom.first_oom` against references written here: hand-made OOMs and a brute-force live
set over small random traces (hypothesis).

The reference, from the docstrings: the failing request is the ``cuda:0`` block whose ``alloc_seq`` is the
first OOM's ``seq``; what was live then is every ``cuda:0`` block allocated strictly before that instant
(blocks alive before recording included) and not freed at or before it, largest first.
"""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from memlens.prediction.oom import OOM, first_oom  # noqa: E402
from memlens.trace import Trace  # noqa: E402

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MiB = 1 << 20
LIVE_COLUMNS = ["block_id", "size", "category", "op", "module"]


def _trace(rows: list[dict], stacks: pd.DataFrame | None = None) -> Trace:
    b = pd.DataFrame(rows, columns=["block_id", "device", "size", "requested_size", "alloc_ns", "free_ns",
                                    "alloc_seq", "free_seq", "category", "op", "module", "stack_id"])
    b["allocated_before"] = b["alloc_ns"].isna()
    return Trace.from_tables(b, stacks=stacks)


def _row(bid, size, alloc, free=None, seq=None, free_seq=None, device="cuda:0", requested=None, category="activation",
         op="aten::mm", module="blk", stack_id=None):
    return {"block_id": bid, "device": device, "size": size, "requested_size": size if requested is None else requested,
            "alloc_ns": alloc, "free_ns": free, "alloc_seq": -1 if seq is None else seq, "free_seq": free_seq,
            "category": category, "op": op, "module": module, "stack_id": stack_id}


def _replay(*ooms):
    return SimpleNamespace(ooms=list(ooms))


def _hand_trace():
    """cuda:0: a 4 MiB parameter alive before recording; 2 MiB at 10 (seq 0) freed at 30 (seq 2) -- exactly
    when the failing request comes; 1 MiB at 20 (seq 1); the failing 6 MiB request (asked 5,000,000 bytes) at
    30 (seq 3) by aten::cat in decoder, with stack 7; 3 MiB at 40 (seq 4), after it. cuda:1: 8 MiB at 5."""
    stacks = pd.DataFrame({"stack_id": [7, 7, 8], "depth": [0, 1, 0], "name": ["c10::alloc", "step", "other"],
                           "filename": ["", "train.py", "x.py"], "line": [0, 12, 1]})
    rows = [_row(0, 4 * MiB, None, category="parameter", op="", module=""),
            _row(1, 2 * MiB, 10, free=30, seq=0, free_seq=2),
            _row(2, 1 * MiB, 20, seq=1, op="aten::add", module="", category="gradient"),
            _row(3, 6 * MiB, 30, seq=3, requested=5_000_000, op="aten::cat", module="decoder", stack_id=7),
            _row(4, 3 * MiB, 40, seq=4),
            _row(5, 8 * MiB, 5, seq=5, device="cuda:1")]
    return _trace(rows, stacks)


def test_first_oom_by_hand():
    trace = _hand_trace()
    replay = _replay({"seq": 3, "t_ns": 999, "requested": 1, "reserved": 12 * MiB},
                     {"seq": 4, "t_ns": 40, "requested": 3 * MiB, "reserved": 13 * MiB})
    oom = first_oom(trace, replay, capacity=16 * MiB)
    assert isinstance(oom, OOM)
    # the block at seq 3: its id, the bytes asked for, op, module and its own stamp (not the replay's)
    assert (oom.block_id, oom.size, oom.op, oom.module, oom.t_ns) == (3, 5_000_000, "aten::cat", "decoder", 30)
    assert (oom.reserved, oom.capacity) == (12 * MiB, 16 * MiB)
    # live at 30: the parameter (4 MiB) and the 1 MiB gradient; the 2 MiB block is freed at 30, the failing
    # block itself and the 3 MiB one come later, the 8 MiB one is on cuda:1: 4 + 1 = 5 MiB
    assert oom.allocated == 5 * MiB
    assert list(oom.live.columns) == LIVE_COLUMNS
    assert oom.live.to_dict("records") == [
        {"block_id": 0, "size": 4 * MiB, "category": "parameter", "op": "", "module": ""},
        {"block_id": 2, "size": 1 * MiB, "category": "gradient", "op": "aten::add", "module": ""}]
    assert oom.live.index.tolist() == [0, 1]
    assert oom.stack.to_dict("records") == [
        {"stack_id": 7, "depth": 0, "name": "c10::alloc", "filename": "", "line": 0},
        {"stack_id": 7, "depth": 1, "name": "step", "filename": "train.py", "line": 12}]
    # 5,000,000 B = 4.8 MiB; 5 MiB allocated; 12 MiB reserved of 16 MiB
    assert str(oom) == "OOM: aten::cat in decoder asks for 4.8 MiB with 5.0 MiB allocated and 12.0 MiB reserved of 16.0 MiB"


def test_first_oom_without_a_matching_block():
    trace = _hand_trace()
    # seq 5 is a cuda:1 block, seq 77 none: the request is described by the replay alone
    for seq in (5, 77):
        oom = first_oom(trace, _replay({"seq": seq, "t_ns": 25, "requested": 3 * MiB, "reserved": 9 * MiB}), 10 * MiB)
        assert (oom.block_id, oom.size, oom.op, oom.module, oom.t_ns, oom.stack) == (-1, 3 * MiB, "", "", 25, None)
        # live at 25: the parameter, the 2 MiB block (freed at 30) and the gradient
        assert oom.live["block_id"].tolist() == [0, 1, 2] and oom.allocated == 7 * MiB
        assert str(oom) == ("OOM:  in (no module) asks for 3.0 MiB with 7.0 MiB allocated and 9.0 MiB reserved of "
                            "10.0 MiB")
    # a replay entry without a time, request or reserved bytes: 0 for each; at 0 only the parameter is live
    oom = first_oom(trace, _replay({"seq": 77}), 10 * MiB)
    assert (oom.t_ns, oom.size, oom.reserved, oom.allocated) == (0, 0, 0, 4 * MiB)
    assert oom.live["block_id"].tolist() == [0]


def test_first_oom_none_and_stackless():
    trace = _hand_trace()
    assert first_oom(trace, None, 1) is None
    assert first_oom(trace, _replay(), 1) is None
    # the block at seq 1 has no stack id; without a stacks table none either
    assert first_oom(trace, _replay({"seq": 1, "reserved": 0}), 1).stack is None
    trace.stacks = None
    oom = first_oom(trace, _replay({"seq": 3, "reserved": 0}), 1)
    assert oom.stack is None and oom.block_id == 3
    # a stack id that the stacks table lacks gives an empty stack, not another one
    trace = _hand_trace()
    trace.blocks.loc[trace.blocks["block_id"] == 3, "stack_id"] = 9
    assert len(first_oom(trace, _replay({"seq": 3, "reserved": 0}), 1).stack) == 0


@st.composite
def oom_cases(draw):
    """cuda:0 and cuda:1 blocks with distinct sizes, alloc stamps (or none: alive before recording), maybe
    freed, global seq by stamp; the OOM's seq names one of them or none."""
    n = draw(st.integers(1, 8))
    sizes = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n, unique=True))
    rows = []
    for i in range(n):
        alloc = None if draw(st.integers(0, 4)) == 0 else draw(st.integers(0, 20))
        free = None if draw(st.booleans()) else draw(st.integers(alloc or 0, 25))
        rows.append(_row(i, sizes[i] * 512, alloc, free=free, device=draw(st.sampled_from(["cuda:0", "cuda:1"])),
                         requested=sizes[i] * 512 - draw(st.integers(0, 511))))
    order = sorted(range(n), key=lambda i: (rows[i]["alloc_ns"] is not None, rows[i]["alloc_ns"] or 0, i))
    for seq, i in enumerate(order):
        rows[i]["alloc_seq"] = seq if rows[i]["alloc_ns"] is not None else -1
        rows[i]["free_seq"] = n + seq if rows[i]["free_ns"] is not None else None
    oom_seq = draw(st.sampled_from([r["alloc_seq"] for r in rows if r["alloc_seq"] >= 0] + [100]))
    return rows, {"seq": oom_seq, "t_ns": draw(st.integers(0, 25)), "requested": 7, "reserved": 11}


@SETTINGS
@given(oom_cases())
def test_first_oom_matches_the_brute_force_reference(case):
    rows, entry = case
    oom = first_oom(_trace(rows), _replay(entry), 1 << 40)
    hit = [r for r in rows if r["device"] == "cuda:0" and r["alloc_seq"] == entry["seq"]]
    t = hit[0]["alloc_ns"] if hit else entry["t_ns"]
    live = [r for r in rows if r["device"] == "cuda:0"
            and (r["alloc_ns"] is None or r["alloc_ns"] < t) and (r["free_ns"] is None or r["free_ns"] > t)]
    live.sort(key=lambda r: -r["size"])
    assert oom.t_ns == t
    assert oom.block_id == (hit[0]["block_id"] if hit else -1)
    assert oom.size == (hit[0]["requested_size"] if hit else 7)
    assert oom.live["block_id"].tolist() == [r["block_id"] for r in live]
    assert oom.live["size"].tolist() == [r["size"] for r in live]
    assert oom.allocated == sum(r["size"] for r in live)
    assert (oom.reserved, oom.capacity) == (11, 1 << 40)
