"""What a profile's header says about the PyTorch run's numeric settings (TF32 switches, torch version).

Kineto writes no such field itself; tools that wrap the profiler add their own header keys (run metadata with
the installed packages, the experiment's settings). Any key, at any depth up to `MAX_DEPTH`, named like one of
PyTorch's switches is taken: ``allow_tf32`` under a ``cudnn`` key or named ``cudnn_allow_tf32`` is the
convolution switch, otherwise the matmul one; ``float32_matmul_precision`` ``"highest"`` means matmul TF32
off, ``"high"`` / ``"medium"`` on; the PyTorch version from a ``torch_version`` key or a ``torch==X`` entry
of a package list.

The kernels say it too (`kernel_tf32_evidence`): an fp32 product that ran on Tensor Cores has ``tf32`` in its
kernel's name (``sm80_xmma_gemm_f32f32_tf32f32_*``, cuDNN's ``*tf32*`` convolutions) or is a 16x8x8 MMA kernel
on fp32 data (``cutlass_80_tensorop_s1688gemm_*`` without a 16-bit type in the name); one on CUDA cores is an
``sgemm`` / ``scudnn`` kernel. One TF32 kernel proves a switch on; CUDA-core fp32 kernels and no TF32 one say it
was off.
"""
from __future__ import annotations

import re

MAX_DEPTH = 6
MAX_NODES = 20_000          # a header with the installed packages has a few thousand entries
_TORCH_PIN = re.compile(r"^torch==(\d+\.\d+[^\s;]*)$")


def _truth(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return None


def header_torch_settings(header: dict) -> dict:
    """``{"matmul_allow_tf32": bool, "cudnn_allow_tf32": bool, "float32_matmul_precision": str,
    "torch_version": str}`` with the ones the profile's header (its top-level keys other than
    ``traceEvents``) names; {} when none."""
    out: dict = {}
    stack = [((), v, k) for k, v in header.items() if k != "traceEvents"] if isinstance(header, dict) else []
    seen = 0
    while stack and seen < MAX_NODES:
        path, value, key = stack.pop()
        seen += 1
        name = str(key).lower()
        where = [str(p).lower() for p in path] + [name]
        if "allow_tf32" in name and _truth(value) is not None:
            conv = "cudnn" in name or any("cudnn" in p or "conv" in p for p in where[:-1])
            out.setdefault("cudnn_allow_tf32" if conv else "matmul_allow_tf32", _truth(value))
        elif name == "float32_matmul_precision" and isinstance(value, str):
            out.setdefault("float32_matmul_precision", value)
            out.setdefault("matmul_allow_tf32", value.strip().lower() != "highest")
        elif name in ("torch_version", "pytorch_version") and isinstance(value, str):
            out.setdefault("torch_version", value)
        elif isinstance(value, str):
            pin = _TORCH_PIN.match(value.strip())
            if pin:
                out.setdefault("torch_version", pin.group(1))
        if len(path) < MAX_DEPTH:
            if isinstance(value, dict):
                stack.extend((path + (key,), v, k) for k, v in value.items())
            elif isinstance(value, list):
                stack.extend((path + (key,), v, key) for v in value)
    return out


_CONV_MARKS = ("conv", "fprop", "dgrad", "wgrad", "winograd")
_HALF_MARKS = ("f16", "bf16", "i8", "fp8", "e4m3", "e5m2")


def kernel_tf32_evidence(name: str):
    """("matmul" or "conv", True: it ran fp32 on Tensor Cores / False: fp32 on CUDA cores) for a GPU kernel's
    name, None when the name says neither."""
    n = str(name).lower()
    conv = any(m in n for m in _CONV_MARKS) or "scudnn" in n
    if not conv and "gemm" not in n:
        return None
    if "tf32" in n or ("s1688" in n and not any(m in n for m in _HALF_MARKS)):
        return ("conv" if conv else "matmul", True)
    if "sgemm" in n or "scudnn" in n:
        return ("conv" if conv else "matmul", False)
    return None


def merge_kernel_evidence(settings: dict, evidence: dict) -> dict:
    """`settings` (from the header) with ``matmul_allow_tf32`` / ``cudnn_allow_tf32`` filled in from the
    kernels' `evidence` ({"matmul": bool, "conv": bool}) where the header did not say; ``tf32_from`` names
    the source of each."""
    out = dict(settings)
    for key, switch in (("matmul", "matmul_allow_tf32"), ("conv", "cudnn_allow_tf32")):
        if switch not in out and key in evidence:
            out[switch] = bool(evidence[key])
            out.setdefault("tf32_from", {})[key] = "kernel names"
    return out
