"""The schema of a GPU file (``--gpu mygpu.json``, written by `memlens calibrate -o` / `save_gpu`): each field's
type and plausible range, checked before the numbers reach the cost model.

A GPU file may come from anyone, and the cost model divides by its rates and multiplies by its scales: an
infinite latency, a bandwidth of ``true``, a scale of 1e308 or a node of 0 GPUs would print nonsense or
crash. Every number must be a real JSON number (not a boolean), finite, and inside the range below; the
bounds are far beyond any real part (a rate of 10**18 FLOP/s is a thousand times the fastest GPU) so that
they only catch broken files.
"""
from __future__ import annotations

import math

from memlens.errors import InputError

_RATE = 1e18          # FLOP/s or bytes/s
_TIME_NS = 1e12       # 1000 s: no fixed kernel or transfer cost is longer
_SCALE = 1e6          # a fitted scale of the built-in model
_TEXT = 1000          # characters of a name or source note

# field -> (kind, low, high, low included)
NUMBERS = {
    "mem_bw": ("float", 0, _RATE, False), "pageable_bw": ("float", 0, _RATE, False),
    "nvlink_bw": ("float", 0, _RATE, True), "network_bw": ("float", 0, _RATE, True),
    "latency_ns": ("float", 0, _TIME_NS, True), "launch_ns": ("float", 0, _TIME_NS, True),
    "gemm_floor_ns": ("float", 0, _TIME_NS, True), "attention_floor_ns": ("float", 0, _TIME_NS, True),
    "gemm_k_ns": ("float", 0, _TIME_NS, True), "clock_ghz": ("float", 0, 100, False),
    "gemm_efficiency": ("float", 0, 1, False), "attention_efficiency": ("float", 0, 1, False),
    "mem_efficiency": ("float", 0, 1, False), "norm_efficiency": ("float", 0, 1, False),
    "softmax_block_efficiency": ("float", 0, 1, False), "misaligned_gemm_penalty": ("float", 1, 1000, True),
    "memory_bytes": ("int", 0, 1 << 56, True), "compute_units": ("int", 1, 1 << 20, True),
    "gpus_per_node": ("int", 1, 1 << 16, True), "max_threads_per_sm": ("int", 1, 1 << 16, True),
    "cuda_context": ("int", 0, 1 << 50, True),
}
TEXTS = ("name", "host_link", "vendor", "interconnect_source", "source", "latency_source", "device_name")


def _plain(x) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _number(value, where: str, kind: str, low: float, high: float, low_ok: bool, path) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where} must be a number, not {type(value).__name__} ({str(value)[:40]!r})", path)
    if kind == "int" and not (isinstance(value, int) or float(value).is_integer()):
        raise InputError(f"{where} must be a whole number, got {value!r}", path)
    try:
        as_float = float(value)
    except OverflowError:
        as_float = math.inf
    if not math.isfinite(as_float):
        raise InputError(f"{where} must be finite, got {'a number with ' + str(len(str(value))) + ' digits' if isinstance(value, int) else value}", path)
    if not ((low <= as_float) if low_ok else (low < as_float)) or as_float > high:
        bound = f"{'>=' if low_ok else '>'} {_plain(low)} and <= {_plain(high)}"
        raise InputError(f"{where} must be {bound}, got {value!r}", path)
    return int(value) if kind == "int" else as_float


def check_gpu_fields(d: dict, path) -> dict:
    """The GPU file's fields (`d`, its JSON object) with every known field checked against the schema, numbers
    as float / int; `InputError` naming `path` and the first bad field otherwise."""
    out = dict(d)
    for name in TEXTS:
        if name in d and (not isinstance(d[name], str) or len(d[name]) > _TEXT):
            raise InputError(f"{name} must be a string of at most {_TEXT} characters", path)
    if "name" not in d:
        raise InputError("no name: a GPU file names its GPU", path)
    for name, (kind, low, high, low_ok) in NUMBERS.items():
        if name in d:
            out[name] = _number(d[name], name, kind, low, high, low_ok, path)
    flops = d.get("flops")
    if not isinstance(flops, dict) or not flops:
        raise InputError("flops must be an object {dtype: FLOP/s}", path)
    out["flops"] = {str(k): _number(v, f"flops[{str(k)[:20]!r}]", "float", 0, _RATE, False, path)
                    for k, v in flops.items()}
    if "host_bw" in d:
        pair = d["host_bw"]
        if not isinstance(pair, list) or len(pair) != 2:
            raise InputError("host_bw must be [device->host, host->device] bytes/s", path)
        out["host_bw"] = [_number(v, f"host_bw[{i}]", "float", 0, _RATE, False, path) for i, v in enumerate(pair)]
    if "aliases" in d and (not isinstance(d["aliases"], list) or
                           not all(isinstance(a, str) and len(a) <= _TEXT for a in d["aliases"])):
        raise InputError("aliases must be a list of strings", path)
    scales = d.get("class_scale", {})
    if not isinstance(scales, dict):
        raise InputError("class_scale must be an object {op class: [fixed scale, throughput scale]}", path)
    for cls, pair in scales.items():
        where = f"class_scale[{str(cls)[:40]!r}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise InputError(f"{where} must be [fixed scale, throughput scale]", path)
        for i, v in enumerate(pair):
            _number(v, f"{where}[{i}]", "float", 0, _SCALE, True, path)
    cap = d.get("capability")
    if cap is not None and (not isinstance(cap, list) or len(cap) != 2 or
                            any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 100 for v in cap)):
        raise InputError("capability must be [major, minor] whole numbers (the CUDA compute capability) or null", path)
    if "calibration" in d and not isinstance(d["calibration"], dict):
        raise InputError("calibration must be an object", path)
    return out
