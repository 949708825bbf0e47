"""Quality of the static planner on every shared instance and real trace (and memlens's sample traces).

Usage: .venv/bin/python benchmarks/plan_quality.py [--time-limit 60] [--only minimalloc]

For each instance: buffers, max-live, the best single published heuristic (name, ratio to max-live), the
portfolio's result (ratio, share of the greedy gap closed, algorithm, proven optimal or not) and its
time (including loading the trace). Traces with several devices are planned on the largest one. MiniMalloc's challenging
instances have capacity 1,048,576 and (where known) optimum = max-live; MiniMalloc's C++ solves each in
0.6-5.4 s; the published heuristics land 17-41% above.
"""
from __future__ import annotations

import argparse
import glob
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MEMLENS_SHARED_TRACES", ROOT.parent / "shared" / "traces"))


def instances(only: str | None):
    paths = sorted(glob.glob(str(SHARED / "dsa" / "*.csv")))
    paths += sorted(glob.glob(str(SHARED / "snapshots" / "*.pickle")))
    paths += sorted(glob.glob(str(SHARED / "kineto" / "*.json.gz")))
    paths += sorted(glob.glob(str(ROOT / "sample_traces" / "*.memlens")))
    return [p for p in paths if not only or only in Path(p).name]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per instance (default 60)")
    ap.add_argument("--only", help="substring of the instance names to run")
    args = ap.parse_args()
    from memlens.errors import InputError
    from memlens.plan import plan

    print(f"{'instance':36s} {'buffers':>7s} {'max-live':>14s} {'best heuristic':>30s} {'ratio':>7s} "
          f"{'portfolio':>7s} {'gap closed':>10s} {'optimal':>7s} {'time s':>7s}  algorithm")
    for path in instances(args.only):
        t0 = time.perf_counter()
        try:
            r = plan(path, time_limit_s=args.time_limit)
        except InputError as exc:
            print(f"{Path(path).name[:36]:36s} skipped: {exc.message}", flush=True)
            continue
        dt = time.perf_counter() - t0
        name, h = r.best_heuristic
        gap = h - r.max_live
        closed = 1.0 if gap == 0 else (h - r.height) / gap
        print(f"{Path(path).name[:36]:36s} {len(r.offsets):7d} {r.max_live:14,d} {name:>30s} {h / r.max_live:7.4f} "
              f"{r.ratio:7.4f} {closed:10.0%} {str(r.optimal):>7s} {dt:7.2f}  {r.algorithm}", flush=True)


if __name__ == "__main__":
    main()
