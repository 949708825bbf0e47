"""Predicted vs real GPU memory on the cs336 workloads, memlens.predict beside torch's MemTracker.

Both run on this CPU-only machine under the same fake-CUDA environment (memlens's shim makes MemTracker's
backward possible at all on a CPU build). Real figures come from the shared CUDA snapshots:
peak allocated = the allocator-rounded max live bytes of the recorded step, peak reserved = the snapshot's
segments. MemTracker has no allocator model: its one peak stands for both. Times are wall-clock seconds of
the whole run (model build, 5 warm-up steps, the measured step), in this process.

    python benchmarks/predict_accuracy.py [inference|training ...]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import memlens  # noqa: F401  (first: installs the fake-CUDA shim before torch)
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "traces" / "snapshots"


def real_figures(kind: str) -> tuple[int, int]:
    from memlens.simulate import simulate
    sim = simulate(memlens.load(SHARED / f"cs336_wedsonlin_medium_128_{kind}.pickle")).devices["cuda:0"]
    return sim.peak_allocated, sim.recorded["peak_reserved"]


def with_memlens(kind: str):
    from tests.workloads import cs336_lm
    t = time.perf_counter()
    with memlens.predict(gpu="A100") as p:
        getattr(cs336_lm, f"{kind}_run")()
    peaks = (p.peak_allocated_since_reset, p.peak_reserved)
    return peaks, time.perf_counter() - t


def with_memtracker(kind: str):
    """The same run with MemTracker tracking the measured step (its peak is live tensor bytes)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from memlens.prediction.environment import fake_cuda
    from tests.workloads import cs336_lm as w
    t = time.perf_counter()
    # FakeTensorMode as torch ships it (memlens's faster cache key is memlens's, not MemTracker's)
    with fake_cuda("NVIDIA A100-SXM4-80GB", (8, 0), fast_cache_key=False):
        model = w.TransformerLM(**w.MEDIUM)
        model.to("cuda")
        v, s, b = w.MEDIUM["vocab_size"], w.MEDIUM["context_length"], w.BATCH
        ids = torch.randint(0, v, (w.WARMUP_STEPS + 1, b, s), device="cuda")
        tg = torch.randint(0, v, (w.WARMUP_STEPS + 1, b, s), device="cuda")
        mt = MemTracker()
        if kind == "training":
            opt = w.CourseAdamW(model.parameters())
            mt.track_external(model, opt)
            for i in range(w.WARMUP_STEPS):
                w.cross_entropy(model(ids[i]), tg[i]).backward(); opt.step(); opt.zero_grad()
            with mt:
                w.cross_entropy(model(ids[-1]), tg[-1]).backward(); opt.step()
        else:
            mt.track_external(model)
            model.eval()
            with torch.inference_mode():
                for i in range(w.WARMUP_STEPS):
                    model(ids[i])
                with mt:
                    model(ids[-1])
        peak = mt.get_tracker_snapshot("peak")
    total = max(d.get("Total", 0) for d in peak.values())
    return (total, total), time.perf_counter() - t


def warm_up():
    """Pay one-time imports and first-call costs outside the timed runs (both tools share them)."""
    from torch.distributed._tools.mem_tracker import MemTracker  # noqa: F401
    with memlens.predict(gpu="A100"):
        lin = torch.nn.Linear(64, 64).cuda()
        lin(torch.randn(2, 64, device="cuda")).sum().backward()


def main(kinds):
    warm_up()
    print(f"{'workload':10} {'tool':10} {'alloc err':>10} {'reserved err':>13} {'seconds':>8}")
    for kind in kinds:
        ra, rr = real_figures(kind)
        for name, fn in (("memlens", with_memlens), ("MemTracker", with_memtracker)):
            try:
                (a, r), secs = fn(kind)
            except Exception as exc:  # report, keep the table going
                print(f"{kind:10} {name:10} failed: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            print(f"{kind:10} {name:10} {100 * (a - ra) / ra:+9.3f}% {100 * (r - rr) / rr:+12.3f}% {secs:8.1f}")
    print("real: peak allocated / reserved from the CUDA snapshots; seconds on this machine, same process")


if __name__ == "__main__":
    main(sys.argv[1:] or ["inference", "training"])
