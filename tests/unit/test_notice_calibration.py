"""Calibration values per class, against an independent least-squares solve, and ops the model prices at 0.

Two classes measured off the model in opposite directions (elementwise 2x slower, GEMMs 2x faster) and one
view with a measured time that the model prices at 0. The factors are recomputed here as an ordinary
least-squares problem on stacked rows (each op's relative error weighted by its share of its class's
measured time, plus two ridge rows pulling towards (1, 1)), not through the module's normal equations.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memlens.devicetime import costmodel as cm
from memlens.devicetime.calibration import RIDGE, calibrate
from test_calibration_never_hurts import TOY, _adds, _mms, _parts


def _factors(fixed, work, measured) -> tuple[float, float]:
    """argmin_{a,b} sum s_i ((a f_i + b u_i)/m_i - 1)^2 + RIDGE ((a-1)^2 + (b-1)^2), s_i = m_i / sum m."""
    s = measured / measured.sum()
    rows = np.column_stack([np.sqrt(s) * fixed / measured, np.sqrt(s) * work / measured])
    rows = np.vstack([rows, np.sqrt(RIDGE) * np.eye(2)])
    target = np.concatenate([np.sqrt(s), np.sqrt(RIDGE) * np.ones(2)])
    (a, b), *_ = np.linalg.lstsq(rows, target, rcond=None)
    return float(a), float(b)


def _profile():
    adds, mms = _adds([1000, 100_000, 1_000_000, 4_000_000]), _mms([256, 512, 1024, 2048])
    view = pd.DataFrame({"name": ["aten::view"], "flops": [0], "bytes_read": [0], "bytes_written": [0],
                         "dtype": "bfloat16", "shapes": ["bf16[10]->bf16[10]"]})
    ops = pd.concat([adds, mms, view], ignore_index=True)
    modeled = cm.device_times(ops, TOY)["device_ns"].to_numpy(dtype="float64")
    times = np.array([2.0] * 4 + [0.5] * 4 + [0.0])
    measured = modeled * times
    measured[-1] = 50_000.0   # the view: measured, priced at 0 by the model
    assert modeled[-1] == 0
    return ops.assign(measured_ns=measured), modeled


def test_each_class_gets_its_own_factors_and_ratios():
    """Mutants killed: the per-class report selecting every fitted op (``sel = use``) instead of its class's;
    the fixed and throughput factors swapped; ``ratio_before`` / ``ratio_after`` computed from another
    class's or the total's sums."""
    ops, modeled = _profile()
    g = calibrate(ops, base=TOY)
    assert g.calibration["blend"] == 1.0   # the fitted totals are far closer than the built-in ones
    m = ops["measured_ns"].to_numpy(dtype="float64")
    fixed, work = _parts(ops)
    for cls, rows, ratio in (("elementwise", slice(0, 4), 0.5), ("gemm", slice(4, 8), 2.0)):
        a, b = _factors(fixed[rows], work[rows], m[rows])
        info = g.calibration["classes"][cls]
        assert g.class_scale[cls] == (pytest.approx(a, rel=1e-9), pytest.approx(b, rel=1e-9))
        assert (info["fixed_factor"], info["throughput_factor"]) == (pytest.approx(a, rel=1e-9),
                                                                     pytest.approx(b, rel=1e-9))
        assert info["ops"] == 4 and info["fitted"]
        assert info["measured_ns"] == pytest.approx(m[rows].sum(), rel=1e-12)
        assert info["modeled_ns"] == pytest.approx(modeled[rows].sum(), rel=1e-12)
        assert info["ratio_before"] == pytest.approx(ratio, rel=1e-12)
        after = a * fixed[rows] + b * work[rows]
        assert info["calibrated_ns"] == pytest.approx(after.sum(), rel=1e-9)
        assert info["ratio_after"] == pytest.approx(after.sum() / m[rows].sum(), rel=1e-9)
    # the opposite directions survive: elementwise scaled up, GEMMs down (the ridge keeps both short of 2, 1/2)
    assert min(g.class_scale["elementwise"]) > 1 and max(g.class_scale["gemm"]) < 1
    priced = slice(0, 8)
    assert g.calibration["total_ratio_before"] == pytest.approx(modeled[priced].sum() / m[priced].sum(), rel=1e-12)


def test_an_op_the_model_prices_at_0_is_left_out_of_the_fit():
    """The view's 50 us are measured but unpriced: it joins no class, and the factors are those fitted
    without it. Mutant killed: ``use`` without ``model_ns > 0`` (a "none" class appears, and a class's
    weights would count an op whose relative error is always -1)."""
    ops, _ = _profile()
    g = calibrate(ops, base=TOY)
    without = calibrate(ops.iloc[:8], base=TOY)
    assert set(g.calibration["classes"]) == {"elementwise", "gemm"}
    assert g.class_scale == without.class_scale
    for cls in ("elementwise", "gemm"):
        assert g.calibration["classes"][cls] == without.calibration["classes"][cls]
