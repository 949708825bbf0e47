"""Scale benchmark of the HTML report: build it for a synthetic 1,000,000-block training trace.

The trace: ``--iterations`` steps of ``--blocks-per-iteration`` allocations (default 100 x 10,000 = 1M blocks)
on one device, each step repeating one template of (op, module, category, size) with jittered times, plus
``--accesses-per-block`` accesses per block (default 2). Prints, per trace size (1% and 10% of the blocks as
baselines, then all of them): seconds per section, total build time, HTML size, and the ratio of time per
block to the smallest run (near 1 means linear scaling). Also prints the size the live-memory curve alone
would take if every event were embedded, against what level of detail embeds.

    .venv/bin/python benchmarks/report_scale.py [--iterations 100] [--blocks-per-iteration 10000] [--no-whatif]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

import numpy as np
import pandas as pd

from memlens.trace import Trace

STEP_NS = 10_000_000
CATEGORIES = np.array(["activation", "gradient", "temporary", "optimizer_state", "parameter"], dtype=object)
OPS = np.array([f"aten::op{i}" for i in range(40)], dtype=object)
MODULES = np.array([f"model.layers.{i}.mlp" for i in range(24)] + [""], dtype=object)


def synthetic_trace(iterations: int, per_iteration: int, accesses_per_block: int, seed: int = 0) -> Trace:
    """A training-like trace: every iteration repeats one template with jittered times (vectorised)."""
    rng = np.random.default_rng(seed)
    n = iterations * per_iteration
    template_size = (rng.lognormal(10, 2.5, per_iteration).astype(np.int64) // 512 + 1) * 512
    template_start = np.sort(rng.uniform(0, 0.9, per_iteration))
    template_life = rng.exponential(0.1, per_iteration)
    it = np.repeat(np.arange(iterations), per_iteration)
    k = np.tile(np.arange(per_iteration), iterations)
    alloc = ((it + template_start[k]) * STEP_NS + rng.integers(0, 1000, n)).astype(np.int64)
    free = (alloc + np.maximum(template_life[k] * STEP_NS, 1000)).astype(np.int64)
    addr = (1 << 40) + rng.integers(0, 1 << 20, n) * 4096
    blocks = pd.DataFrame({
        "block_id": np.arange(n), "device": "cuda:0", "addr": addr, "size": template_size[k],
        "alloc_ns": alloc, "free_ns": free, "category": CATEGORIES[k % len(CATEGORIES)],
        "op": OPS[k % len(OPS)], "module": MODULES[k % len(MODULES)]})
    m = n * accesses_per_block
    bid = np.repeat(np.arange(n), accesses_per_block)
    frac = rng.uniform(0, 1, m)
    t = (alloc[bid] + frac * (free[bid] - alloc[bid])).astype(np.int64)
    accesses = pd.DataFrame({"block_id": bid, "t_ns": t, "op_id": np.arange(m) // 4, "is_write": frac < 0.3})
    n_ops = m // 4 + 1
    op_start = np.sort(rng.integers(0, iterations * STEP_NS, n_ops))
    ops = pd.DataFrame({"op_id": np.arange(n_ops), "name": OPS[np.arange(n_ops) % len(OPS)],
                        "start_ns": op_start, "end_ns": op_start + 1000, "module": "",
                        "iteration": (op_start // STEP_NS).astype(np.int64)})
    return Trace.from_tables(blocks, accesses, ops, {"source_kind": "synthetic", "iteration_source": "memlens.step"})


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic"]


def browser_draw_seconds(path) -> float | None:
    """Seconds from navigation to every figure drawn, in headless Chromium (None without chromium)."""
    import shutil
    from pathlib import Path

    chromium = shutil.which("chromium")
    if chromium is None:
        return None
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(profile, executable_path=chromium, args=CHROMIUM_ARGS,
                                                        headless=True)
        try:
            page = context.new_page()
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://") else r.abort())
            start = time.perf_counter()
            page.goto(Path(path).resolve().as_uri(), wait_until="load", timeout=300_000)
            page.wait_for_function("document.body.hasAttribute('data-figures-drawn')", timeout=300_000)
            return time.perf_counter() - start
        finally:
            context.close()


def run(trace: Trace, whatif: bool, browser: bool = False) -> dict:
    from memlens.reporting import build_report

    start = time.perf_counter()
    built = build_report(trace, whatif=whatif)
    with tempfile.TemporaryDirectory() as tmp:
        path = built.write(os.path.join(tmp, "report.html"))
        size = path.stat().st_size
        total = time.perf_counter() - start
        draw = browser_draw_seconds(path) if browser else None
    failed = [(s.key, s.message) for s in built.failed]
    return {"seconds": total, "bytes": size, "sections": {s.key: s.seconds for s in built.sections},
            "failed": failed, "draw_seconds": draw}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--blocks-per-iteration", type=int, default=10_000)
    p.add_argument("--accesses-per-block", type=int, default=2)
    p.add_argument("--no-whatif", dest="whatif", action="store_false",
                   help="skip the what-if simulations (they run on a window around the peak of big traces)")
    args = p.parse_args(argv)

    run(synthetic_trace(1, 1000, 1), args.whatif)  # warm-up: imports and first-call costs stay out of the ratios
    results = []
    for share in (0.01, 0.1, 1.0):
        iters = max(int(args.iterations * share), 1)
        t0 = time.perf_counter()
        trace = synthetic_trace(iters, args.blocks_per_iteration, args.accesses_per_block)
        gen = time.perf_counter() - t0
        r = run(trace, args.whatif, browser=share == 1.0)
        n = len(trace.blocks)
        results.append((n, r))
        per_block = r["seconds"] / n
        base = results[0][1]["seconds"] / results[0][0]
        print(f"{n:>9,} blocks, {len(trace.accesses):>10,} accesses: report {r['seconds']:6.1f} s "
              f"(trace synthesis {gen:.1f} s), HTML {r['bytes'] / 1e6:5.1f} MB, time per block x{per_block / base:.2f} "
              f"of the {results[0][0]:,}-block run")
        print("           sections: " + ", ".join(f"{k} {v:.1f}s" for k, v in r["sections"].items()))
        if r["failed"]:
            print(f"           FAILED sections: {r['failed']}")
        if share == 1.0:
            events = len(trace.blocks) * 2
            naive = events * 2 * 8 * 4 / 3  # x and y as float64, base64 in the page
            print(f"           every event of the live curve embedded would take {naive / 1e6:.1f} MB per figure; "
                  f"the whole report with level of detail is {r['bytes'] / 1e6:.1f} MB "
                  f"(plotly.js alone ~4.8 MB)")
            if r["draw_seconds"] is not None:
                print(f"           headless Chromium opens and draws it in {r['draw_seconds']:.1f} s")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max resident memory: {peak_mb:,.0f} MB")
    return 1 if any(r["failed"] for _, r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
