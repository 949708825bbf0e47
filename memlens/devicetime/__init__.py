"""Device time: put a trace on the clock of the GPU the job really runs on.

- `gpus()` / `GPU`: the built-in devices (datasheet peaks, host links, latency constants) and custom ones.
- `costmodel`: per-op device durations from the ops table's cost facts (per op class, not a roofline).
- `retime(trace, gpu=...)`: a new Trace whose ops, accesses and block lifetimes are on the modeled clock.
- `kineto`: the measured CUDA clock (kernel activity correlated to the ops that launched it).

Layering: above `memlens.trace`, below the analyses (they may import this package; it never imports them).
"""
from __future__ import annotations

from memlens.devicetime.gpus import GPU, gpu, gpus

__all__ = ["GPU", "gpu", "gpus", "retime", "clock_of", "clock_label"]


def __getattr__(name):
    if name in ("retime", "clock_of", "clock_label"):
        from memlens.devicetime import retiming as _retime_module
        value = getattr(_retime_module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'memlens.devicetime' has no attribute {name!r}")
