"""Cost of `stacks=True` (the Python stack of every op): the compiled recorder (stacks captured in C++,
native/op_stacks.h) against the Python recorder (sys._getframe per op), on recorder_overhead.py's GPT
and CNN training steps and on 2,000 small in-place adds 8 user frames deep (`ops`: the capture's
per-op cost), in one process:

    plain             no instrument
    python+stacks     memlens.record(backend="python", stacks=True)
    compiled+stacks   memlens.record(backend="compiled", stacks=True)
    compiled          memlens.record(backend="compiled")            (what the stacks add to it)
    profiler+stack    torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)

Modes are interleaved over `--reps` rounds in a rotated order; the medians of the per-step process CPU
times are compared (ratios to plain, and compiled+stacks over python+stacks). It also prints how many
distinct stacks each recorder found.

    .venv/bin/python benchmarks/recorder_stacks.py [--workload gpt|cnn|ops|all] [--reps 7] [--steps 3]

Measured (torch 2.13 CPU, 1 thread, a 2-core machine shared with other jobs, load 5.0-5.4; CPU-time ratios
to plain, medians of 7 rounds x 3 steps; two runs on 2026-11-26, "run 1 / run 2"):

    workload                   python+stacks  compiled+stacks  compiled      profiler+stack  compiled+st./python+st.
    GPT train (868 ops/step)   1.80 / 1.84x   1.10 / 1.09x     1.07 / 1.12x  1.18 / 1.14x    0.614 / 0.591
    CNN train (77 ops/step)    1.26 / 1.39x   1.08 / 1.08x     1.03 / 1.08x  1.06 / 1.10x    0.853 / 0.779
    2,000 small adds (run 2)   9.84x          2.22x            1.73x         2.27x           0.226

The compiled capture costs ~1.0-1.5 us CPU per op (small adds: 1.25 us; the Python recorder's ~6.6 us),
within the noise of the compiled recorder without stacks on the training steps.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import memlens

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recorder_overhead import WORKLOADS, _quantile, cnn_workload, transformer_workload  # noqa: E402

MODES = ["plain", "python+stacks", "compiled+stacks", "compiled", "profiler+stack"]


def _instrument(mode, model):
    if mode == "plain":
        return None
    if mode == "profiler+stack":
        return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                      record_shapes=True, with_stack=True)
    backend, _, stacks = mode.partition("+")
    return memlens.record(model, backend=backend, stacks=bool(stacks))


def measure(mode, model, step, steps):
    """([CPU s of each step], wall s to close the instrument, the trace or None)."""
    inst = _instrument(mode, model)
    if inst is not None:
        inst.__enter__()
    cpu = []
    for _ in range(steps):
        c0 = time.process_time()
        step()
        cpu.append(time.process_time() - c0)
    t1 = time.perf_counter()
    if inst is not None:
        inst.__exit__(None, None, None)
    close = time.perf_counter() - t1
    return cpu, close, getattr(inst, "trace", None)


def small_ops_workload(depth=8, n=2000):
    """`n` in-place adds on an 8-float tensor, called `depth` user frames deep: the per-op cost of the
    capture with little kernel time around it."""
    x = torch.ones(8)

    def leaf():
        for _ in range(n):
            x.add_(1)

    def nest(d):
        return leaf() if d == 0 else nest(d - 1)
    return None, lambda: nest(depth)


def _touched_stacks(trace) -> int:
    """How many distinct stacks the ops that touched memory have."""
    ops = trace.ops[trace.ops["op_id"].isin(trace.accesses["op_id"])]
    return int(ops["stack_id"].nunique())


def bench(name, model, step, reps, steps):
    for _ in range(2):
        step()
    memlens.record(model, backend="compiled").__enter__().__exit__(None, None, None)   # build/load once
    cpu = {m: [] for m in MODES}
    close = {m: [] for m in MODES}
    traces = {}
    for r in range(reps):
        for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
            t_cpu, t_close, trace = measure(mode, model, step, steps)
            cpu[mode].extend(t_cpu)
            close[mode].append(t_close)
            if trace is not None:
                traces[mode] = trace
    base = statistics.median(cpu["plain"])
    base_q1 = _quantile(cpu["plain"], 0.25)
    print(f"\n{name}: plain step {base * 1e3:.2f} ms CPU (medians of {reps} rounds x {steps} steps; "
          f"load average {os.getloadavg()[0]:.1f})")
    med = {m: statistics.median(cpu[m]) for m in MODES}
    for mode in MODES:
        q1 = _quantile(cpu[mode], 0.25) / base_q1
        print(f"  {mode:16s} {med[mode] * 1e3:9.2f} ms/step CPU  ratio {med[mode] / base:5.2f}x  (lower quartile "
              f"{q1:5.2f}x)   close/build {statistics.median(close[mode]) * 1e3:8.1f} ms")
    py, cc = traces["python+stacks"], traces["compiled+stacks"]
    n_ops = len(cc.ops) / steps
    print(f"  compiled+stacks / python+stacks: {med['compiled+stacks'] / med['python+stacks']:.3f}; "
          f"compiled+stacks / compiled: {med['compiled+stacks'] / med['compiled']:.3f}; "
          f"stacks add {1e6 * (med['compiled+stacks'] - med['compiled']) / n_ops:.2f} us CPU per op (compiled)")
    print(f"  distinct stacks of the ops with accesses: python {_touched_stacks(py)}, compiled {_touched_stacks(cc)} "
          f"(all ops: {py.stacks['stack_id'].nunique()} / {cc.stacks['stack_id'].nunique()}: the Python recorder also "
          f"logs profiler::_record_function_* ops); "
          f"{n_ops:.0f} ops/step; compiled recorder's stack table "
          f"{cc.metadata.get('recorder_buffers', {}).get('stacks', 0) / 1024:.1f} KiB")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["gpt", "cnn", "ops", "all"], default="all")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 intra-op thread, load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    for name in (["gpt", "cnn", "ops"] if args.workload == "all" else [args.workload]):
        if name == "ops":
            model, step = small_ops_workload()
            bench("2,000 x.add_(1) at 8 extra user frames", model, step, args.reps, args.steps)
            continue
        cfg = WORKLOADS[name]
        model, step = transformer_workload(cfg) if name == "gpt" else cnn_workload(cfg)
        bench(f"{name} training step {cfg}", model, step, args.reps, args.steps)


if __name__ == "__main__":
    main()
