"""`memlens.reserved` against references written here: hand-computed curves and a brute-force curve.

The reference (`reference_curve`) follows the module's docstring, not its code: the level changes by +size at
segment_alloc / segment_map and -size at segment_free / segment_unmap; the level at the start is the final
segments' total walked back through the net of those events (0 without final segments), then raised one byte
at a time until it is never below 0 nor below the bytes live after any alloc / free (live bytes counted here,
block by block, from the generated events).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from memlens.reserved import (RELEASE_ACTIONS, RESERVE_ACTIONS, ReservedCurve, reserved_curve,  # noqa: E402
                              reserved_curves, segment_deltas)
from memlens.trace import Trace  # noqa: E402

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEV, OTHER = "cuda:0", "cuda:1"
MiB = 1 << 20
WALKED_BACK = "final segments walked back through the segment events"
FINAL_ONLY = "final segments (no segment events recorded)"
EVENTS_ONLY = "segment events only; the level at the start is the least that holds the live blocks"


def _trace(blocks: list[dict], events: list[dict] | None, segments: list[tuple[str, int]] | None) -> Trace:
    """A Trace from plain rows; `segments`: (device, total_size) of the final state."""
    b = pd.DataFrame(blocks, columns=["block_id", "device", "size", "alloc_ns", "free_ns", "alloc_seq",
                                      "free_seq", "allocated_before"])
    ev = None if events is None else pd.DataFrame(
        events, columns=["seq", "t_ns", "device", "action", "addr", "size", "stream"])
    seg = None if segments is None else pd.DataFrame({
        "device": [d for d, _ in segments], "addr": [4096 * (i + 1) for i in range(len(segments))],
        "total_size": [s for _, s in segments], "allocated_size": 0, "active_size": 0, "requested_size": 0,
        "stream": 0, "pool": "large"})
    return Trace.from_tables(b, events=ev, segments=seg)


def _ev(seq, t, action, size, device=DEV):
    return {"seq": seq, "t_ns": t, "device": device, "action": action, "addr": 1 << 30, "size": size, "stream": 0}


# ---- the tables of constants -------------------------------------------------------------------------
def test_action_tables_exact():
    assert RESERVE_ACTIONS == ("segment_alloc", "segment_map")
    assert RELEASE_ACTIONS == ("segment_free", "segment_unmap")


def test_segment_deltas_each_action():
    actions = np.array(["segment_alloc", "segment_map", "segment_free", "segment_unmap", "alloc",
                        "free_completed", "oom", "snapshot"], dtype=object)
    sizes = np.array([3, 5, 7, 11, 13, 17, 19, 23])
    # +size for the two reservations, -size for the two releases, 0 for block and other events
    out = segment_deltas(actions, sizes)
    assert out.tolist() == [3, 5, -7, -11, 0, 0, 0, 0]
    assert out.dtype == np.int64
    # sizes above 2**31 stay exact (an int32 cast would wrap them)
    assert segment_deltas(np.array(["segment_map"], dtype=object), np.array([5 << 32])).tolist() == [5 << 32]


# ---- hand-computed curves ------------------------------------------------------------------------------
def _warm():
    """40 MiB final; events +20 MiB (seq 0), alloc 15 MiB (1), free (2), -20 MiB (3) on cuda:0; a block of
    30 MiB alive before recording. An other device's event interleaved at seq 4 changes nothing here."""
    blocks = [{"block_id": 0, "device": DEV, "size": 30 * MiB, "alloc_ns": None, "free_ns": None, "alloc_seq": -1,
               "free_seq": None, "allocated_before": True},
              {"block_id": 1, "device": DEV, "size": 15 * MiB, "alloc_ns": 10, "free_ns": 20, "alloc_seq": 1,
               "free_seq": 2, "allocated_before": False}]
    events = [_ev(3, 30, "segment_free", 20 * MiB), _ev(0, 5, "segment_alloc", 20 * MiB),   # rows out of order
              _ev(1, 10, "alloc", 15 * MiB), _ev(2, 20, "free_completed", 15 * MiB),
              _ev(4, 40, "segment_alloc", 64 * MiB, device=OTHER)]
    return blocks, events


def test_warm_start_curve_by_hand():
    blocks, events = _warm()
    curve = reserved_curve(_trace(blocks, events, [(DEV, 25 * MiB), (DEV, 15 * MiB), (OTHER, 64 * MiB)]), DEV)
    # final 25 + 15 = 40 MiB; the events net +20 - 20 = 0, so 40 MiB at the start; 60 MiB after seq 0
    assert curve.device == DEV
    assert curve.seq.tolist() == [-1, 0, 1, 2, 3]
    assert curve.t_ns.tolist() == [5, 5, 10, 20, 30]   # the start row sits at the trace's first stamp (5)
    assert curve.reserved.tolist() == [40 * MiB, 60 * MiB, 60 * MiB, 60 * MiB, 40 * MiB]
    assert (curve.initial, curve.final, curve.peak, curve.peak_ns) == (40 * MiB, 40 * MiB, 60 * MiB, 5)
    assert curve.raised_by == 0 and curve.basis == WALKED_BACK
    assert curve.reserved.dtype == np.int64
    frame = curve.frame()
    assert list(frame.columns) == ["seq", "t_ns", "reserved"]
    assert frame["reserved"].tolist() == curve.reserved.tolist() and frame["seq"].tolist() == curve.seq.tolist()
    assert frame["t_ns"].tolist() == curve.t_ns.tolist()


def test_at_before_between_and_after_events():
    blocks, events = _warm()
    # final 10 MiB: the walk back gives 10 MiB - 0 net at the start, too low for the 30 MiB block alive
    # before recording (start >= 30 MiB) and for 30 + 15 = 45 MiB live after seq 1 when the level is
    # start + 20 MiB (start >= 25 MiB): the start is raised by 20 MiB to 30 MiB
    curve = reserved_curve(_trace(blocks, events, [(DEV, 10 * MiB)]), DEV)
    assert curve.raised_by == 20 * MiB and curve.initial == 30 * MiB and curve.final == 30 * MiB
    assert curve.reserved.tolist() == [30 * MiB, 50 * MiB, 50 * MiB, 50 * MiB, 30 * MiB]
    # before the first recorded event (seq -1 or earlier) the level is the one when recording began
    assert curve.at(-7).tolist() == 30 * MiB and curve.at(-2).tolist() == 30 * MiB
    assert curve.at(-1).tolist() == 30 * MiB
    # just after seq 0 (+20 MiB) until seq 3 (-20 MiB), then 30 MiB again, also past the last event
    assert curve.at([0, 1, 2, 3, 4, 99]).tolist() == [50 * MiB] * 3 + [30 * MiB] * 3


def test_at_looks_up_the_last_change_at_or_before():
    blocks = [{"block_id": 1, "device": DEV, "size": 1, "alloc_ns": 10, "free_ns": None, "alloc_seq": 2,
               "free_seq": None, "allocated_before": False}]
    events = [_ev(0, 1, "segment_alloc", 100), _ev(5, 9, "segment_map", 30), _ev(9, 12, "segment_unmap", 70)]
    curve = reserved_curve(_trace(blocks, events, None), DEV)
    # no final segments: the start is the least level keeping the curve >= 0 and >= live (1 byte after
    # seq 2, when the level is start + 100): 0 -> 100 -> 130 -> 60, never negative, so 0
    assert curve.basis == EVENTS_ONLY and curve.raised_by == 0 and curve.initial == 0
    assert curve.reserved.tolist() == [0, 100, 130, 60]
    assert curve.at([-3, -1, 0, 1, 4, 5, 8, 9, 10]).tolist() == [0, 0, 100, 100, 100, 130, 130, 60, 60]
    assert (curve.peak, curve.peak_ns, curve.final) == (130, 9, 60)


def test_raised_by_when_releases_exceed_reservations():
    # only releases recorded, no final state, no blocks: the start must be 10 + 5 bytes for the curve to
    # stay >= 0 (it ends at 0)
    events = [_ev(0, 100, "segment_free", 10), _ev(1, 200, "segment_unmap", 5)]
    blocks = [{"block_id": 1, "device": "cpu", "size": 4, "alloc_ns": 150, "free_ns": None, "alloc_seq": 3,
               "free_seq": None, "allocated_before": False}]
    curve = reserved_curve(_trace(blocks, events, None), DEV)
    assert curve.raised_by == 15 and curve.initial == 15
    assert curve.reserved.tolist() == [15, 5, 0] and curve.final == 0
    assert (curve.peak, curve.peak_ns) == (15, 100)
    # with a final state of 3 bytes the walk back gives 3 + 15 = 18 at the start: consistent, nothing raised
    curve = reserved_curve(_trace(blocks, events, [(DEV, 3)]), DEV)
    assert curve.raised_by == 0 and curve.reserved.tolist() == [18, 8, 3] and curve.basis == WALKED_BACK
    # a final state of 0 walks back to 15: exactly enough
    assert reserved_curve(_trace(blocks, events, [(DEV, 0)]), DEV).raised_by == 0


def test_raised_by_for_live_bytes_with_a_consistent_walk():
    # final 8 bytes, one +8 reservation at seq 1: the walk back gives 0 at the start, but a 6-byte block is
    # live from seq 0 (before the reservation), so the start is raised to 6, and the end to 14
    events = [_ev(0, 10, "alloc", 6), _ev(1, 20, "segment_alloc", 8)]
    blocks = [{"block_id": 1, "device": DEV, "size": 6, "alloc_ns": 10, "free_ns": None, "alloc_seq": 0,
               "free_seq": None, "allocated_before": False}]
    curve = reserved_curve(_trace(blocks, events, [(DEV, 8)]), DEV)
    assert (curve.initial, curve.raised_by, curve.final) == (6, 6, 14)
    assert curve.reserved.tolist() == [6, 6, 14]
    assert (curve.peak, curve.peak_ns) == (14, 20)


def test_constant_level_over_the_whole_trace():
    # final segments, no segment event for the device: one flat segment from the trace's first to last stamp
    blocks = [{"block_id": 1, "device": DEV, "size": 6, "alloc_ns": 50, "free_ns": 70, "alloc_seq": 0,
               "free_seq": 1, "allocated_before": False}]
    for events in (None, [], [_ev(0, 50, "alloc", 6), _ev(1, 70, "free_completed", 6)]):
        curve = reserved_curve(_trace(blocks, events, [(DEV, 9)]), DEV)
        if events:   # alloc / free events are rows of the curve, at an unchanged level
            assert curve.seq.tolist() == [-1, 0, 1] and curve.t_ns.tolist() == [50, 50, 70]
            assert curve.reserved.tolist() == [9, 9, 9]
        else:
            assert curve.seq.tolist() == [-1, -1] and curve.t_ns.tolist() == [50, 70]
            assert curve.reserved.tolist() == [9, 9]
        assert curve.basis == FINAL_ONLY and (curve.initial, curve.final, curve.peak) == (9, 9, 9)
        assert curve.peak_ns == 50 and curve.raised_by == 0
        assert curve.at([-5, 0, 3]).tolist() == [9, 9, 9]
    # a final state too small for the live block: raised, still flat
    curve = reserved_curve(_trace(blocks, None, [(DEV, 2)]), DEV)
    assert curve.reserved.tolist() == [6, 6] and curve.raised_by == 4 and curve.initial == 6


def test_no_curve_without_segments_or_segment_events():
    blocks = [{"block_id": 1, "device": DEV, "size": 6, "alloc_ns": 50, "free_ns": 70, "alloc_seq": 0,
               "free_seq": 1, "allocated_before": False}]
    assert reserved_curve(_trace(blocks, None, None), DEV) is None
    # block events only, and segments of another device: still none for this one
    events = [_ev(0, 50, "alloc", 6), _ev(1, 70, "free_completed", 6)]
    assert reserved_curve(_trace(blocks, events, [(OTHER, 8)]), DEV) is None
    assert reserved_curve(_trace(blocks, events, []), DEV) is None
    # segment events that net to zero still make a curve
    events += [_ev(2, 80, "segment_alloc", 4), _ev(3, 90, "segment_free", 4)]
    curve = reserved_curve(_trace(blocks, events, None), DEV)
    # live 6 bytes after seq 0, when the running net is 0: the start is raised to 6
    assert curve.reserved.tolist() == [6, 6, 6, 10, 6] and curve.raised_by == 6


def test_reserved_curves_lists_every_device_that_has_one():
    blocks = [{"block_id": 1, "device": DEV, "size": 6, "alloc_ns": 50, "free_ns": 70, "alloc_seq": 0,
               "free_seq": 1, "allocated_before": False},
              {"block_id": 2, "device": "cpu", "size": 6, "alloc_ns": 50, "free_ns": 70, "alloc_seq": 2,
               "free_seq": 3, "allocated_before": False}]
    # cuda:0: final segments; cuda:1: only in the segments (no block); cuda:2: only segment events (no block,
    # no final state: not a device of the trace, so not listed); cuda:3: a block and segment events but no
    # final segments (listed beside the devices of the final state); cpu: nothing
    blocks = blocks + [{"block_id": 3, "device": "cuda:3", "size": 2, "alloc_ns": 55, "free_ns": None,
                        "alloc_seq": 5, "free_seq": None, "allocated_before": False}]
    events = [_ev(4, 60, "segment_alloc", 5, device="cuda:2"), _ev(6, 65, "segment_alloc", 4, device="cuda:3")]
    curves = reserved_curves(_trace(blocks, events, [(DEV, 8), ("cuda:1", 16)]))
    assert list(curves) == [DEV, "cuda:1", "cuda:3"]
    # cuda:3: 2 bytes live from seq 5, before its +4 at seq 6: the start is raised to 2
    assert curves["cuda:3"].reserved.tolist() == [2, 6] and curves["cuda:3"].seq.tolist() == [-1, 6]
    assert all(isinstance(c, ReservedCurve) for c in curves.values())
    assert curves[DEV].reserved.tolist() == [8, 8] and curves["cuda:1"].reserved.tolist() == [16, 16]
    assert curves["cuda:1"].t_ns.tolist() == [50, 70]
    assert reserved_curves(_trace(blocks, None, None)) == {}
    # the devices come sorted
    assert list(reserved_curves(_trace(blocks, None, [("cuda:1", 16), (DEV, 8)]))) == [DEV, "cuda:1"]


# ---- brute force over small random traces ----------------------------------------------------------------
SEGMENT_DELTA = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


@st.composite
def recordings(draw):
    """Steps on two devices in global order (seq 0, 1, ...; stamps nondecreasing, ties allowed): segment
    events, block allocs and frees (recorded as events or not), other events; blocks alive before recording;
    final segments of either device, possibly missing or inconsistent."""
    n_before = draw(st.integers(0, 2))
    blocks, events, live_ids = [], [], {DEV: [], OTHER: []}
    for i in range(n_before):
        dev = draw(st.sampled_from([DEV, OTHER]))
        blocks.append({"block_id": 1000 + i, "device": dev, "size": draw(st.integers(1, 6)), "alloc_ns": None,
                       "free_ns": None, "alloc_seq": -1, "free_seq": None, "allocated_before": True})
        live_ids[dev].append(len(blocks) - 1)
    record_block_events = draw(st.booleans())
    n = draw(st.integers(1, 12))
    t = draw(st.integers(0, 50))
    for seq in range(n):
        t += draw(st.sampled_from([0, 1, 7]))
        dev = draw(st.sampled_from([DEV, DEV, OTHER]))
        kind = draw(st.sampled_from(["segment_alloc", "segment_map", "segment_free", "segment_unmap", "alloc",
                                     "free", "oom"]))
        size = draw(st.integers(1, 6))
        if kind == "free" and not live_ids[dev]:
            kind = "alloc"
        if kind == "alloc":
            blocks.append({"block_id": seq, "device": dev, "size": size, "alloc_ns": t, "free_ns": None,
                           "alloc_seq": seq, "free_seq": None, "allocated_before": False})
            live_ids[dev].append(len(blocks) - 1)
        elif kind == "free":
            row = blocks[live_ids[dev].pop(draw(st.integers(0, len(live_ids[dev]) - 1)))]
            row["free_ns"], row["free_seq"] = t, seq
            size = row["size"]
        if kind in SEGMENT_DELTA or kind == "oom" or record_block_events:
            events.append(_ev(seq, t, "free_completed" if kind == "free" else kind, size, device=dev))
    events = draw(st.permutations(events))   # the table's row order is not the event order
    segments = []
    for dev in (DEV, OTHER):
        for _ in range(draw(st.integers(0, 2))):
            segments.append((dev, draw(st.integers(0, 12))))
    segs = None if not segments and draw(st.booleans()) else segments
    return blocks, events, segs


def reference_curve(blocks, events, segments, device):
    """(seq, t_ns, reserved, raised_by, basis) of `device` recomputed from the rows, or None."""
    mine = sorted((e for e in events if e["device"] == device), key=lambda e: e["seq"])
    deltas = [SEGMENT_DELTA.get(e["action"], 0) * e["size"] for e in mine]
    finals = [s for d, s in (segments or []) if d == device]
    if not finals and not any(deltas):
        return None
    running = [0]
    for d in deltas:
        running.append(running[-1] + d)
    # live bytes after each alloc / free of the device, and before the first one (blocks alive before)
    changes = []
    for b in blocks:
        if b["device"] != device:
            continue
        changes.append((b["alloc_seq"], b["size"]))
        if b["free_seq"] is not None:
            changes.append((b["free_seq"], -b["size"]))
    checks, live = [], 0
    for s, d in sorted(changes):
        live += d
        checks.append((s, live))

    def running_at(s):  # the net of the segment events at or before global position s
        return running[sum(1 for e in mine if e["seq"] <= s)]

    start = (sum(finals) - running[-1]) if finals else 0
    level = start
    while min(level + r for r in running) < 0 or any(level + running_at(s) < v for s, v in checks):
        level += 1
    stamps = [e["t_ns"] for e in events] + [b[k] for b in blocks for k in ("alloc_ns", "free_ns")
                                            if b[k] is not None]
    lo, hi = min(stamps), max(stamps)
    seq = [-1] + [e["seq"] for e in mine]
    t_ns = [lo] + [e["t_ns"] for e in mine]
    reserved = [level + r for r in running]
    if not mine:
        seq, t_ns, reserved = [-1, -1], [lo, hi], reserved * 2
    basis = (WALKED_BACK if any(deltas) else FINAL_ONLY) if finals else EVENTS_ONLY
    return seq, t_ns, reserved, level - start, basis


@SETTINGS
@given(recordings())
def test_curve_matches_the_brute_force_reference(rec):
    blocks, events, segments = rec
    trace = _trace(blocks, events, segments)
    for device in (DEV, OTHER):
        ref = reference_curve(blocks, events, segments, device)
        curve = reserved_curve(trace, device)
        if ref is None:
            assert curve is None
            continue
        seq, t_ns, reserved, raised_by, basis = ref
        assert curve.seq.tolist() == seq and curve.t_ns.tolist() == t_ns
        assert curve.reserved.tolist() == reserved
        assert (curve.initial, curve.final, curve.raised_by, curve.basis) == (reserved[0], reserved[-1],
                                                                               raised_by, basis)
        peak = max(reserved)
        assert (curve.peak, curve.peak_ns) == (peak, t_ns[reserved.index(peak)])
        # at(): the level of the last row at or before each position, the starting level before them all
        for q in range(-3, len(events) + 14):
            rows = [i for i, s in enumerate(seq) if s <= q]
            assert int(curve.at(q)) == reserved[rows[-1] if rows else 0], q
        queries = np.arange(-3, 15)
        assert curve.at(queries).tolist() == [int(curve.at(int(q))) for q in queries]
