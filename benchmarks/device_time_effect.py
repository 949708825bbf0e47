"""What the clock changes: the share of idle byte-time that a host link could swap, on the recording's
host clock and on modeled GPU clocks, for small training steps recorded on the CPU.

    .venv/bin/python benchmarks/device_time_effect.py

Each workload is one training step (forward, backward, Adam) recorded with `memlens.record`; the
link is each GPU's own host link (H100/MI300X: PCIe 5.0 at 50 GB/s each way, A100: PCIe 4.0 at 25 GB/s,
10 us per transfer). Also prints how long retiming a recorded forward + backward takes.
"""
from __future__ import annotations

import time

import torch

import memlens
from memlens.analysis.ati import access_intervals
from memlens.analysis.bandwidth import BandwidthModel
from memlens.analysis.outliers import bandwidth_filter, filter_summary
from memlens.demo import make_cnn, make_transformer
from memlens.devicetime import gpu


def _step(model, x, y=None):
    opt = torch.optim.Adam(model.parameters())
    with memlens.record(model) as rec:
        out = model(x)
        (out.float().pow(2).mean() if y is None else torch.nn.functional.cross_entropy(out, y)).backward()
        opt.step()
        opt.zero_grad()
    return rec.trace


def _share(trace, link) -> tuple[float, float]:
    fs = filter_summary(bandwidth_filter(access_intervals(trace), link))
    return fs["swappable_share"] or 0.0, 1 - fs["filtered_out_fraction"]


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    workloads = {
        "transformer (d=256, 4 layers, 8x128 tokens)": (make_transformer(vocab=1024, d_model=256, n_heads=8,
                                                                         n_layers=4, seq_len=128),
                                                        torch.randint(0, 1024, (8, 128))),
        "CNN (64 channels, batch 32, 32x32)": (make_cnn(channels=64), torch.randn(32, 3, 32, 32)),
    }
    for name, (model, x) in workloads.items():
        trace = _step(model, x)
        ops = trace.ops
        print(f"\n{name}: {len(ops):,} ops, {int((ops['flops'] > 0).sum())} with flops, recorded in "
              f"{trace.duration_ns / 1e6:.1f} ms on the host clock")
        for gname in (None, "H100", "A100", "MI300X"):
            if gname is None:
                g = gpu("H100")
                t = trace
                label = "host clock (CPU), H100 link"
            else:
                g = gpu(gname)
                t = memlens.retime(trace, gpu=g)
                label = f"modeled {g.name}"
            link = BandwidthModel(h2d_bytes_per_s=g.host_bw[1], d2h_bytes_per_s=g.host_bw[0], latency_ns=g.latency_ns,
                                  name=g.host_link)
            share, fraction = _share(t, link)
            print(f"  {label:<30} step {t.duration_ns / 1e6:9.3f} ms   swappable idle byte-time {share:6.1%}   "
                  f"swappable intervals {fraction:6.1%}")
    # retiming cost: per distinct op signature, then vectorised re-stamping
    model, x = workloads["transformer (d=256, 4 layers, 8x128 tokens)"]
    with memlens.record(model, backend="python") as rec:
        model(x).float().pow(2).mean().backward()
    records = len(rec.trace.ops)
    start = time.perf_counter()
    memlens.retime(rec.trace, gpu="H100")
    print(f"\nretime of {records:,} ops: {(time.perf_counter() - start) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
