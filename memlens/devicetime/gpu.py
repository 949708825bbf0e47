"""One GPU, as memlens models it: the record type of the one GPU table (`memlens.devicetime.gpu_table`).

A `GPU` holds what both the device-time model and prediction need of a part: datasheet peaks, memory
bandwidth and size, host and GPU-to-GPU links, the cost model's latency constants and library
efficiencies, and the facts fake CUDA tensors cannot see (the name torch reports, compute capability,
threads per SM, the CUDA context's reservation). Custom parts are built with `GPU(...)` or loaded from a
JSON file (`memlens.devicetime.gpus.load_gpu`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from memlens.errors import InputError

DTYPE_KEYS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")

# canonical torch dtype name -> the peak it runs at (fp32 matmuls run at "tf32" only when allowed)
DTYPE_TO_KEY = {
    "float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8",
    "int8": "int8", "uint8": "int8", "complex64": "fp32", "complex128": "fp64",
}

_T = 1e12
_GB = 1e9


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
    # what prediction on fake CUDA tensors needs of the part (memlens.prediction.gpus): the name torch reports,
    # the CUDA compute capability (None: not a CUDA part, not predicted), threads per SM (reduction kernels
    # size their grid with it) and the driver's context reservation outside the caching allocator, bytes
    device_name: str = ""
    capability: tuple | None = None
    max_threads_per_sm: int = 2048
    cuda_context: int = 0
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
        if self.capability is not None:
            cap = tuple(self.capability)
            if len(cap) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100 for v in cap):
                raise InputError(f"GPU {self.name!r}: capability must be (major, minor) integers, not {self.capability!r}")
            object.__setattr__(self, "capability", cap)
        if not self.max_threads_per_sm > 0 or not self.cuda_context >= 0:
            raise InputError(f"GPU {self.name!r}: max_threads_per_sm must be > 0 and cuda_context >= 0 bytes")
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
        d["capability"] = None if self.capability is None else list(self.capability)
        d["class_scale"] = {k: list(v) for k, v in self.class_scale.items()}
        return d
