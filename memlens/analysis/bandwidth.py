"""Host<->device transfer cost model: how long it takes to swap a block out and back in.

A transfer of `size` bytes in one direction costs ``latency + size / bandwidth`` (the linear model Zhang et
al. fitted on PCIe 3.0, arXiv 1903.06631). An access interval is worth swapping only when it is at least
as long as the round trip:

    round_trip_ns(size) = size / bw_out + size / bw_in + latency_out + latency_in

with bw_out the device->host (swap-out) and bw_in the host->device (swap-in) bandwidth. With one shared
latency this is ``size/bw_out + size/bw_in + 2 * latency``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from memlens.errors import InputError
from memlens.units import format_bytes, format_ns, parse_bandwidth

_NS_PER_S = 1e9

# Defaults: PCIe 4.0 x16 moves ~25 GB/s of pinned-memory copies each way in practice (31.5 GB/s raw);
# ~10 us covers cudaMemcpyAsync launch and DMA setup.
DEFAULT_BYTES_PER_S = 25e9
DEFAULT_LATENCY_NS = 10_000.0


@dataclass(frozen=True)
class BandwidthModel:
    """Transfer costs between device and host memory.

    Parameters: ``h2d_bytes_per_s`` (host->device, the swap-in bandwidth, bytes per second),
    ``d2h_bytes_per_s`` (device->host, the swap-out bandwidth), ``latency_ns`` (fixed cost of one transfer,
    ns). ``h2d_latency_ns`` / ``d2h_latency_ns`` override the latency per direction (Zhang et al. measured
    47 us out and 9.7 us in). Infinite bandwidths with zero latency give the infinite-bandwidth bound, in
    which every idle interval is swappable.
    """

    h2d_bytes_per_s: float = DEFAULT_BYTES_PER_S
    d2h_bytes_per_s: float = DEFAULT_BYTES_PER_S
    latency_ns: float = DEFAULT_LATENCY_NS
    h2d_latency_ns: float | None = None
    d2h_latency_ns: float | None = None
    name: str = "custom"

    def __post_init__(self):
        for field_name in ("h2d_bytes_per_s", "d2h_bytes_per_s"):
            value = getattr(self, field_name)
            if not value > 0:
                raise InputError(f"{field_name} must be positive, got {value!r}")
        for field_name in ("latency_ns", "h2d_latency_ns", "d2h_latency_ns"):
            value = getattr(self, field_name)
            if value is not None and not value >= 0:
                raise InputError(f"{field_name} must be >= 0, got {value!r}")

    # ---- per-direction costs ------------------------------------------------------------------
    @property
    def in_latency_ns(self) -> float:
        """Fixed cost of one host->device transfer, ns."""
        return float(self.latency_ns if self.h2d_latency_ns is None else self.h2d_latency_ns)

    @property
    def out_latency_ns(self) -> float:
        """Fixed cost of one device->host transfer, ns."""
        return float(self.latency_ns if self.d2h_latency_ns is None else self.d2h_latency_ns)

    def swap_out_ns(self, size):
        """Time to copy `size` bytes device->host, ns (scalar or numpy array, float64)."""
        size = np.asarray(size, dtype=np.float64)
        return self.out_latency_ns + size * (_NS_PER_S / self.d2h_bytes_per_s)

    def swap_in_ns(self, size):
        """Time to copy `size` bytes host->device, ns (scalar or numpy array, float64)."""
        size = np.asarray(size, dtype=np.float64)
        return self.in_latency_ns + size * (_NS_PER_S / self.h2d_bytes_per_s)

    def round_trip_ns(self, size):
        """Swap out then back in: the shortest idle interval worth swapping for `size` bytes, ns."""
        return self.swap_out_ns(size) + self.swap_in_ns(size)

    @property
    def is_infinite(self) -> bool:
        """True for the infinite-bandwidth, zero-latency bound."""
        return (math.isinf(self.h2d_bytes_per_s) and math.isinf(self.d2h_bytes_per_s)
                and self.in_latency_ns == 0 and self.out_latency_ns == 0)

    def with_latency(self, latency_ns: float) -> "BandwidthModel":
        """The same bandwidths with one latency for both directions, ns."""
        return replace(self, latency_ns=float(latency_ns), h2d_latency_ns=None, d2h_latency_ns=None)

    def describe(self) -> str:
        """One phrase for people, e.g. 'pcie4_x16 (out 25.0 GB/s + 10.0 us, in 25.0 GB/s + 10.0 us)'."""
        def rate(bps):
            return "inf" if math.isinf(bps) else f"{bps / 1e9:.1f} GB/s"
        return (f"{self.name} (out {rate(self.d2h_bytes_per_s)} + {format_ns(self.out_latency_ns)}, "
                f"in {rate(self.h2d_bytes_per_s)} + {format_ns(self.in_latency_ns)})")

    def to_dict(self) -> dict:
        """JSON-ready description (bytes per second and ns)."""
        return {"name": self.name, "h2d_bytes_per_s": self.h2d_bytes_per_s,
                "d2h_bytes_per_s": self.d2h_bytes_per_s, "h2d_latency_ns": self.in_latency_ns,
                "d2h_latency_ns": self.out_latency_ns}

    def breakeven_ns_for(self, size: int) -> str:
        """'a 64.0 MiB block needs 5.39 ms idle' - the round trip of one size, for messages."""
        return f"a {format_bytes(size)} block needs {format_ns(float(self.round_trip_ns(size)))} idle"

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> "BandwidthModel":
        """A named link (see `PRESETS`): pcie3_x16, pcie4_x16, pcie5_x16, zhang_pcie3, nvlink2_power9,
        nvlink_c2c, infinite."""
        key = name.strip().lower().replace("-", "_").replace(" ", "_")
        key = _ALIASES.get(key, key)
        if key not in PRESETS:
            raise InputError(f"unknown link '{name}' (known: {', '.join(sorted(PRESETS))})")
        return PRESETS[key]

    @classmethod
    def parse(cls, text: str | float, latency_ns: float | None = None) -> "BandwidthModel":
        """A model from a string: a preset name ('pcie4', 'zhang', 'nvlink_c2c', 'inf') or one bandwidth for
        both directions ('25GB/s', '12.5e9'), optionally 'OUT,IN' ('13.2GB/s,12.2GB/s').

        `latency_ns` replaces the latency (default: the preset's, or `DEFAULT_LATENCY_NS`).
        """
        if isinstance(text, BandwidthModel):
            return text if latency_ns is None else text.with_latency(latency_ns)
        if isinstance(text, str):
            key = text.strip().lower().replace("-", "_")
            if key in PRESETS or key in _ALIASES:
                model = cls.preset(key)
                return model if latency_ns is None else model.with_latency(latency_ns)
            parts = [p for p in text.split(",") if p.strip()]
            if len(parts) == 2:
                out_bps, in_bps = (parse_bandwidth(p) for p in parts)
                return cls(h2d_bytes_per_s=in_bps, d2h_bytes_per_s=out_bps,
                           latency_ns=DEFAULT_LATENCY_NS if latency_ns is None else float(latency_ns),
                           name=text.strip())
        bps = parse_bandwidth(text)
        return cls(h2d_bytes_per_s=bps, d2h_bytes_per_s=bps,
                   latency_ns=DEFAULT_LATENCY_NS if latency_ns is None else float(latency_ns),
                   name=str(text).strip())


PRESETS: dict[str, BandwidthModel] = {
    # effective pinned-memory copy rates; raw link rates are ~1.25x higher
    "pcie3_x16": BandwidthModel(12e9, 12e9, 10_000.0, name="pcie3_x16"),
    "pcie4_x16": BandwidthModel(25e9, 25e9, 10_000.0, name="pcie4_x16"),
    "pcie5_x16": BandwidthModel(50e9, 50e9, 10_000.0, name="pcie5_x16"),
    # Zhang et al. (arXiv 1903.06631), measured on PCIe 3.0 x16: out 13.2 GB/s + 47 us, in 12.2 GB/s + 9.7 us
    "zhang_pcie3": BandwidthModel(12.2e9, 13.2e9, 0.0, h2d_latency_ns=9_700.0, d2h_latency_ns=47_000.0,
                                  name="zhang_pcie3"),
    # CPU-GPU NVLink 2.0 on IBM POWER9 (3 bricks x 25 GB/s per direction, ~63 GB/s measured copies)
    "nvlink2_power9": BandwidthModel(63e9, 63e9, 5_000.0, name="nvlink2_power9"),
    # Grace Hopper NVLink-C2C: 450 GB/s per direction nominal
    "nvlink_c2c": BandwidthModel(450e9, 450e9, 2_000.0, name="nvlink_c2c"),
    "infinite": BandwidthModel(math.inf, math.inf, 0.0, name="infinite"),
}
_ALIASES = {"pcie3": "pcie3_x16", "pcie4": "pcie4_x16", "pcie5": "pcie5_x16", "zhang": "zhang_pcie3",
            "nvlink": "nvlink_c2c", "nvlink2": "nvlink2_power9", "c2c": "nvlink_c2c", "inf": "infinite",
            "default": "pcie4_x16"}

DEFAULT = PRESETS["pcie4_x16"]
