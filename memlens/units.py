"""Parsing and formatting of bytes, bandwidths and durations, the way people write them."""
from __future__ import annotations

import math
import re

from memlens.errors import InputError

_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


# the largest size or bandwidth memlens accepts: 2**56 bytes (64 PiB) keeps every byte sum within int64
MAX_BYTES = 1 << 56


def parse_bytes(text: str | int | float) -> int:
    """'80GB' -> 80e9, '1.5GiB' -> 1.5 * 2**30, 1024 -> 1024. Raises InputError on nonsense, on negative,
    non-finite values and on sizes of `MAX_BYTES` (64 PiB) or more."""
    if isinstance(text, bool):
        raise InputError(f"cannot read {text!r} as a size")
    if isinstance(text, (int, float)):
        value = float(text) if isinstance(text, float) else text
    else:
        if len(str(text)) > 64:  # no size is written with this many characters; int() of 5,000 digits fails
            raise InputError(f"cannot read '{str(text)[:32]}...' ({len(str(text)):,} characters) as a size")
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
        if not m or m.group(2).lower() not in _BYTE_UNITS:
            raise InputError(f"cannot read '{text}' as a size (examples: 512MB, 80GB, 1.5GiB)")
        value = float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()]
        if m.group(2) == "" and re.fullmatch(r"\s*[0-9]+\s*", str(text)):
            value = int(m.group(1))  # exact for plain integers (no float rounding)
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"size '{text}' is not a finite number")
    if value < 0:
        raise InputError(f"size '{text}' is negative")
    if value >= MAX_BYTES:
        raise InputError(f"size '{text}' is 64 PiB (2**56 bytes) or more; no device has that much memory")
    return int(value)


def parse_bandwidth(text: str | int | float) -> float:
    """'25GB/s' -> 25e9 bytes per second. A bare number is bytes per second."""
    s = str(text).strip()
    if s.lower().endswith("/s"):
        s = s[:-2]
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        value = parse_bytes(s) if not re.fullmatch(r"[0-9.]+", s) else float(s)
    if not math.isfinite(value):
        raise InputError(f"bandwidth '{text}' is not finite (use the preset 'inf' for the infinite-bandwidth bound)")
    if value <= 0:
        raise InputError(f"bandwidth must be positive, got '{text}'")
    if value >= MAX_BYTES:
        raise InputError(f"bandwidth '{text}' is 64 PB/s or more (use the preset 'inf' for an unbounded link)")
    return float(value)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as PyTorch's allocator reports)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_share(x: float) -> str:
    """A fraction as a percentage, the same way everywhere: one decimal ('99.8%', '12.5%'), and never
    rounded to 0% or 100% when it is not exactly that ('<0.1%', '>99.9%')."""
    x = float(x)
    if x != x:  # NaN
        return "n/a"
    if 0 < x < 0.0005:
        return "<0.1%"
    if 0.9995 <= x < 1:
        return ">99.9%"
    return f"{100 * x:.1f}%"


def format_ns(ns: float) -> str:
    """Human duration from nanoseconds: '850 ns', '12.3 us', '4.56 ms', '1.23 s'."""
    ns = float(ns)
    if abs(ns) < 1e3:
        return f"{ns:.0f} ns"
    if abs(ns) < 1e6:
        return f"{ns / 1e3:.1f} us"
    if abs(ns) < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"
