"""The exact canonical search (`memlens.plan.exact.solve_exact`) on MiniMalloc's challenging instances.

Usage: .venv/bin/python benchmarks/plan_exact.py [--time-limit 60] [--only AB] [--no-compile]

1. JIT cost: one tiny search in a fresh process with an empty numba cache (compiles the kernel), then
   again in a second process reusing that cache (loads it), both timed from process start to result.
2. Per instance (A-E): the decision at capacity = max-live (the optimum where it equals max-live) and at
   MiniMalloc's own capacity of 1,048,576 bytes: status, seconds, search nodes, placements tried and the
   rate, with the seconds as a multiple of MiniMalloc's published C++ time (0.6-5.4 s per instance).
   Found plans are validated.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MEMLENS_SHARED_TRACES", ROOT.parent / "shared" / "traces"))
MINIMALLOC_CAPACITY = 1_048_576
MINIMALLOC_SECONDS = 5.4  # MiniMalloc's slowest challenging instance (C++), for scale

TINY = ("import time; t = time.perf_counter(); import pandas as pd; "
        "from memlens.plan import as_problem; from memlens.plan.exact import solve_exact; "
        "p = as_problem(pd.DataFrame({'id': ['a', 'b'], 'lower': [0, 1], 'upper': [2, 3], 'size': [1, 1]})); "
        "r = solve_exact(p, 2); print(r.status, time.perf_counter() - t)")


def jit_cost() -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("first call, empty cache (compiles)", "next process, cached"):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", TINY], env=env, capture_output=True, text=True,
                                 check=True, cwd=ROOT).stdout.split()
            wall = time.perf_counter() - t0
            print(f"  {label:38s} imports + first search {float(out[1]):6.2f} s   "
                  f"process {wall:6.2f} s  ({out[0]})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per decision (default 60)")
    ap.add_argument("--only", default="ABCDE", help="instance letters to run (default ABCDE)")
    ap.add_argument("--no-compile", action="store_true", help="skip the JIT cost measurement")
    args = ap.parse_args()
    from memlens.plan.exact import FOUND, solve_exact
    from memlens.plan.problem import problem_from_csv
    from memlens.plan.validate import validate_plan

    if not args.no_compile:
        print("JIT cost (numba, cache=True):")
        jit_cost()
    solve_exact(problem_from_csv(SHARED / "dsa" / "minimalloc_example_input12.csv"), 12)  # load the kernel
    print(f"\n{'instance':10s} {'buffers':>7s} {'capacity':>10s} {'cap/max-live':>12s} {'status':>10s} "
          f"{'seconds':>8s} {'x MiniMalloc':>12s} {'nodes':>9s} {'tries':>10s} {'tries/s':>9s}")
    for letter in args.only:
        path = SHARED / "dsa" / f"minimalloc_challenging_{letter}.csv"
        if not path.exists():
            print(f"{letter:10s} skipped: {path} is absent")
            continue
        p = problem_from_csv(path)
        live = p.max_live()
        for capacity in sorted({live, MINIMALLOC_CAPACITY}):
            r = solve_exact(p, capacity, time_limit_s=args.time_limit)
            if r.status == FOUND:
                validate_plan(p, r.offsets)
                assert int((r.offsets + p.size).max()) <= capacity
            rate = r.tries / max(r.seconds, 1e-9)
            print(f"{letter:10s} {p.n:7d} {capacity:10d} {capacity / live:12.4f} {r.status:>10s} "
                  f"{r.seconds:8.2f} {r.seconds / MINIMALLOC_SECONDS:12.2f} {r.nodes:9d} {r.tries:10d} "
                  f"{rate:9.0f}", flush=True)


if __name__ == "__main__":
    main()
