"""Speed of swap planning (`memlens.swap.plan_swaps`, all priorities, minimising the peak) on synthetic
training-like traces with accesses.

Usage: .venv/bin/python benchmarks/swap_speed.py [--sizes 5000,20000]

Every candidate the optimisers try is judged on the whole load curve, so selection costs about
(candidates tried) x (trace events). Baseline, run in the same process: the per-try cost of building the
curve by sorting every event (what each try did before the compiled merge), times the number of tries.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analysis_scale import synthetic_trace  # noqa: E402


def sorted_curve_seconds(curve, size, sched, repeats: int = 20) -> float:
    """Seconds per curve built the old way: concatenate every event and lexsort them."""
    t0 = time.perf_counter()
    for _ in range(repeats):
        eff = sched.saving
        z = size[eff]
        t = np.concatenate([sched.in_start[eff], curve.t, sched.out_end[eff]])
        d = np.concatenate([z, curve.delta, -z])
        cls = np.concatenate([np.zeros(len(z), np.int8), np.ones(len(curve.t), np.int8),
                              np.full(len(z), 2, np.int8)])
        rank = np.concatenate([np.zeros(len(z), np.int64), np.arange(len(curve.t)), np.zeros(len(z), np.int64)])
        order = np.lexsort((rank, cls, t))
        live = np.cumsum(d[order])
        float((np.diff(t[order], append=t[order][-1]) * np.maximum(live, 0)).sum())
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="5000,20000", help="blocks per trace (10 iterations each)")
    args = ap.parse_args()
    from memlens.swap import plan_swaps
    from memlens.swap import optimise
    from memlens.swap.schedule import LoadCurve

    plan_swaps(synthetic_trace(iterations=2, per_iteration=50, accesses_per_block=3))  # load the kernels
    for n in (int(s) for s in args.sizes.split(",")):
        trace = synthetic_trace(iterations=10, per_iteration=n // 10, accesses_per_block=5)
        tries = [0]
        original = optimise._Evaluator.__call__

        def counting(self, chosen, max_stall=None, _orig=original):
            tries[0] += 1
            return _orig(self, chosen, max_stall)

        optimise._Evaluator.__call__ = counting
        try:
            t0 = time.perf_counter()
            result = plan_swaps(trace)
            took = time.perf_counter() - t0
        finally:
            optimise._Evaluator.__call__ = original
        curve = LoadCurve(trace, result.device)
        from memlens.swap.schedule import serial_schedule
        sw = result.swaps
        sched = serial_schedule(sw["idle_from_ns"].to_numpy(np.int64), sw["idle_to_ns"].to_numpy(np.int64),
                                (sw["out_end_ns"] - sw["out_start_ns"]).to_numpy(np.int64),
                                (sw["in_end_ns"] - sw["in_start_ns"]).to_numpy(np.int64))
        per_sort = sorted_curve_seconds(curve, sw["size"].to_numpy(np.int64), sched)
        baseline = per_sort * tries[0]
        print(f"{len(trace.blocks):>7,} blocks {len(curve.t):>8,} events  {tries[0]:>7,} tries  plan_swaps "
              f"{took:7.2f} s  (curves by full sort alone would take {baseline:7.2f} s: "
              f"{baseline / took:.1f}x)  peak {result.peak_before:,} -> {result.peak_after:,} B")


if __name__ == "__main__":
    main()
