"""Scale benchmark of the analyses: ATI + outliers + iteration split on a synthetic training trace.

The trace: ``--iterations`` steps (default 100) of ``--blocks-per-iteration`` allocations (default 10,000:
1,000,000 blocks), each block accessed ``--accesses-per-block`` times (default 10: 10,000,000 accesses).
Every step repeats one template of (op, size) with jittered times, as a training loop does; every access has
its op (1-20 us long; no iteration marks, the steps are detected), since an ATI runs from the end of one op to the start of the next.
Goal:
under 5 s on a 2-core machine and under 4 GB of memory for the three analyses.

Also times a naive per-block Python loop for ATI on a slice of the blocks, extrapolated to all of them, and
prints the ratio, so the figure is comparable across machines.

    .venv/bin/python benchmarks/analysis_scale.py [--iterations 100] [--blocks-per-iteration 10000]
"""
from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np
import pandas as pd

from memlens.analysis.ati import access_intervals, ati_stats
from memlens.analysis.bandwidth import BandwidthModel
from memlens.analysis.iterations import split_iterations
from memlens.analysis.outliers import filter_summary, bandwidth_filter, outliers
from memlens.trace import Trace

STEP_NS = 10_000_000  # 10 ms per training step
OPS = np.array([f"aten::op{i}" for i in range(50)], dtype=object)


def synthetic_trace(iterations: int, per_iteration: int, accesses_per_block: int, seed: int = 0) -> Trace:
    """A repeating training-like trace, built vectorised."""
    rng = np.random.default_rng(seed)
    # one step's template: allocation offsets, sizes (256 B .. 64 MiB, log-uniform), ops, lifetimes
    offsets = np.sort(rng.integers(0, STEP_NS // 2, per_iteration))
    sizes = np.exp(rng.uniform(np.log(256), np.log(64 << 20), per_iteration)).astype(np.int64)
    ops = OPS[rng.integers(0, len(OPS), per_iteration)]
    life = np.exp(rng.uniform(np.log(1e3), np.log(5e6), per_iteration)).astype(np.int64)
    long_lived = rng.random(per_iteration) < 0.05  # activations kept for backward: until the step ends
    life = np.where(long_lived, STEP_NS - offsets - 1, np.minimum(life, STEP_NS - offsets - 1))

    n = iterations * per_iteration
    step_start = np.repeat(np.arange(iterations, dtype=np.int64) * STEP_NS, per_iteration)
    jitter = rng.integers(0, 1000, n)
    alloc = step_start + np.tile(offsets, iterations) + jitter
    lifetime = np.tile(life, iterations)
    free = alloc + lifetime
    blocks = pd.DataFrame({
        "block_id": np.arange(n, dtype=np.int64), "device": "cuda:0", "size": np.tile(sizes, iterations),
        "alloc_ns": alloc, "free_ns": free, "op": np.tile(ops, iterations),
        "category": np.where(np.tile(long_lived, iterations), "activation", "temporary"),
    })
    owner = np.repeat(np.arange(n, dtype=np.int64), accesses_per_block)
    t = alloc[owner] + (rng.random(len(owner)) * lifetime[owner]).astype(np.int64)
    by_time = np.argsort(t, kind="stable")  # recorders write accesses in time order
    owner, t = owner[by_time], t[by_time]
    accesses = pd.DataFrame({"block_id": owner, "t_ns": t, "op_id": np.arange(len(owner), dtype=np.int64),
                             "is_write": rng.random(len(owner)) < 0.3})
    # one op per access, 1-20 us long: an ATI runs from the end of one op to the start of the next
    ops = pd.DataFrame({"op_id": np.arange(len(owner), dtype=np.int64), "name": "aten::op", "start_ns": t,
                        "end_ns": t + rng.integers(1_000, 20_000, len(owner))})  # no marks: steps are detected
    return Trace.from_tables(blocks, accesses, ops, metadata={"source_kind": "synthetic"})


def naive_ati_seconds_per_block(trace: Trace, sample_blocks: int) -> float:
    """Seconds per block of a straightforward per-block Python loop computing the same intervals."""
    blocks = trace.blocks.iloc[:sample_blocks]
    acc = trace.accesses[trace.accesses["block_id"] < sample_blocks]
    op_end = trace.ops.set_index("op_id")["end_ns"]
    acc = acc.assign(op_end=acc["op_id"].map(op_end).to_numpy())
    by_block = {b: g for b, g in acc.groupby("block_id")[["t_ns", "op_end"]]}
    t0 = time.perf_counter()
    lengths = []  # the same intervals as access_intervals, one block at a time
    for row in blocks.itertuples():
        g = by_block.get(row.block_id)
        events = sorted(zip(g["t_ns"], g["op_end"])) if g is not None else []
        starts = [row.alloc_ns, *(end for _, end in events)]
        ends = [*(t for t, _ in events), row.free_ns]
        lengths.extend(max(b - a, 0) for a, b in zip(starts, ends))
    return (time.perf_counter() - t0) / len(blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--blocks-per-iteration", type=int, default=10_000)
    parser.add_argument("--accesses-per-block", type=int, default=10)
    parser.add_argument("--bandwidth", default="pcie4")
    args = parser.parse_args()

    t0 = time.perf_counter()
    trace = synthetic_trace(args.iterations, args.blocks_per_iteration, args.accesses_per_block)
    build_s = time.perf_counter() - t0
    rss_after_build = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    print(f"trace: {len(trace.blocks):,} blocks, {len(trace.accesses):,} accesses "
          f"(built in {build_s:.1f} s, process peak RSS {rss_after_build:.2f} GiB)")

    bw = BandwidthModel.parse(args.bandwidth)
    timings = {}  # name -> (wall s, CPU s of this process)

    def timed(name, fn):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        timings[name] = (time.perf_counter() - wall, time.process_time() - cpu)
        return result

    iv, stats = timed("ati (intervals + stats)", lambda: (lambda i: (i, ati_stats(i)))(access_intervals(trace)))
    filtered = timed("bandwidth filter", lambda: bandwidth_filter(iv, bw))
    summary = filter_summary(filtered)
    ranked = timed("outliers (top 20)", lambda: outliers(trace, bw, top=20, intervals=filtered))
    its = timed("iteration split (detected)", lambda: split_iterations(trace))
    steady = timed("steady-state ATI (last step)", lambda: access_intervals(
        trace, steady_state=True, iteration=int(its["iteration"].iloc[-1]), iterations=its))
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2

    load = os.getloadavg()[0]
    print(f"{'step':<30} {'wall s':>8} {'cpu s':>8}   (1-min load average {load:.1f} on {os.cpu_count()} cores: "
          "wall times inflate when the machine is shared; CPU time is this process's own work)")
    for name, (wall, cpu) in timings.items():
        print(f"  {name:<28} {wall:8.2f} {cpu:8.2f}")
    wall_total = sum(w for w, _ in timings.values())
    cpu_total = sum(c for _, c in timings.values())
    print(f"  {'total':<28} {wall_total:8.2f} {cpu_total:8.2f}   (goal < 5 s on 2 cores)")
    print(f"process peak RSS: {peak_rss:.2f} GiB (includes the trace itself; goal < 4 GiB)")
    print(f"results: {stats['count']:,} intervals, p50 {stats['p50_ns']:.0f} ns, p90 {stats['p90_ns']:.0f} ns; "
          f"{summary['filtered_out_fraction']:.1%} filtered out at {bw.name}; top outlier block "
          f"{int(ranked['block_id'].iloc[0])}; {len(its)} iterations ({its['source'].iloc[0]}, "
          f"expected {args.iterations}); last step in steady state: {int(steady['wraps'].sum()):,} wrap-around ATIs")
    per_block = naive_ati_seconds_per_block(trace, min(20_000, len(trace.blocks)))
    naive_total = per_block * len(trace.blocks)
    print(f"naive per-block Python ATI loop: {per_block * 1e6:.1f} us/block -> {naive_total:.1f} s for all "
          f"blocks (extrapolated); vectorised ATI is {naive_total / timings['ati (intervals + stats)'][0]:.0f}x "
          "faster (wall, same process)")


if __name__ == "__main__":
    main()
