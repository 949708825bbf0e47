"""Speed of the static planner's heuristic portfolio on large realistic instances.

Usage: .venv/bin/python benchmarks/plan_speed.py [--sizes 1000,62000] [--seed 0] [--time-limit 0]

Instances come from `training_instance`, a generator shaped like transformer training iterations:
parameters and optimizer state alive throughout, forward ops that allocate activations (some saved for
backward, some short temporaries), a backward pass in reverse layer order that frees the saved activations
and creates gradients that live until the optimizer step, then the step. Time is the event index.

Prints the one-off cost of loading the compiled kernels (numba; compiled once per machine and cached),
then, per size: buffers, conflicts, max-live, the portfolio's time with no search budget (heuristics
only, the number the 50 ms / 10 s targets refer to), the time per heuristic, and the ratio of the result
to max-live. Ratios against a baseline are printed for the same process: the plain greedy-by-size pass.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd


def training_instance(n_buffers: int, seed: int = 0, layers: int = 24) -> pd.DataFrame:
    """A MiniMalloc-format DataFrame (id, lower, upper, size) with at least `n_buffers` buffers (whole
    iterations, so up to one iteration more)."""
    rng = np.random.default_rng(seed)
    hidden = 1024
    rows: list[tuple[int, int, int]] = []  # (lower, upper, size); upper filled in later when -1
    t = 0
    n_params = layers * 6
    params = rng.choice([hidden * hidden * 2, hidden * 4 * hidden * 2, hidden * 2], size=n_params)
    # parameters and two Adam states: alive for the whole run
    fixed = [(0, -1, int(z)) for z in params] + [(0, -1, int(z) * 2) for z in params for _ in range(2)]
    rows += fixed
    per_iter = layers * (12 + 6) + n_params + 8  # rough count of buffers one iteration creates
    iterations = max(1, -(-(n_buffers - len(fixed)) // per_iter))
    for _ in range(iterations):
        saved: list[list[int]] = []
        for _layer in range(layers):
            keep = []
            for _op in range(12):
                t += 1
                size = int(rng.choice([1, 1, 2, 4]) * hidden * int(rng.integers(256, 2049)) * 2)
                if rng.random() < 0.5:  # saved for backward
                    rows.append((t, -1, size))
                    keep.append(len(rows) - 1)
                else:  # temporary: freed a few ops later
                    rows.append((t, t + int(rng.integers(1, 4)), size))
            saved.append(keep)
        grads = []
        for layer in reversed(range(layers)):
            for _op in range(6):
                t += 1
                size = int(rng.choice([1, 2, 4]) * hidden * int(rng.integers(256, 2049)) * 2)
                rows.append((t, t + int(rng.integers(1, 6)), size))
            for idx in saved[layer]:
                lo, _, z = rows[idx]
                rows[idx] = (lo, t + 1, z)
            for p in range(6):
                grads.append(len(rows))
                rows.append((t, -1, int(params[(layer * 6 + p) % n_params])))
        t += 2
        for _ in range(8):  # optimizer step workspace
            t += 1
            rows.append((t, t + 1, int(hidden * hidden * 4)))
        t += 2
        for idx in grads:
            lo, _, z = rows[idx]
            rows[idx] = (lo, t, z)
    end = t + 1
    arr = np.array([(lo, end if hi < 0 else hi, z) for lo, hi, z in rows], dtype=np.int64)
    return pd.DataFrame({"id": np.arange(len(arr)).astype(str), "lower": arr[:, 0], "upper": arr[:, 1],
                         "size": arr[:, 2]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,62000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=0.0, help="search budget after the heuristics (s)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    from memlens.plan import as_problem, plan
    from memlens.plan.heuristics import heuristic_names, order_by, place_in_order, run_heuristic

    # first use in a process: import numba and load (or, on a fresh machine, compile) the kernels
    from memlens.plan.portfolio import load_kernels
    load_kernels()
    print(f"first use (numba import + kernel load/compile): {(time.perf_counter() - t0) * 1e3:.0f} ms; "
          f"the times below are warm")

    for n in (int(s) for s in args.sizes.split(",")):
        df = training_instance(n, seed=args.seed, layers=24 if n > 5000 else 4)
        problem = as_problem(df)
        t0 = time.perf_counter()
        indptr, _ = problem.conflicts()
        t_conf = time.perf_counter() - t0
        t0 = time.perf_counter()
        place_in_order(problem, order_by(problem, "size"), "best")
        t_base = time.perf_counter() - t0
        per = {}
        for name in heuristic_names(problem):
            t0 = time.perf_counter()
            run_heuristic(problem, name)
            per[name] = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = plan(as_problem(df), time_limit_s=args.time_limit)
        t_port = time.perf_counter() - t0
        print(f"{problem.n:>7,} buffers  {int(indptr[-1]) // 2:>12,} conflicts  max-live {result.max_live:,} B")
        print(f"  portfolio: {t_port * 1e3:9.1f} ms  ({t_port / t_base:.1f}x one greedy-by-size pass of "
              f"{t_base * 1e3:.1f} ms; conflict graph {t_conf * 1e3:.1f} ms)  ratio {result.ratio:.4f}  "
              f"via {result.algorithm}{' (optimal)' if result.optimal else ''}; heuristics run: "
              f"{', '.join(f'{k} {v / result.max_live:.4f}' for k, v in result.heuristics.items())}")
        for name, sec in per.items():
            used = "" if name in result.heuristics else "  (skipped by the portfolio's budget)"
            print(f"    {name:28s} {sec * 1e3:9.1f} ms alone{used}")


if __name__ == "__main__":
    main()
