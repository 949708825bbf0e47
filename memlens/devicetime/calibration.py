"""`calibrate(profile_or_trace, base="H100")`: a `GPU` fitted to the kernels a real profile measured.

The built-in constants come from datasheets and a few public profiles; a user's own part, driver and
libraries differ (another cuBLAS heuristic, a slower softmax, a virtualised GPU). Calibration keeps the
model's structure and fits, per op class, two factors: one on the op's fixed part (what the latency
constants contribute: kernel floors, GEMM prologues, K-loop latency) and one on its throughput part
(everything else), so that a profile of small kernels mostly moves the floors and a profile of large
ones mostly the rates. Fit: least squares of each op's relative error, weighted by its share of the
class's measured time, with a weak pull towards (1, 1) so that a factor the profile cannot see (all ops
of the class latency bound, say) stays at the built-in value. Classes without measured ops keep (1, 1).
The fit's residuals per class go into ``GPU.calibration``.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.clock import op_parents
from memlens.devicetime.costmodel import device_times, op_facts, split_parts
from memlens.devicetime.gpus import GPU, gpu as resolve_gpu
from memlens.errors import InputError

RIDGE = 0.01            # pull of each factor towards 1 (in units of squared relative error)
FACTOR_RANGE = (0.1, 10.0)
MIN_OPS = 3             # a class is fitted on at least this many measured ops (2 factors need more than 2)
BLENDS = np.linspace(1.0, 0.0, 21)
_MEASURED = ("measured_ns", "kernel_busy_ns")


def _measured_ops(profile_or_trace) -> tuple[pd.DataFrame, str, str]:
    """(ops with cost facts and measured_ns, a label for the source, the column measured_ns came from)."""
    if isinstance(profile_or_trace, pd.DataFrame):
        ops, label = profile_or_trace, "ops table"
    else:
        trace = profile_or_trace
        label = "trace"
        if isinstance(profile_or_trace, (str, Path)):
            from memlens.io import load     # io sits below devicetime's callers; imported late (cheap start)
            label = Path(profile_or_trace).name
            trace = load(profile_or_trace)
        ops = getattr(trace, "ops", None)
        if ops is None:
            raise InputError(f"calibrate needs a profile path, a memlens.Trace or an ops table, not "
                             f"{type(profile_or_trace).__name__}")
    column = next((c for c in _MEASURED if c in ops.columns), None)
    if column is None or not (pd.to_numeric(ops[column], errors="coerce").fillna(0) > 0).any():
        raise InputError(f"{label}: no measured kernel times per op (a CUDA/ROCm profile with kernel activity "
                         "is needed: torch.profiler with CUDA activities, or memlens.record on CUDA)")
    if not any(c in ops.columns and (ops[c] > 0).any() for c in ("flops", "bytes_read", "bytes_written")):
        raise InputError(f"{label}: the ops carry no cost facts (shapes), so the model cannot be fitted to them")
    return ops.assign(measured_ns=pd.to_numeric(ops[column], errors="coerce").fillna(0.0)), label, column


def _parts(ops: pd.DataFrame, g: GPU, tf32) -> tuple[np.ndarray, np.ndarray]:
    """(fixed ns, throughput ns) per op on uncalibrated `g`, computed once per distinct signature."""
    facts = op_facts(ops).drop(columns=["device", "collective", "collective_bytes", "group_size"])
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(facts))
    pairs = np.array([split_parts(g, n, int(f), int(r), int(w), d, s, tf32=tf32, causal=bool(c), transfer=t,
                                  strided=bool(st))
                      for n, f, r, w, d, s, c, t, st in uniques], dtype="float64").reshape(-1, 2)
    return pairs[codes, 0], pairs[codes, 1]


def fit_factors(fixed: np.ndarray, work: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """(a, b) minimising ``sum s_i ((a fixed_i + b work_i) / m_i - 1)^2 + RIDGE ((a-1)^2 + (b-1)^2)`` with
    s_i = m_i / sum(m) (each op's relative error weighted by its share of the measured time), clipped to
    `FACTOR_RANGE`."""
    m = np.asarray(measured, dtype="float64")
    s = m / m.sum()
    f, u = np.asarray(fixed, dtype="float64") / m, np.asarray(work, dtype="float64") / m
    A = np.array([[np.sum(s * f * f) + RIDGE, np.sum(s * f * u)],
                  [np.sum(s * f * u), np.sum(s * u * u) + RIDGE]])
    rhs = np.array([np.sum(s * f) + RIDGE, np.sum(s * u) + RIDGE])
    a, b = np.linalg.solve(A, rhs)
    lo, hi = FACTOR_RANGE
    return float(np.clip(a, lo, hi)), float(np.clip(b, lo, hi))


def _measured_total(ops: pd.DataFrame, measured: np.ndarray, column: str) -> float:
    """The profile's measured device time: its top-level ops' inclusive kernel time when `measured` is
    ``kernel_busy_ns`` (an op's and its nested ops' kernels), else the sum of the ops' own times."""
    if column == "kernel_busy_ns":
        return float(measured[op_parents(ops) < 0].sum())
    return float(measured.sum())


def _blend(fitted: dict, cls_of: np.ndarray, fixed: np.ndarray, work: np.ndarray, model_ns: np.ndarray,
           measured_total: float) -> float:
    """The largest of `BLENDS` for which the factors ``f ** blend`` keep the profile's modeled total (every
    op the model prices) no further from `measured_total` than the built-in model's."""
    priced = model_ns > 0
    built_in = abs(model_ns[priced].sum() - measured_total)
    for blend in BLENDS:
        total = 0.0
        for cls in set(cls_of[priced]):
            sel = priced & (cls_of == cls)
            if cls in fitted:
                a, b = fitted[cls]
                total += a ** blend * fixed[sel].sum() + b ** blend * work[sel].sum()
            else:           # kept at the built-in price (communication: the link model's)
                total += model_ns[sel].sum()
        if abs(total - measured_total) <= built_in * (1 + 1e-9):
            return float(blend)
    return 0.0


def calibrate(profile_or_trace, base="H100", *, tf32=None) -> GPU:
    """A `GPU` like `base` whose per-class constants are fitted to the measured kernels of a profile.

    `profile_or_trace`: a profile path (anything `memlens.load` reads that keeps op shapes and kernel
    times), a `memlens.Trace` whose ops carry cost facts and ``kernel_busy_ns`` (recorded on CUDA), or an
    ops table with the cost facts and ``measured_ns`` (device ns of each op's own kernels). Ops that
    launched nothing, or that the model prices at 0, are left out of the fit. Returns `base` with
    ``class_scale`` = {class: (fixed factor, throughput factor)} and ``calibration`` = {"base", "source",
    "classes": {class: {ops, measured_ns, modeled_ns, calibrated_ns, ratio_before, ratio_after,
    median_abs_log_error, fixed_factor, throughput_factor, fitted (False: too few ops, kept at 1)}},
    "total_ratio_before", "total_ratio_after", "blend" (module docstring)} (ratios are modeled / measured).
    `tf32`: as in `memlens.retime` (None: PyTorch's defaults for the base GPU's vendor). Raises `InputError`
    without kernel times or cost facts.
    """
    g = resolve_gpu(base)
    g = replace(g, class_scale={}, calibration={})
    ops, label, column = _measured_ops(profile_or_trace)
    if "device" in ops.columns:
        ops = ops[~ops["device"].astype(str).str.lower().str.startswith("cpu")]
    modeled = device_times(ops, g, tf32=tf32)
    fixed, work = _parts(ops, g, tf32)
    measured = ops["measured_ns"].to_numpy(dtype="float64")
    model_ns = modeled["device_ns"].to_numpy(dtype="float64")
    cls_of = modeled["op_class"].to_numpy()
    # communication is priced by the link model, not the per-class constants: never fitted
    use = (measured > 0) & (model_ns > 0) & (cls_of != "communication")
    classes, fitted = {}, {}
    for cls in sorted(set(cls_of[use])):
        sel = use & (cls_of == cls)
        if sel.sum() < MIN_OPS:
            continue
        a, b = fit_factors(fixed[sel], work[sel], measured[sel])
        m_total, before = measured[sel].sum(), model_ns[sel].sum()
        if abs(a * fixed[sel].sum() + b * work[sel].sum() - m_total) > abs(before - m_total):
            a = b = float(np.clip(m_total / before, *FACTOR_RANGE))    # the fit lost the class total
        fitted[cls] = (a, b)
    blend = _blend(fitted, cls_of, fixed, work, model_ns, _measured_total(ops, measured, column))
    scale = {cls: (a ** blend, b ** blend) for cls, (a, b) in fitted.items()}
    for cls in sorted(set(cls_of[use])):
        sel = use & (cls_of == cls)
        a, b = scale.get(cls, (1.0, 1.0))
        after = a * fixed[sel] + b * work[sel]
        classes[cls] = {"ops": int(sel.sum()), "measured_ns": float(measured[sel].sum()),
                        "modeled_ns": float(model_ns[sel].sum()), "calibrated_ns": float(after.sum()),
                        "ratio_before": float(model_ns[sel].sum() / measured[sel].sum()),
                        "ratio_after": float(after.sum() / measured[sel].sum()),
                        "median_abs_log_error": float(np.median(np.abs(np.log(np.maximum(after, 1.0)
                                                                              / measured[sel])))),
                        "fixed_factor": a, "throughput_factor": b, "fitted": cls in scale}
    if not classes:
        raise InputError(f"{label}: no op has both a measured and a modeled device time")
    total_m = sum(c["measured_ns"] for c in classes.values())
    info = {"base": g.name, "source": label, "classes": classes,
            "total_ratio_before": sum(c["modeled_ns"] for c in classes.values()) / total_m,
            "total_ratio_after": sum(c["calibrated_ns"] for c in classes.values()) / total_m, "blend": blend}
    if not math.isfinite(info["total_ratio_after"]):
        raise InputError(f"{label}: the fit did not converge")
    return replace(g, name=f"{g.name} calibrated on {label}", class_scale=scale, calibration=info,
                   source=f"{g.source}; per-class factors fitted to {label}", aliases=())
