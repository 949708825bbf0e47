"""Speed of the caching-allocator simulator on a synthetic training-like trace (goal: at least
1,000,000 events per 10 s on this machine).

The trace repeats one step template of ``--blocks-per-iteration`` allocations (sizes 512 B .. 256 MiB,
log-uniform, with a few large activations that live until the step ends) for ``--iterations`` steps:
two events (alloc and free) per block, 1,000,000 events by default, all on one stream. It is replayed
through the caching allocator (default settings, then ``expandable_segments:True``) and, in the same
process, through the bump arena — the cheapest model: the replay loop and bookkeeping with no placement
policy — whose time is the baseline the ratios refer to, so the figures compare across machines.

    .venv/bin/python benchmarks/simulate_speed.py [--iterations 100] [--blocks-per-iteration 5000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from memlens.simulate import simulate
from memlens.trace import Trace

STEP_NS = 10_000_000
GOAL_EVENTS_PER_S = 100_000  # 1,000,000 events per 10 s


def synthetic_trace(iterations: int, per_iteration: int, seed: int = 0) -> Trace:
    """A repeating training-like trace of alloc/free pairs (bytes, ns), built vectorised."""
    rng = np.random.default_rng(seed)
    offsets = np.sort(rng.integers(0, STEP_NS // 2, per_iteration))
    sizes = np.exp(rng.uniform(np.log(512), np.log(256 << 20), per_iteration)).astype(np.int64)
    life = np.exp(rng.uniform(np.log(1e3), np.log(2e6), per_iteration)).astype(np.int64)
    long_lived = rng.random(per_iteration) < 0.05
    life = np.where(long_lived, STEP_NS - offsets - 1, np.minimum(life, STEP_NS - offsets - 1))
    n = iterations * per_iteration
    start = np.repeat(np.arange(iterations, dtype=np.int64) * STEP_NS, per_iteration)
    alloc = start + np.tile(offsets, iterations) + rng.integers(0, 1000, n)
    blocks = pd.DataFrame({"block_id": np.arange(n, dtype=np.int64), "device": "cuda:0",
                           "size": np.tile(sizes, iterations), "alloc_ns": alloc,
                           "free_ns": alloc + np.tile(life, iterations), "stream": 0})
    return Trace.from_tables(blocks)


def timed(trace: Trace, **kwargs) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = simulate(trace, **kwargs)
    return time.perf_counter() - t0, result.devices["cuda:0"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--blocks-per-iteration", type=int, default=5000)
    args = parser.parse_args()

    t0 = time.perf_counter()
    trace = synthetic_trace(args.iterations, args.blocks_per_iteration)
    events = 2 * len(trace.blocks)
    print(f"trace: {len(trace.blocks):,} blocks, {events:,} events (built in {time.perf_counter() - t0:.2f} s)")

    base_s, base = timed(trace, allocator="bump")
    print(f"baseline bump arena:        {base_s:6.2f} s  {events / base_s:>12,.0f} events/s")
    ok = True
    for label, conf in (("caching (defaults)", None), ("caching (expandable)", "expandable_segments:True")):
        secs, dev = timed(trace, allocator="caching", conf=conf)
        rate = events / secs
        ok &= rate >= GOAL_EVENTS_PER_S
        print(f"{label + ':':<27} {secs:6.2f} s  {rate:>12,.0f} events/s  {secs / base_s:5.2f}x baseline  "
              f"peak reserved {dev.peak_reserved / 2**30:.2f} GiB, {len(dev.segment_allocs):,} reservations")
    print(f"goal >= {GOAL_EVENTS_PER_S:,} events/s (1M per 10 s): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
