"""The GPUs memlens can put a trace on: datasheet peaks plus the latency constants of the cost model.

Each built-in row carries its source. Peaks are *dense* (no 2:4 sparsity) vendor datasheet figures; the
host link is the effective pinned-memory copy rate per direction (~80% of the raw PCIe rate, which is
what ``cudaMemcpyAsync`` of pinned memory reaches; NVLink-C2C at its nominal 450 GB/s per direction).

Library efficiencies (fractions of a peak): `gemm_efficiency` (cuBLAS ~0.7; hipBLASLt 0.4: the MI300X
TimeSformer profile's large GEMMs reach 0.35-0.4 of the datasheet rate), `attention_efficiency`
(FlashAttention-2: 0.17 on Hopper, 0.45 on Ampere/Ada, 0.3 for Volta's memory-efficient kernel; AMD 0.12
from the MI300X bert-small profile), `norm_efficiency` (row-wise norms: 0.41 of HBM on the H100 TimeSformer
profile, 0.25 on the MI300X one), `softmax_block_efficiency` (0.20 on both), `pageable_bw` (host copies
from pageable memory: ~11 GB/s on NVIDIA systems, 35 GB/s with ROCm's staging). See
`memlens.devicetime.rules` for the rules that use them.

The latency constants (`kernel_floor_ns`, `gemm_floor_ns`, `gemm_k_ns`, `attention_floor_ns`) describe
how far small kernels are from any peak (see `memlens.devicetime.costmodel`). They were read, kernel by
kernel, from public Kineto profiles for the H100 SXM and the MI300X (AMD-AGI/TraceLens test traces:
smallest elementwise kernel, the fixed part and the per-K slope of single-wave GEMMs, a short-sequence
flash-attention kernel). For the other NVIDIA parts they are the H100's scaled by the ratio of boost
clocks (latency in cycles is an architecture property; Ampere/Ada/Volta kernels are a bit slower per
cycle than that, so those rows are estimates, marked so in `latency_source`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import pandas as pd

from memlens.errors import InputError, read_user_file

DTYPE_KEYS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")

# canonical torch dtype name -> the peak it runs at (fp32 matmuls run at "tf32" only when allowed)
DTYPE_TO_KEY = {
    "float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8",
    "int8": "int8", "uint8": "int8", "complex64": "fp32", "complex128": "fp64",
}

_T = 1e12
_GB = 1e9
MAX_GPU_FILE_BYTES = 1 << 20  # a GPU description is a few kB; calibration residuals add tens


def _peak_key(key) -> str:
    """"bf16" stays; "bfloat16", "torch.bfloat16" or torch.bfloat16 -> "bf16"; "tf32" stays; else as given."""
    text = str(key).strip().lower()
    text = text[6:] if text.startswith("torch.") else text
    return text if text in DTYPE_KEYS else DTYPE_TO_KEY.get(text, text)


@dataclass(frozen=True)
class GPU:
    """One device for `memlens.retime`.

    Units: ``flops`` in FLOP/s per dtype key (fp64, fp32, tf32, bf16, fp16, fp8, int8; dense tensor-core
    rates where the part has them), ``mem_bw`` in bytes/s (HBM/GDDR), ``host_bw`` = (device->host,
    host->device) bytes/s, ``latency_ns`` the fixed cost of one host transfer, ``launch_ns`` the
    per-kernel floor (duration of the smallest kernel), ns. The remaining fields are the cost model's
    latency constants and achieved efficiencies (fractions of peak).
    """

    name: str
    flops: dict
    mem_bw: float
    host_bw: tuple = (25 * _GB, 25 * _GB)
    latency_ns: float = 10_000.0
    launch_ns: float = 2_000.0
    memory_bytes: int = 0
    compute_units: int = 100
    clock_ghz: float = 1.5
    host_link: str = "custom"
    vendor: str = "custom"
    gemm_floor_ns: float = 5_000.0        # fixed part of a single-wave GEMM kernel (prologue, epilogue)
    gemm_k_ns: float = 1.5                # per element of K along a tile's main loop
    attention_floor_ns: float = 7_000.0   # fixed part of a fused (flash) attention kernel
    gemm_efficiency: float = 0.7          # achieved fraction of the dense peak inside a GEMM wave
    attention_efficiency: float = 0.5     # achieved fraction of the dense peak inside fused attention
    mem_efficiency: float = 0.85          # achieved fraction of memory bandwidth by streaming kernels
    misaligned_gemm_penalty: float = 1.0  # slowdown of GEMMs whose leading dimensions break 16-byte alignment
    norm_efficiency: float = 0.4          # achieved fraction of memory bandwidth by row-wise norm / short softmax
    softmax_block_efficiency: float = 0.2  # the same for softmax over rows > 1024 (one thread block per row)
    pageable_bw: float = 11e9             # bytes/s of host copies from pageable (not pinned) memory
    nvlink_bw: float = 0.0                # bytes/s per GPU, one direction, GPU-to-GPU in a node (0: no NVLink)
    network_bw: float = 0.0               # bytes/s per GPU across nodes (its NIC), one direction
    gpus_per_node: int = 8
    interconnect_source: str = "user-defined"
    source: str = "user-defined"
    latency_source: str = "user-defined"
    aliases: tuple = field(default=(), compare=False)
    # per op class (fixed-part scale, throughput-part scale) fitted by memlens.calibrate; empty = built-in
    class_scale: dict = field(default_factory=dict, compare=False)
    calibration: dict = field(default_factory=dict, compare=False)   # fit residuals, profile, base GPU

    def __post_init__(self):
        if not isinstance(self.flops, dict) or not self.flops:
            raise InputError(f"GPU {self.name!r}: flops must be a dict {{dtype: FLOP/s}}")
        # keys may be torch dtypes or their names ("bfloat16", torch.bfloat16): stored as peak keys ("bf16")
        object.__setattr__(self, "flops", {_peak_key(k): float(v) for k, v in self.flops.items()})
        bad = [k for k in self.flops if k not in DTYPE_KEYS]
        if bad:
            raise InputError(f"GPU {self.name!r}: unknown flops keys {bad} (known: {', '.join(DTYPE_KEYS)})")
        if any(not (v > 0) for v in self.flops.values()):
            raise InputError(f"GPU {self.name!r}: every flops value must be positive")
        if not self.mem_bw > 0:
            raise InputError(f"GPU {self.name!r}: mem_bw must be positive bytes/s")
        if len(tuple(self.host_bw)) != 2 or any(not (b > 0) for b in self.host_bw):
            raise InputError(f"GPU {self.name!r}: host_bw must be (device->host, host->device) bytes/s, both > 0")
        for name in ("latency_ns", "launch_ns", "gemm_floor_ns", "gemm_k_ns", "attention_floor_ns"):
            if not getattr(self, name) >= 0:
                raise InputError(f"GPU {self.name!r}: {name} must be >= 0 ns")
        if not self.pageable_bw > 0:
            raise InputError(f"GPU {self.name!r}: pageable_bw must be positive bytes/s")
        for cls, pair in self.class_scale.items():
            if len(tuple(pair)) != 2 or any(not (float(v) >= 0) for v in pair):
                raise InputError(f"GPU {self.name!r}: class_scale[{cls!r}] must be (fixed scale, throughput scale) >= 0")
        for name in ("gemm_efficiency", "attention_efficiency", "mem_efficiency", "norm_efficiency",
                     "softmax_block_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise InputError(f"GPU {self.name!r}: {name} must be in (0, 1]")
        if not self.misaligned_gemm_penalty >= 1:
            raise InputError(f"GPU {self.name!r}: misaligned_gemm_penalty must be >= 1")

    def peak_flops(self, dtype: str, *, tf32: bool = False) -> float:
        """Dense peak FLOP/s for a compute dtype (a torch name such as "bfloat16" or a key such as "bf16").

        fp32 matmuls use the tf32 rate only when `tf32` (PyTorch's default is off); a dtype the part has
        no fast path for runs at its fp32 rate (bf16 on a V100, fp8 on an A100).
        """
        key = DTYPE_TO_KEY.get(dtype, dtype if dtype in DTYPE_KEYS else "fp32")
        if key == "fp32" and tf32 and "tf32" in self.flops:
            key = "tf32"
        if key in self.flops:
            return float(self.flops[key])
        if key == "fp8":
            for fallback in ("fp16", "bf16"):
                if fallback in self.flops:
                    return float(self.flops[fallback])
        return float(self.flops.get("fp32", max(self.flops.values())))

    def to_dict(self) -> dict:
        """JSON-ready description (units as in the class docstring)."""
        d = asdict(self)
        d["host_bw"] = list(self.host_bw)
        d["aliases"] = list(self.aliases)
        d["class_scale"] = {k: list(v) for k, v in self.class_scale.items()}
        return d


def _scaled(base: dict, clock_ratio: float) -> dict:
    """The H100's latency constants for a part whose boost clock is `1/clock_ratio` of the H100's."""
    return {k: base[k] * clock_ratio for k in ("launch_ns", "gemm_floor_ns", "gemm_k_ns", "attention_floor_ns")}


# Measured on the H100 SXM (TraceLens bert-small profile, kernel durations): smallest elementwise kernel
# ~1.6 us; single-wave bf16 GEMMs 5.8 us at K=512 and 8.2 us at K=2048 (-> 5.0 us + 1.6 ns per K);
# flash attention at 1 x 8 heads x 141 tokens x 64: 9.3 us (-> 7.0 us + the compute of 2 KV blocks).
_H100_LAT = {"launch_ns": 1_550.0, "gemm_floor_ns": 5_000.0, "gemm_k_ns": 1.55, "attention_floor_ns": 4_500.0}
_H100_CLOCK = 1.98
_PCIE3 = (13.2 * _GB, 12.2 * _GB)   # Zhang et al. measured (arXiv 1903.06631), out / in
_PCIE4 = (25 * _GB, 25 * _GB)
_PCIE5 = (50 * _GB, 50 * _GB)
_C2C = (450 * _GB, 450 * _GB)
# GPU-to-GPU links, one direction per GPU (datasheets give NVLink as bidirectional totals): H100/H200 SXM
# NVLink 4 900 GB/s -> 450; A100 SXM NVLink 3 600 -> 300; V100 SXM2 NVLink 2 300 -> 150. Network: one NIC per
# GPU as in DGX systems, InfiniBand NDR 400 Gb/s = 50 GB/s (Hopper), HDR 200 Gb/s = 25 GB/s (A100),
# EDR 100 Gb/s = 12.5 GB/s (V100): an estimate of a typical cluster, not a property of the GPU.
_NVL4 = {"nvlink_bw": 450 * _GB, "network_bw": 50 * _GB,
         "interconnect_source": "NVLink 4 900 GB/s bidirectional (datasheet) -> 450 GB/s per direction; network "
                                "estimate: one InfiniBand NDR 400 Gb/s NIC per GPU = 50 GB/s"}
_MEASURED = "kernel durations in the public H100 TraceLens profile (AMD-AGI/TraceLens tests/traces/h100)"


def _nvidia(name, clock, **kw):
    lat = _scaled(_H100_LAT, _H100_CLOCK / clock)
    lat.update({k: kw.pop(k) for k in list(kw) if k in lat})
    return GPU(name=name, clock_ghz=clock, vendor="nvidia", misaligned_gemm_penalty=kw.pop("misaligned", 3.0),
               attention_efficiency=kw.pop("attention_efficiency", 0.17),
               latency_source=kw.pop("latency_source", f"H100 constants scaled by boost clock ({_H100_CLOCK} / "
                                                     f"{clock} GHz); not measured on this part"),
               **lat, **kw)


# FlashAttention-2 on parts whose mma.sync path it was written for (Ampere, Ada): Dao (arXiv 2307.08691)
# reports 50-73% of the A100's peak in the forward pass at long sequences, less for head dim 64, short or
# causal sequences; on Hopper it does not use wgmma (~35% at best, FA3 paper), hence 0.17 there
_FA2_AMPERE = 0.45
_MI300X_LAT = {"launch_ns": 2_100.0, "gemm_floor_ns": 4_300.0, "gemm_k_ns": 1.4, "attention_floor_ns": 11_000.0}


def _amd(name, clock, units, **kw):
    """An AMD Instinct part: the MI300X's latency constants scaled by boost clock (2.1 GHz / clock), its
    library efficiencies (hipBLASLt, CK/Triton attention, MIOpen), PCIe 4.0 unless given."""
    lat = {k: v * 2.1 / clock for k, v in _MI300X_LAT.items()}
    return GPU(name=name, vendor="amd", clock_ghz=clock, compute_units=units, host_bw=kw.pop("host_bw", _PCIE4),
               host_link=kw.pop("host_link", "PCIe 4.0 x16"), gemm_efficiency=0.4, attention_efficiency=0.12,
               mem_efficiency=0.8, misaligned_gemm_penalty=2.0, norm_efficiency=0.25, pageable_bw=35e9,
               latency_source=f"MI300X constants scaled by boost clock (2.1 / {clock} GHz); not measured on this part",
               **lat, **kw)


BUILTIN: tuple[GPU, ...] = (
    _nvidia("H100 SXM", 1.98, flops={"fp64": 67 * _T, "fp32": 67 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T,
                                      "fp16": 989.4 * _T, "fp8": 1978.9 * _T, "int8": 1978.9 * _T},
            mem_bw=3.35e12, host_bw=_PCIE5, memory_bytes=80 * 2**30, compute_units=132, host_link="PCIe 5.0 x16",
            source="NVIDIA H100 Tensor Core GPU datasheet (SXM5 80GB), dense rates",
            latency_source=_MEASURED, **_NVL4, aliases=("h100", "h100-sxm", "h100_sxm", "h100 sxm5")),
    _nvidia("H100 PCIe", 1.755, flops={"fp64": 51 * _T, "fp32": 51 * _T, "tf32": 378 * _T, "bf16": 756 * _T,
                                        "fp16": 756 * _T, "fp8": 1513 * _T, "int8": 1513 * _T},
            mem_bw=2.0e12, host_bw=_PCIE5, memory_bytes=80 * 2**30, compute_units=114, host_link="PCIe 5.0 x16",
            source="NVIDIA H100 Tensor Core GPU datasheet (PCIe 80GB), dense rates",
            aliases=("h100-pcie", "h100_pcie")),
    _nvidia("H200", 1.98, flops={"fp64": 67 * _T, "fp32": 67 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T,
                                  "fp16": 989.4 * _T, "fp8": 1978.9 * _T, "int8": 1978.9 * _T},
            mem_bw=4.8e12, host_bw=_PCIE5, memory_bytes=141 * 10**9, compute_units=132, host_link="PCIe 5.0 x16",
            source="NVIDIA H200 Tensor Core GPU datasheet (SXM 141GB), dense rates",
            latency_source="H100 constants (same Hopper SM and clock); not measured on this part",
            **_NVL4, aliases=("h200", "h200-sxm", "h200_sxm")),
    _nvidia("GH200", 1.98, flops={"fp64": 67 * _T, "fp32": 67 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T,
                                   "fp16": 989.4 * _T, "fp8": 1978.9 * _T, "int8": 1978.9 * _T},
            mem_bw=4.0e12, host_bw=_C2C, latency_ns=2_000.0, memory_bytes=96 * 10**9, compute_units=132,
            host_link="NVLink-C2C", source="NVIDIA GH200 Grace Hopper Superchip datasheet (96GB HBM3), dense rates",
            latency_source="H100 constants (same Hopper SM and clock); not measured on this part",
            **_NVL4, aliases=("gh200",)),
    _nvidia("A100 SXM 80GB", 1.41, flops={"fp64": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T,
                                           "fp16": 312 * _T, "int8": 624 * _T},
            mem_bw=2.039e12, host_bw=_PCIE4, memory_bytes=80 * 2**30, compute_units=108, host_link="PCIe 4.0 x16",
            source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB), dense rates", attention_efficiency=_FA2_AMPERE,
            nvlink_bw=300 * _GB, network_bw=25 * _GB,
            interconnect_source="NVLink 3 600 GB/s bidirectional (datasheet) -> 300 GB/s per direction; network "
                                "estimate: one InfiniBand HDR 200 Gb/s NIC per GPU = 25 GB/s",
            aliases=("a100", "a100-sxm", "a100_80gb", "a100-80gb")),
    _nvidia("L4", 2.04, flops={"fp32": 30.3 * _T, "tf32": 60 * _T, "bf16": 121 * _T, "fp16": 121 * _T,
                                "fp8": 242.5 * _T, "int8": 242.5 * _T},
            mem_bw=300e9, host_bw=_PCIE4, memory_bytes=24 * 2**30, compute_units=58, host_link="PCIe 4.0 x16",
            source="NVIDIA L4 Tensor Core GPU datasheet, dense rates (half the with-sparsity figures)",
            attention_efficiency=_FA2_AMPERE, aliases=("l4",)),
    _nvidia("V100 SXM2 32GB", 1.53, flops={"fp64": 7.8 * _T, "fp32": 15.7 * _T, "fp16": 125 * _T},
            mem_bw=900e9, host_bw=_PCIE3, memory_bytes=32 * 2**30, compute_units=80, host_link="PCIe 3.0 x16",
            source="NVIDIA V100 Tensor Core GPU datasheet (SXM2); no bf16/tf32 tensor cores (they run at fp32)",
            attention_efficiency=0.3, nvlink_bw=150 * _GB, network_bw=12.5 * _GB,
            interconnect_source="NVLink 2 300 GB/s bidirectional (datasheet) -> 150 GB/s per direction; network "
                                "estimate: one InfiniBand EDR 100 Gb/s NIC per GPU = 12.5 GB/s",
            aliases=("v100", "v100-sxm2", "v100_32gb", "v100-dgxs", "v100 dgxs 32gb")),
    GPU(name="MI300X", vendor="amd", clock_ghz=2.1, compute_units=304, memory_bytes=192 * 2**30,
        flops={"fp64": 163.4 * _T, "fp32": 163.4 * _T, "tf32": 653.7 * _T, "bf16": 1307.4 * _T,
               "fp16": 1307.4 * _T, "fp8": 2614.9 * _T, "int8": 2614.9 * _T},
        mem_bw=5.3e12, host_bw=_PCIE5, host_link="PCIe 5.0 x16",
        # measured (MI300X TraceLens bert-small profile): smallest elementwise kernel ~2.1 us; single-wave
        # bf16 GEMMs 5.0 us at K=512 and 7.2 us at K=2048; attention (attn_fwd) 27 us at 141 tokens
        launch_ns=2_100.0, gemm_floor_ns=4_300.0, gemm_k_ns=1.4, attention_floor_ns=11_000.0,
        gemm_efficiency=0.4, attention_efficiency=0.12, mem_efficiency=0.8, misaligned_gemm_penalty=2.0,
        norm_efficiency=0.25, pageable_bw=35e9,
        source="AMD Instinct MI300X data sheet, dense matrix rates",
        latency_source="kernel durations in the public MI300X TraceLens profile (AMD-AGI/TraceLens tests/traces/mi300)",
        aliases=("mi300x", "mi300", "mi-300x")),
    _amd("MI250X (one GCD)", 1.7, 110, flops={"fp64": 47.9 * _T, "fp32": 47.9 * _T, "bf16": 191.5 * _T,
                                                "fp16": 191.5 * _T, "int8": 191.5 * _T},
         mem_bw=1.6e12, memory_bytes=64 * 2**30,
         source="AMD Instinct MI250X data sheet, per graphics compute die (PyTorch sees each of the two GCDs "
                "as one device): half the package's dense matrix rates and HBM2e bandwidth",
         aliases=("mi250x", "mi250", "mi-250x")),
    _amd("MI210", 1.7, 104, flops={"fp64": 45.3 * _T, "fp32": 45.3 * _T, "bf16": 181 * _T, "fp16": 181 * _T,
                                   "int8": 181 * _T},
         mem_bw=1.6e12, memory_bytes=64 * 2**30, source="AMD Instinct MI210 data sheet, dense matrix rates",
         aliases=("mi210", "mi-210")),
)


def _key(text: str) -> str:
    return text.strip().lower().replace("_", " ").replace("-", " ")


def save_gpu(g: GPU, path) -> Path:
    """Write `g` as JSON (``GPU.to_dict``) to `path`; returns the path. Read back with `gpu(path)`."""
    path = Path(path)
    path.write_text(json.dumps(g.to_dict(), indent=1, default=float))
    return path


def load_gpu(path) -> GPU:
    """The `GPU` saved in a JSON file (`save_gpu`, `memlens calibrate -o`). `InputError` if unreadable."""
    path = Path(path)
    raw = read_user_file(path, MAX_GPU_FILE_BYTES, "GPU file")
    try:
        d = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"cannot read a GPU from {path} ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(d, dict):
        raise InputError(f"{path}: not a GPU description (a JSON object written by memlens calibrate)")
    from memlens.devicetime.gpu_schema import check_gpu_fields
    d = check_gpu_fields(d, path)
    known = {f.name for f in fields(GPU)}
    args = {k: v for k, v in d.items() if k in known}
    for key in ("host_bw", "aliases"):
        if key in args:
            args[key] = tuple(args[key])
    if isinstance(args.get("class_scale"), dict):
        args["class_scale"] = {k: tuple(v) for k, v in args["class_scale"].items()}
    try:
        return GPU(**args)
    except TypeError as exc:
        raise InputError(f"{path}: not a GPU description ({exc})") from None


def gpu(name) -> GPU:
    """The built-in GPU called `name` (case and '-'/'_' ignored: "H100", "h100-sxm", "mi300x"), a JSON
    file written by `memlens calibrate` / `save_gpu` (a path ending in .json), or a `GPU` passed through.
    Raises `InputError` naming the known GPUs otherwise."""
    if isinstance(name, GPU):
        return name
    if isinstance(name, Path) or isinstance(name, str) and name.strip().lower().endswith(".json"):
        return load_gpu(name)
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"GPU must be a name or a memlens.GPU, not {name!r}")
    want = _key(name)
    for g in BUILTIN:
        if want == _key(g.name) or want in {_key(a) for a in g.aliases}:
            return g
    raise InputError(f"unknown GPU '{name}' (known: {', '.join(g.name for g in BUILTIN)}; or build one with "
                     "memlens.GPU(name=..., flops={...}, mem_bw=...))")


def gpus() -> pd.DataFrame:
    """The built-in GPUs, one row each: peaks (FLOP/s per dtype, dense), memory bandwidth (bytes/s), host
    link per direction (bytes/s), launch floor (ns), the other latency constants, the library efficiencies
    (fractions of a peak), the pageable copy rate (bytes/s), and the sources."""
    rows = []
    for g in BUILTIN:
        row = {"name": g.name, "vendor": g.vendor}
        for k in DTYPE_KEYS:
            row[f"{k}_flops"] = g.flops.get(k, float("nan"))
        row.update({"mem_bw": g.mem_bw, "memory_bytes": g.memory_bytes, "host_link": g.host_link,
                    "host_bw_out": g.host_bw[0], "host_bw_in": g.host_bw[1], "host_latency_ns": g.latency_ns,
                    "launch_ns": g.launch_ns, "gemm_floor_ns": g.gemm_floor_ns, "gemm_k_ns": g.gemm_k_ns,
                    "attention_floor_ns": g.attention_floor_ns, "gemm_efficiency": g.gemm_efficiency,
                    "attention_efficiency": g.attention_efficiency, "mem_efficiency": g.mem_efficiency,
                    "norm_efficiency": g.norm_efficiency, "softmax_block_efficiency": g.softmax_block_efficiency,
                    "misaligned_gemm_penalty": g.misaligned_gemm_penalty, "pageable_bw": g.pageable_bw,
                    "compute_units": g.compute_units, "nvlink_bw": g.nvlink_bw, "network_bw": g.network_bw,
                    "gpus_per_node": g.gpus_per_node, "interconnect_source": g.interconnect_source,
                    "clock_ghz": g.clock_ghz, "source": g.source, "latency_source": g.latency_source})
        rows.append(row)
    return pd.DataFrame(rows)


def with_link(g: GPU, host_bw: tuple, latency_ns: float | None = None, link: str = "custom") -> GPU:
    """`g` with another host link (e.g. the same H100 behind PCIe 4.0)."""
    return replace(g, host_bw=tuple(host_bw), latency_ns=g.latency_ns if latency_ns is None else latency_ns,
                   host_link=link)
