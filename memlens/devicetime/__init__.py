"""Device time: put a trace on the clock of the GPU the job really runs on.

- `gpus()` / `GPU`: the built-in devices (datasheet peaks, host links, latency constants) and custom ones.
- `costmodel`: per-op device durations from the ops table's cost facts (per op class, not a roofline).
- `retime(trace, gpu=...)`: a new Trace whose ops, accesses and block lifetimes are on the modeled clock.
- the measured CUDA clock (kernel activity correlated to the ops that launched it) is `memlens.gpu_activity`
  (a shared helper below the recorder) and `memlens.clock.onto_kernel_clock`.

Layering: above `memlens.trace`, below the analyses (they may import this package; it never imports them).
"""
from __future__ import annotations

from memlens.devicetime.gpus import GPU, gpu, gpus

__all__ = ["GPU", "gpu", "gpus", "retime"]


def __getattr__(name):
    if name == "retime":
        from memlens.devicetime.retiming import retime
        globals()[name] = retime
        return retime
    raise AttributeError(f"module 'memlens.devicetime' has no attribute {name!r}")
