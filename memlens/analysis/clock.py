"""Which clock a trace's times are on, said in every output that shows a time.

``trace.metadata["clock"]`` is ``{"kind": "host"|"cuda"|"modeled", "gpu": ..., "model": ...}``; absent means
host (REFERENCE.md section 2: a CPU recording runs ~100x slower than a GPU, and on CUDA host timestamps are
launch times, not kernel times, so an interval is only meaningful on the clock it was measured on).
"""
from __future__ import annotations

HOST_CLOCK = {"kind": "host"}


def clock_of(trace) -> dict:
    """The trace's clock as a plain dict (a copy; ``{"kind": "host"}`` when the metadata names none)."""
    clock = getattr(trace, "metadata", {}).get("clock") if trace is not None else None
    if not isinstance(clock, dict) or not clock.get("kind"):
        return dict(HOST_CLOCK)
    return dict(clock)


def describe_clock(clock: dict | None) -> str:
    """One phrase for people: 'host clock (launch/CPU times)', 'modeled clock (H100, roofline)', ..."""
    clock = clock or HOST_CLOCK
    kind = str(clock.get("kind", "host"))
    extra = ", ".join(str(clock[k]) for k in ("gpu", "model") if clock.get(k))
    if kind == "host" and not extra:
        return "host clock (times as the recording process saw them)"
    return f"{kind} clock" + (f" ({extra})" if extra else "")
