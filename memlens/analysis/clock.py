"""Which clock a trace's times are on, said in every output that shows a time.

``trace.metadata["clock"]`` is ``{"kind": "host"|"cuda"|"modeled", "gpu": ..., "model": ...}``, the same keys on
every trace (`memlens.trace.schema.CLOCK_KEYS`; host for a trace saved without one) (a CPU recording runs ~100x slower than a GPU, and on CUDA host timestamps are
launch times, not kernel times, so an interval is only meaningful on the clock it was measured on).
"""
from __future__ import annotations

HOST_CLOCK = {"kind": "host"}


def describe_clock(clock: dict | None) -> str:
    """One phrase for people, built on `memlens.clock.clock_label`: 'host clock (times as the recording
    process saw them)', 'modeled H100 SXM clock (model: ...); TF32 matmul off, conv on (...)', 'measured CUDA
    kernel clock (NVIDIA H100 ...)'."""
    from memlens.clock import clock_label
    clock = clock or HOST_CLOCK
    label = clock_label(clock)
    if str(clock.get("kind", "host")) == "host":
        return label + " (times as the recording process saw them)"
    model = clock.get("model")
    if clock.get("kind") != "modeled":
        return label
    from memlens.clock import tf32_label
    tf32 = tf32_label(clock.get("tf32"))
    return label + (f" (model: {model})" if model else "") + (f"; {tf32}" if tf32 else "")
