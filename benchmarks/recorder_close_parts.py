"""Where a one-step recording's close goes: the exit of `memlens.record` (compiled recorder) split into its parts.

`recorder_overhead.py` times the whole block and the close (exit until `rec.trace` is usable); this splits the
close of the same GPT and CNN training steps into its stages, each timed around its own call (wall ns, the
median over `--rounds` recordings after `--warmup` ones, each right after its step, so caches are as cold as a
user's close finds them):

    stop + drain     hooks removed, the C++ records decoded into int64 streams (compiled_drain)
    build            ops, accesses and blocks tables from the streams (recording/build.py, the drain stage)
    join             autograd seeds, the allocator join (recording/joining.py)
      of which join  `join_allocator` (recording/join.py)
    finish           notes, metadata, optional tables (recording/assemble.py)
    frames           the three DataFrames and the event order (`trace_of_columns`)
    close            the whole exit, timed around `Recorder.__exit__`

Also printed: the same parts warm (the same recording's state assembled again and again, minimum of 5 x 50),
which is what the code costs without the step's cache pollution, and the floor of the frames: the three
tables' `to_frame` alone. The parts are timed by wrapping the stage functions (a ~1 us wrapper per call).

Two floors are timed right after a step too (`floor_after_step`), against an earlier budget of 5 us per recorded
op at one step: the three tables made DataFrames alone, and the close of a recording in which no op ran. No
faster build, join or drain can go below the first while the Trace holds pandas DataFrames made at exit.

    .venv/bin/python benchmarks/recorder_close_parts.py [--workload gpt|cnn|both|mlp|lstm|resnet|vit]
        [--rounds 30] [--warmup 10]
"""
from __future__ import annotations

import argparse
import statistics
import time
import timeit

import torch

import memlens
from memlens.recording import assemble, build, compiled, join, joining, pipeline, recorder
from memlens.recording.columns import FRAME_DTYPES

from heldout_steps import HELDOUT
from recorder_overhead import workload

PARTS = [("stop + drain", compiled.CompiledSession, "stop"), ("build ops", build, "build_ops"),
         ("build accesses", build, "build_accesses"), ("build blocks", build, "build_blocks"),
         ("join", pipeline, "join_tables"), ("  of which join", joining, "join_allocator"),
         ("finish", assemble, "finish_tables"), ("frames", assemble, "trace_of_columns")]


class _Timer:
    """Wraps each part's function for the rounds, recording ns per call; restores them after."""

    def __init__(self):
        self.ns = {label: [] for label, _, _ in PARTS}
        self.saved = []

    def __enter__(self):
        for label, owner, name in PARTS:
            fn = getattr(owner, name)
            self.saved.append((owner, name, fn))
            setattr(owner, name, self._wrap(label, fn))
        return self

    def _wrap(self, label, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns[label].append(time.perf_counter_ns() - t0)
        return timed

    def __exit__(self, *exc):
        for owner, name, fn in reversed(self.saved):
            setattr(owner, name, fn)


def cold_parts(model, step, rounds: int, warmup: int) -> tuple[dict, list, int]:
    """({part: [ns per close]}, [ns of each whole close], ops of a recording) over `rounds` one-step recordings."""
    closes = []
    for _ in range(warmup):
        with memlens.record(model, backend="compiled"):
            step()
    with _Timer() as timer:
        for _ in range(rounds):
            rec = memlens.record(model, backend="compiled")
            rec.__enter__()
            step()
            t0 = time.perf_counter_ns()
            rec.__exit__(None, None, None)
            closes.append(time.perf_counter_ns() - t0)
    return timer.ns, closes, len(rec.trace.ops)


def warm_parts(model, step) -> tuple[dict, tuple]:
    """({part: us} of one recording's state assembled again (minimum of 5 x 50): the code without cold caches;
    that recording's three finished tables, ((name, `Columns`), ...), as the frames receive them)."""
    captured = {}
    original_build = recorder.Recorder._build

    def keep(self, session, allocator_data, exception):
        captured["args"] = (self, session, allocator_data, exception)
        return original_build(self, session, allocator_data, exception)
    recorder.Recorder._build = keep
    try:
        with memlens.record(model, backend="compiled"):
            step()
    finally:
        recorder.Recorder._build = original_build
    rec, session, allocator_data, _ = captured["args"]
    allocator_data = build.with_session_events(session, allocator_data, rec._clock)
    settings = rec._settings()

    def us(fn):
        return min(timeit.repeat(fn, number=50, repeat=5)) / 50 * 1e6
    ops, module_idx, source = build.build_ops(session)
    accesses = build.build_accesses(session, ops)
    blocks = build.build_blocks(session, ops, module_idx)
    joined, notes, stats = joining.join_tables(session, allocator_data, blocks, accesses, ops, rec._clock)
    finished = assemble.finish_tables(session, allocator_data, joined, ops, source, list(notes), stats,
                                      settings=settings, clock=rec._clock)
    tables = (("blocks", joined), ("accesses", accesses), ("ops", finished[0]))
    seeded = joining.refine_autograd_seeds(blocks, accesses, ops)
    return {
        "build ops": us(lambda: build.build_ops(session)),
        "build accesses": us(lambda: build.build_accesses(session, ops)),
        "build blocks": us(lambda: build.build_blocks(session, ops, module_idx)),
        "join": us(lambda: joining.join_tables(session, allocator_data, blocks, accesses, ops, rec._clock)),
        "  of which join": us(lambda: join.join_allocator(seeded, accesses, ops, allocator_data,
                                                          session.unix_to_trace_ns(rec._clock), [],
                                                          window_ns=session.t_stop - session.t_start)),
        "finish": us(lambda: assemble.finish_tables(session, allocator_data, joined, ops, source, list(notes), stats,
                                                    settings=settings, clock=rec._clock)),
        "frames": us(lambda: assemble.trace_of_columns(joined, accesses, finished[0], finished[1], finished[2])),
        "  to_frame x3 (floor)": us(lambda: [t.to_frame(FRAME_DTYPES[k]) for k, t in tables]),
        "build_trace (all but drain)": us(lambda: pipeline.build_trace(session, allocator_data, settings=settings,
                                                                       clock=rec._clock)),
    }, tables


def floor_after_step(model, step, tables: tuple, rounds: int) -> dict:
    """{what: us} of two closes no faster code could beat, each timed right after a plain step (median over
    `rounds`): a one-step recording's finished `tables` (from `warm_parts`) made DataFrames (`to_frame` x3, what
    the Trace contract costs however the tables were computed), and the whole close of a recording in which no
    op ran (hooks off, an empty drain, the model's parameters marked, empty tables made frames)."""
    frames, empty = [], []
    for _ in range(rounds):
        step()
        t0 = time.perf_counter_ns()
        for name, table in tables:
            table.to_frame(FRAME_DTYPES[name])
        frames.append(time.perf_counter_ns() - t0)
        step()
        rec = memlens.record(model, backend="compiled")
        rec.__enter__()
        t0 = time.perf_counter_ns()
        rec.__exit__(None, None, None)
        empty.append(time.perf_counter_ns() - t0)
    return {"to_frame x3 after a step": statistics.median(frames) / 1e3,
            "close of a recording with no op": statistics.median(empty) / 1e3}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["gpt", "cnn", "both", *HELDOUT], default="both",
                        help="the two tuned steps (both) or a held-out one (heldout_steps.py)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import os
    print(f"torch {torch.__version__}, 1 thread, load average {os.getloadavg()[0]:.2f}; wall us, medians")
    for name in (["gpt", "cnn"] if args.workload == "both" else [args.workload]):
        model, step, _ = workload(name)
        step()
        parts, closes, n_ops = cold_parts(model, step, args.rounds, args.warmup)
        warm, tables = warm_parts(model, step)
        close_us = statistics.median(closes) / 1e3
        print(f"\n{name}: one step, {n_ops} ops; close {close_us:.0f} us = {close_us / n_ops:.1f} us per op")
        print(f"  {'part':28s} {'after the step':>15s} {'warm':>10s}")
        for label, _, _ in PARTS:
            cold = statistics.median(parts[label]) / 1e3 if parts[label] else float("nan")
            hot = f"{warm[label]:7.0f} us" if label in warm else f"{'-':>7s}   "
            print(f"  {label:28s} {cold:12.0f} us {hot}")
        for label in ("  to_frame x3 (floor)", "build_trace (all but drain)"):
            print(f"  {label:28s} {'':>15s} {warm[label]:7.0f} us")
        floor = floor_after_step(model, step, tables, args.rounds)
        print(f"  floors right after a step, against a budget of 5 us per op = {5 * n_ops} us:")
        for label, value in floor.items():
            print(f"    {label:34s} {value:7.0f} us = {value / n_ops:5.1f} us per op")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
