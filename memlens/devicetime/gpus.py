"""Finding a GPU: by name or alias in the one GPU table (`memlens.devicetime.gpu_table`), from a JSON file
(`memlens calibrate -o`, `save_gpu`), or as a `GPU` passed through; `gpus()` lists the table."""
from __future__ import annotations

import json
import re
from dataclasses import fields, replace
from pathlib import Path

import pandas as pd

from memlens.devicetime.gpu import DTYPE_KEYS, DTYPE_TO_KEY, GPU
from memlens.devicetime.gpu_table import BUILTIN, DATASHEETS
from memlens.errors import InputError, read_user_file

MAX_GPU_FILE_BYTES = 1 << 20  # a GPU description is a few kB; calibration residuals add tens

__all__ = ["BUILTIN", "DTYPE_KEYS", "DTYPE_TO_KEY", "GPU", "gpu", "gpu_of_device", "gpus", "load_gpu", "save_gpu", "with_link"]


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
    if isinstance(args.get("capability"), list):
        args["capability"] = tuple(args["capability"])
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


def gpu_of_device(device_name: str) -> GPU | None:
    """The built-in GPU a profile's device name stands for ("NVIDIA H100 80GB HBM3" -> H100 SXM, "AMD
    Instinct MI300X VF" -> MI300X): a table name or alias, the exact name torch reports, or the one GPU
    whose name or alias is a word of the device name. None when no GPU, or more than one, fits."""
    if not isinstance(device_name, str) or not device_name.strip():
        return None
    want = _key(device_name)
    for g in BUILTIN:
        if want in {_key(g.name), _key(g.device_name)} | {_key(a) for a in g.aliases}:
            return g
    words = {_key(w) for w in re.split(r"[\s\-_/]+", device_name) if w}
    hits = [g for g in BUILTIN if words & ({_key(g.name)} | {_key(a) for a in g.aliases})]
    return hits[0] if len(hits) == 1 else None


def gpus() -> pd.DataFrame:
    """The built-in GPUs, one row each: peaks (FLOP/s per dtype, dense), memory bandwidth (bytes/s), host
    link per direction (bytes/s), launch floor (ns), the other latency constants, the library efficiencies
    (fractions of a peak), the pageable copy rate (bytes/s), what prediction needs (the name torch reports,
    compute capability "9.0", threads per SM, CUDA context bytes), and the sources (the document and its figures,
    the datasheet's address)."""
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
                    "clock_ghz": g.clock_ghz, "device_name": g.device_name,
                    "capability": None if g.capability is None else ".".join(map(str, g.capability)),
                    "max_threads_per_sm": g.max_threads_per_sm, "cuda_context": g.cuda_context,
                    "source": g.source, "datasheet": DATASHEETS.get(g.name, ""), "latency_source": g.latency_source})
        rows.append(row)
    return pd.DataFrame(rows)


def with_link(g: GPU, host_bw: tuple, latency_ns: float | None = None, link: str = "custom") -> GPU:
    """`g` with another host link (e.g. the same H100 behind PCIe 4.0)."""
    return replace(g, host_bw=tuple(host_bw), latency_ns=g.latency_ns if latency_ns is None else latency_ns,
                   host_link=link)
