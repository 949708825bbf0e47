"""The Python recorder leaves its own time out of the trace's clock (memlens/recording/own_clock.py): the union
of its logged intervals against a brute-force count, the move of a session's and its allocator's times worked
by hand, and real recordings whose op records, free callbacks and module hooks are made slow on purpose."""
from __future__ import annotations

import time
from array import array
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import memlens
from memlens.recording.attribution import Attribution
from memlens.recording.buffers import EventBuffers
from memlens.recording.instruments import AllocatorData
from memlens.recording.own_clock import OwnTime, session_onto_own_clock
from memlens.recording.session import Session


def _spin(ns: int) -> None:
    t0 = time.perf_counter_ns()
    while time.perf_counter_ns() - t0 < ns:
        pass


def test_own_time_of_overlapping_nested_and_empty_intervals_by_hand():
    own = OwnTime(np.array([15, 10, 40, 50, 12]), np.array([30, 20, 45, 50, 14]))   # [50, 50) is empty
    assert own.starts.tolist() == [10, 40] and own.lengths.tolist() == [20, 5] and own.total_ns == 25
    t = np.array([5, 10, 12, 30, 35, 42, 45, 100])
    assert own.own_until(t).tolist() == [0, 0, 2, 20, 20, 22, 25, 25]
    assert own.onto(t).tolist() == [5, 10, 10, 10, 15, 20, 20, 75]


def test_an_empty_log_changes_nothing():
    own = OwnTime.of_log(array("q"))
    assert own.total_ns == 0
    assert own.onto(np.array([3, 1, 2])).tolist() == [3, 1, 2]


def test_own_time_against_a_brute_force_count():
    """Integer intervals in [0, 60): the own time up to t is the number of unit steps [x, x + 1) with x < t
    that some interval covers."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    pair = st.tuples(st.integers(0, 60), st.integers(0, 60))

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(st.lists(pair, max_size=12), st.lists(st.integers(-5, 70), min_size=1, max_size=20))
    def check(pairs, times):
        starts = np.array([a for a, _ in pairs], dtype=np.int64)
        ends = np.array([b for _, b in pairs], dtype=np.int64)
        covered = set()
        for a, b in pairs:
            covered.update(range(a, b))
        expect = [sum(1 for x in covered if x < t) for t in times]
        own = OwnTime(starts, ends)
        assert own.own_until(np.array(times)).tolist() == expect
        assert own.total_ns == len(covered)
        moved = own.onto(np.array(sorted(times)))
        assert (np.diff(moved) >= 0).all()          # the order of times is kept
    check()


def _session_by_hand(ops, blocks, frees, log, t_start=0, t_stop=1000):
    buf = EventBuffers(1 << 20)
    for stream, rows in ((buf.ops, ops), (buf.blocks, blocks), (buf.frees, frees), (buf.own, log)):
        for row in rows:
            stream.data.extend(row)
    return SimpleNamespace(buf=buf, own_extend=buf.own.data.extend, t_start=t_start, t_stop=t_stop)


def test_a_session_and_its_allocator_events_moved_by_hand():
    """Own time [100, 130) and [200, 210): a raw time t moves back by the own time before it."""
    session = _session_by_hand(
        ops=[(0, 0, 50, 100, 0, 1), (0, 0, 130, 200, 0, 2), (0, 0, 210, 260, 0, 3)],
        blocks=[(0, 0, 1, 8, -1, 0, 1), (1, 0, 2, 8, 115, 0, 0), (2, 0, 3, 8, 205, 1, 0)],
        frees=[(1, 205), (2, 300)],
        log=[(100, 130), (200, 210)], t_stop=400)
    wall0, perf0 = 10_000_000, 3_000        # unix ns = raw ns - 3 us + 10 ms
    unix = wall0 - perf0
    events = pd.DataFrame({"t_unix_ns": np.array([115, 140, 300], np.int64) + unix,
                           "device": ["cpu"] * 3, "addr": [2, 3, 3], "delta": [8, 8, -8]})
    late = {"action": "alloc", "time_us": (unix + 205_000) // 1000}
    odd = [{"action": "alloc"}, {"action": "alloc", "time_us": "?"}, {"action": "alloc", "time_us": 0}]
    snapshot = {"device_traces": [[late, *odd]]}
    allocator = AllocatorData(events=events, snapshot=snapshot)
    session_onto_own_clock(session, allocator, (wall0, perf0))
    ops = session.buf.ops.to_numpy()
    assert ops[:, 2].tolist() == [50, 100, 170] and ops[:, 3].tolist() == [100, 170, 220]
    assert session.buf.blocks.to_numpy()[:, 4].tolist() == [-1, 100, 170]   # -1: alive before, kept
    assert session.buf.frees.to_numpy()[:, 1].tolist() == [170, 260]
    assert session.t_stop == 360 and session.own_ns == 40
    assert (allocator.events["t_unix_ns"] - unix).tolist() == [100, 110, 260]
    assert events["t_unix_ns"].tolist() == [unix + 115, unix + 140, unix + 300]   # the caller's table untouched
    # the snapshot's µs clock: 205 µs raw comes after all 40 ns of own time; entries without a time stay
    assert late["time_us"] == (unix + 205_000 - 40) // 1000
    assert odd == [{"action": "alloc"}, {"action": "alloc", "time_us": "?"}, {"action": "alloc", "time_us": 0}]
    assert len(session.buf.own) == 0       # consumed: a second move changes nothing
    session_onto_own_clock(session, allocator, (wall0, perf0))
    assert session.buf.ops.to_numpy()[:, 2].tolist() == [50, 100, 170]


def test_kernel_times_keep_the_raw_host_clock():
    """With CUDA kernel times the trace moves onto the measured kernel clock, whose correlation reads raw
    launch times: nothing is moved."""
    session = _session_by_hand(ops=[(0, 0, 130, 200, 0, 0)], blocks=[], frees=[], log=[(100, 130)])
    kernels = pd.DataFrame({"launch_unix_ns": [150], "start_unix_ns": [160], "end_unix_ns": [170]})
    session_onto_own_clock(session, AllocatorData(kernels=kernels), (0, 0))
    assert session.buf.ops.to_numpy()[:, 2].tolist() == [130]


def _median_gap(trace) -> float:
    ops = trace.ops.sort_values("op_id")
    gaps = ops["start_ns"].to_numpy()[1:] - ops["end_ns"].to_numpy()[:-1]
    assert (gaps >= 0).all()
    return float(np.median(gaps))


@pytest.mark.parametrize("allocator", ["none", "auto"])
def test_slow_op_records_are_not_on_the_clock(monkeypatch, allocator):
    """Each op record made 300 us slower: without the correction every gap between ops holds it; with it
    the gaps are the program's (a few us; tens of us when a loaded machine preempts). Margin 3x. With the
    profiler's allocation events their times move too: every block the ops made is still matched to its
    allocation, inside the op that made it."""
    x = torch.randn(16)
    for _ in range(2):     # the first recording of a process sees one allocation more (the profiler's start)
        with memlens.record(backend="python", allocator=allocator) as plain:
            for _ in range(20):
                x = x * 1.0001 + 0.5
    on_op = Session.on_op

    def slow(self, *args):
        _spin(300_000)
        return on_op(self, *args)
    monkeypatch.setattr(Session, "on_op", slow)
    with memlens.record(backend="python", allocator=allocator) as rec:
        for _ in range(20):
            x = x * 1.0001 + 0.5
    trace = rec.trace
    assert len(trace.ops) == 40
    assert _median_gap(trace) < 100_000
    md = trace.metadata
    assert md["recorder_own_ns"] >= 40 * 300_000
    assert md["recording_ns"] < md["recorder_own_ns"]
    if allocator == "auto":
        assert md["join"] == plain.trace.metadata["join"]
        made = trace.blocks.dropna(subset=["alloc_op_id", "alloc_ns"]).merge(
            trace.ops, left_on="alloc_op_id", right_on="op_id")
        assert len(made) >= 40
        assert ((made["alloc_ns"] >= made["start_ns"]) & (made["alloc_ns"] <= made["end_ns"])).all()


def test_slow_free_callbacks_are_not_on_the_clock(monkeypatch):
    """Each free, logged by a weak-reference callback, made 2 ms slower; every gap between the ops below
    holds one (the tensor dropped there): the gaps stay the program's."""
    init = Session.__init__

    def init_with_slow_frees(self, **kwargs):
        init(self, **kwargs)
        log_free = self._frees_extend

        def slow(record):              # inside the callback, after its first stamp
            _spin(2_000_000)
            log_free(record)
        self._frees_extend = slow
    monkeypatch.setattr(Session, "__init__", init_with_slow_frees)
    x = torch.randn(16)
    with memlens.record(backend="python", allocator="none") as rec:
        z = x + 1
        for _ in range(10):
            y = x * 2
            del y                     # freed between the mul and the add
            z = x + 1                 # the previous z freed before the next mul
    assert z.shape == (16,)
    assert len(rec.trace.ops) == 21
    assert rec.trace.metadata["recorder_own_ns"] >= 20 * 2_000_000
    assert _median_gap(rec.trace) < 700_000


def test_slow_module_hooks_are_not_on_the_clock(monkeypatch):
    """Each module entry made 2 ms slower: the ops of consecutive layers keep the program's gaps."""
    enter = Attribution.enter_module

    def slow_enter(self, module, args):
        _spin(2_000_000)
        return enter(self, module, args)
    monkeypatch.setattr(Attribution, "enter_module", slow_enter)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(6)])
    x = torch.randn(4, 8)
    with memlens.record(model, backend="python", allocator="none") as rec:
        for _ in range(3):
            model(x)                  # 7 module entries each
    assert rec.trace.metadata["recorder_own_ns"] >= 3 * 7 * 2_000_000
    assert _median_gap(rec.trace) < 700_000     # a slow hook would put 2 ms into most gaps
