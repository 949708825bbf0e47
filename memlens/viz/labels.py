"""Text and colour helpers shared by the figures.

Plotly renders trace names, hover text and annotations as a small HTML dialect (``<b>``, ``<br>``, ``<a>``),
so any text that comes from a trace (module, op, file and frame names, user metadata) is HTML-escaped here
before it reaches a figure: a module called ``<img src=x onerror=...>`` shows as text and runs nothing.
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd

# a qualitative palette with enough distinct hues for categories plus "other"
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6",
           "#9D755D", "#BAB0AC", "#1F77B4", "#2CA02C")
CATEGORY_COLORS = {
    "parameter": "#4C78A8", "buffer": "#72B7B2", "gradient": "#F58518", "activation": "#54A24B",
    "optimizer_state": "#B279A2", "input": "#EECA3B", "temporary": "#E45756", "autograd_detail": "#FF9DA6",
    "unknown": "#BAB0AC", "other": "#9D755D",
}
NONE_LABEL = "(unknown)"  # one word for "the source does not say", as in tables and diff


def safe(text) -> str:
    """`text` as a string with HTML special characters escaped (quotes included: safe in attributes too)."""
    return html.escape("" if text is None else str(text), quote=True)


def plot_text(text) -> str:
    """`text` escaped for plotly's text dialect (names, titles, hover text, annotations).

    ``<``, ``>`` and ``&`` are escaped so no tag can form; quotes are left alone because plotly shows
    ``&quot;`` literally and, with no tag possible, a quote has no attribute to break out of.
    """
    return html.escape("" if text is None else str(text), quote=False)


def safe_labels(values) -> np.ndarray:
    """`plot_text` of every label of an array-like (each distinct label once); empty labels become ``(unknown)``."""
    labels = pd.Series(values, dtype=object).fillna("").astype(str).replace("", NONE_LABEL)
    codes, uniques = pd.factorize(labels)
    escaped = np.array([html.escape(v, quote=False) for v in uniques], dtype=object)
    return escaped[codes] if len(labels) else np.array([], dtype=object)


def color_for(group: str, i: int, by: str) -> str:
    """A stable colour: the category's own when `by` is category, otherwise the palette's i-th."""
    if by == "category" and group in CATEGORY_COLORS:
        return CATEGORY_COLORS[group]
    return PALETTE[i % len(PALETTE)]


TIME_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "\u00b5s"), (1.0, "ns"))


def time_unit(span_ns: float) -> tuple[float, str]:
    """(divisor from ns, unit) that shows a span of `span_ns` with a readable number of digits."""
    for divisor, unit in TIME_UNITS:
        if span_ns >= 10 * divisor:
            return divisor, unit
    return 1.0, "ns"


def time_axis(x: str, span_ns: float | None = None, clock: str | None = None) -> tuple[float, str]:
    """(divisor from ns, axis title) for an x mode: 'time' plots time since the trace start (milliseconds, or
    the unit that suits `span_ns` when given) on the named `clock` (e.g. "modeled H100 SXM clock"; see
    `memlens.clock.clock_label`), 'event' the event index."""
    if x == "time":
        divisor, unit = (1e6, "ms") if span_ns is None else time_unit(span_ns)
        return divisor, f"time since trace start ({unit}{', ' + clock if clock else ''})"
    if x == "event":
        return 1.0, "event index (allocs and frees, in order)"
    raise ValueError(f"x must be 'time' or 'event', got {x!r}")


def binary_ticks(lo: float, hi: float, target: int = 6) -> tuple[list[float], list[str]]:
    """Tick positions (bytes) over [lo, hi] at a round step of a binary unit (1, 2, 5 x 2**k-ish: 1, 2, 4,
    5, 8, 10, 16, 20, 25, 32, 40, 50, 64 ... of KiB / MiB / GiB), with labels like "512 MiB" (plotly's own
    ".3s" ticks would say "537MB")."""
    span = max(float(hi) - float(lo), 1.0)
    div, unit = byte_unit(max(abs(lo), abs(hi), 1.0))
    raw = span / div / max(target, 1)
    mag = 10 ** np.floor(np.log10(raw)) if raw > 0 else 1.0
    step = next((m * mag for m in (1, 2, 2.5, 4, 5, 8, 10) if m * mag >= raw), 10 * mag)
    first = np.ceil(lo / div / step) * step
    values = np.arange(first, hi / div + step * 1e-9, step)
    return [float(v * div) for v in values], [f"{v:g} {unit}" for v in values]


def byte_unit(max_bytes: float) -> tuple[float, str]:
    """(divisor, unit) of the binary unit that suits values up to `max_bytes` (PyTorch reports KiB/MiB/GiB)."""
    for divisor, unit in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if max_bytes >= divisor:
            return float(divisor), unit
    return 1.0, "B"
