"""Which fp32 products run at the TF32 tensor-core rate on the modeled clock, and why we think so.

PyTorch has two switches: ``torch.backends.cuda.matmul.allow_tf32`` (cuBLAS matmuls; off by default since
PyTorch 1.12, on in 1.7-1.11) and ``torch.backends.cudnn.allow_tf32`` (cuDNN convolutions; on by default).
On ROCm neither applies by default: hipBLASLt's TF32 path needs ``HIPBLASLT_ALLOW_TF32=1`` (MI300 and later)
and MIOpen does not read the cuDNN switch. A trace that says what the run had (a memlens recording keeps both
switches in ``metadata["torch_settings"]``; an imported profile keeps the ones its header names) is
believed; otherwise the defaults of the trace's PyTorch version (or of a current one) are assumed, and the
assumption is said in the clock (``metadata["clock"]["tf32"]``). An explicit ``tf32=`` argument overrides
both.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from memlens.errors import InputError

# PyTorch >= 1.12 defaults; 1.7-1.11 also ran fp32 matmuls in TF32 (the release notes of 1.12 turned it off)
TORCH_DEFAULTS = {"matmul": False, "conv": True}
_OLD_DEFAULT_MATMUL = ((1, 7), (1, 12))     # [from, to) versions whose matmul default was TF32 on


def _version(text) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", str(text or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def flags(tf32) -> tuple[bool, bool]:
    """(matmul, conv) TF32 flags of a `tf32` argument: a bool sets both; a mapping (a clock's ``tf32``
    dict, or ``{"matmul": ..., "conv": ...}``) gives each (missing keys: PyTorch's defaults); None: the
    defaults."""
    if tf32 is None:
        return TORCH_DEFAULTS["matmul"], TORCH_DEFAULTS["conv"]
    if isinstance(tf32, Mapping):
        return bool(tf32.get("matmul", TORCH_DEFAULTS["matmul"])), bool(tf32.get("conv", TORCH_DEFAULTS["conv"]))
    if isinstance(tf32, bool):
        return tf32, tf32
    raise InputError(f"tf32 must be True, False, None or {{'matmul': bool, 'conv': bool}}, not {tf32!r}")


def tf32_setting(tf32, metadata: Mapping | None, vendor: str = "nvidia") -> dict:
    """The clock's ``tf32`` entry: ``{"matmul": bool, "conv": bool, "source": str}`` for a run whose
    trace `metadata` is given, under the user's `tf32` argument (None: not given).

    Order: the argument; the trace's own switches (``metadata["torch_settings"]``: ``matmul_allow_tf32``,
    ``cudnn_allow_tf32``, with ``tf32_from`` naming a source other than the recording, e.g. an imported
    profile's kernel names); else the defaults of the trace's PyTorch (``torch_version``) on NVIDIA parts. On
    AMD parts no TF32 unless the argument says so (ROCm's defaults; the environment variable that turns it
    on is in no trace). `source` says which, in words."""
    if tf32 is not None:
        matmul, conv = flags(tf32)
        return {"matmul": matmul, "conv": conv, "source": "given: tf32 argument"}
    meta = metadata if isinstance(metadata, Mapping) else {}
    said = meta.get("torch_settings") if isinstance(meta.get("torch_settings"), Mapping) else {}
    version = said.get("torch_version") or meta.get("torch_version")
    if vendor == "amd":     # the switches alone do not turn TF32 on there: the environment decides
        said, default_matmul, default_conv = {}, False, False
        why = "ROCm defaults (hipBLASLt TF32 needs HIPBLASLT_ALLOW_TF32=1; MIOpen ignores cudnn.allow_tf32)"
    else:
        v = _version(version)
        old = v is not None and _OLD_DEFAULT_MATMUL[0] <= v < _OLD_DEFAULT_MATMUL[1]
        default_matmul, default_conv = (True if old else TORCH_DEFAULTS["matmul"]), TORCH_DEFAULTS["conv"]
        why = f"PyTorch {version} defaults" if v else "PyTorch >= 1.12 defaults"
    out, from_trace = {}, []
    via = said.get("tf32_from") if isinstance(said.get("tf32_from"), Mapping) else {}
    for key, switch, default in (("matmul", "matmul_allow_tf32", default_matmul),
                                 ("conv", "cudnn_allow_tf32", default_conv)):
        told = isinstance(said.get(switch), bool)
        out[key] = said[switch] if told else default
        if told:
            from_trace.append(f"{key} from the trace's {via[key]}" if key in via else key)
    if len(from_trace) == 2 and not via:
        out["source"] = "from the trace"
    elif len(from_trace) == 2:
        out["source"] = "; ".join(p if " from " in p else f"{p} from the trace" for p in from_trace)
    elif from_trace:
        part = from_trace[0] if " from " in from_trace[0] else f"{from_trace[0]} from the trace"
        out["source"] = f"{part}; the other assumed: {why}"
    else:
        out["source"] = f"assumed: {why}"
    return out
