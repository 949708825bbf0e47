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


def test_the_median_log_error_per_class_by_hand():
    """Each class's ``median_abs_log_error`` is the median over its ops of |log(calibrated / measured)|, from
    the factors solved here. Mutant killed: the key renamed (the report would lose it)."""
    ops, _ = _profile()
    g = calibrate(ops, base=TOY)
    m = ops["measured_ns"].to_numpy(dtype="float64")
    fixed, work = _parts(ops)
    for cls, rows in (("elementwise", slice(0, 4)), ("gemm", slice(4, 8))):
        a, b = _factors(fixed[rows], work[rows], m[rows])
        after = np.maximum(a * fixed[rows] + b * work[rows], 1.0)
        expected = float(np.median(np.abs(np.log(after / m[rows]))))
        assert g.calibration["classes"][cls]["median_abs_log_error"] == pytest.approx(expected, rel=1e-6)


def test_an_op_that_launched_nothing_is_left_out_of_the_fit():
    """A fifth add priced by the model but measured at 0 ns (it launched no kernel): the elementwise class
    still counts 4 ops and gets the factors fitted without it. Mutant killed: ``measured >= 0`` (its
    relative error divides by 0)."""
    ops, _ = _profile()
    idle = _adds([2_000_000]).assign(measured_ns=0.0)
    g = calibrate(pd.concat([ops, idle], ignore_index=True), base=TOY)
    without = calibrate(ops, base=TOY)
    assert g.calibration["classes"]["elementwise"]["ops"] == 4
    assert g.class_scale == without.class_scale


def test_a_trace_its_file_and_a_wrong_type(tmp_path):
    """The same ops as a memlens Trace (measured in ``kernel_busy_ns``, ops one after another) fit as the
    table does; saved without kernel times, the refusal names the file; an int is refused by its type.
    Mutants killed: the ops read from another attribute of the trace; the file's name dropped from the
    message; the type named from None."""
    from memlens.errors import InputError
    from memlens.trace import Trace
    from memlens.trace.tracedir import save_trace
    ops, _ = _profile()
    n = len(ops)
    timed = ops.assign(op_id=np.arange(n), start_ns=np.arange(n) * 10_000_000, end_ns=np.arange(n) * 10_000_000 + 1)
    timed = timed.rename(columns={"measured_ns": "kernel_busy_ns"})
    blocks = pd.DataFrame({"block_id": [1], "device": ["cuda:0"], "size": [64], "alloc_ns": [0], "free_ns": [1]})
    acc = pd.DataFrame({"block_id": [1], "t_ns": [0], "op_id": [0], "is_write": [False]})
    trace = Trace.from_tables(blocks, acc, timed)
    assert calibrate(trace, base=TOY).class_scale == calibrate(ops, base=TOY).class_scale
    path = save_trace(Trace.from_tables(blocks, acc, timed.drop(columns=["kernel_busy_ns"])),
                      tmp_path / "no_kernels.memlens")
    with pytest.raises(InputError) as err:
        calibrate(path, base=TOY)
    assert str(err.value).startswith("no_kernels.memlens: no measured kernel times per op")
    with pytest.raises(InputError) as err:
        calibrate(42, base=TOY)
    assert str(err.value).endswith("a memlens.Trace or an ops table, not int")


def test_cost_facts_of_one_byte_are_facts():
    """Ops whose only cost fact is 1 byte read are still priced (at the launch floor) and fitted: the check
    for cost facts is ``> 0``. Mutant killed: ``> 1`` (refused as carrying no cost facts)."""
    ops = pd.DataFrame({"name": "aten::add", "flops": 0, "bytes_read": [1, 1, 1], "bytes_written": 0,
                        "dtype": "bfloat16", "shapes": ["bf16[1]->bf16[1]"] * 3, "measured_ns": [3000.0, 2000.0, 2500.0]})
    g = calibrate(ops, base=TOY)
    assert sum(c["ops"] for c in g.calibration["classes"].values()) == 3


def test_collectives_keep_the_link_models_price():
    """Three all-reduces of 1 MB over 8 ranks measured at twice their modeled time: communication is priced
    by the link model, never fitted, so no factor and no class appear for it, while the compute classes are
    fitted as before. Mutant killed: the communication class let into the fit."""
    ops, _ = _profile()
    comm = pd.DataFrame({"name": "record_param_comms", "flops": 0, "bytes_read": 0, "bytes_written": 0,
                         "dtype": "bfloat16", "shapes": "", "collective": "all_reduce",
                         "collective_bytes": [1 << 20] * 3, "group_size": 8})
    both = pd.concat([ops.assign(collective=""), comm], ignore_index=True)
    modeled = cm.device_times(both, TOY)
    assert (modeled["op_class"].iloc[-3:] == "communication").all() and (modeled["device_ns"].iloc[-3:] > 0).all()
    both["measured_ns"] = both["measured_ns"].fillna(0.0)
    both.loc[both.index[-3:], "measured_ns"] = 2.0 * modeled["device_ns"].iloc[-3:].to_numpy()
    g = calibrate(both, base=TOY)
    assert "communication" not in g.class_scale and set(g.calibration["classes"]) == {"elementwise", "gemm"}


def test_a_fit_that_loses_its_class_total_falls_back_to_the_total_ratio(monkeypatch):
    """When the two-factor fit puts a class's total further from the measured total than the built-in model,
    both factors become measured / modeled of the class (elementwise measured 2x, GEMMs 0.5x: factors 2 and
    0.5 exactly, and the calibrated totals then equal the measured ones, so the blend stays 1). Mutant killed:
    ``m_total * before`` for ``m_total / before`` (clipped to 10)."""
    import memlens.devicetime.calibration as calibration
    monkeypatch.setattr(calibration, "fit_factors", lambda fixed, work, measured: (5.0, 5.0))
    ops, _ = _profile()
    g = calibrate(ops, base=TOY)
    assert g.calibration["blend"] == 1.0
    assert g.class_scale["elementwise"] == (pytest.approx(2.0, rel=1e-12), pytest.approx(2.0, rel=1e-12))
    assert g.class_scale["gemm"] == (pytest.approx(0.5, rel=1e-12), pytest.approx(0.5, rel=1e-12))
    for cls in ("elementwise", "gemm"):
        info = g.calibration["classes"][cls]
        assert info["ratio_after"] == pytest.approx(1.0, rel=1e-4)    # fixed + work: the model, to rounding


def test_the_measured_total_of_nested_kernel_times_counts_top_level_ops_only():
    """``kernel_busy_ns`` is inclusive (an op's kernels and its nested ops'), so the profile's measured total
    is its top-level ops' sum: ops 0 (10 ns, holding op 1: 4 ns) and 2 (5 ns) measure 15 ns, not 19; an own
    time column (``measured_ns``) sums every op. Mutant killed: the inclusive times of every op summed."""
    from memlens.devicetime.calibration import _measured_total
    ops = pd.DataFrame({"op_id": [0, 1, 2], "parent_op_id": [np.nan, 0, np.nan]})
    measured = np.array([10.0, 4.0, 5.0])
    assert _measured_total(ops, measured, "kernel_busy_ns") == 15.0
    assert _measured_total(ops, measured, "measured_ns") == 19.0
    flat = pd.DataFrame({"op_id": [0, 1, 2]})              # no nesting column: every op is top-level
    assert _measured_total(flat, measured, "kernel_busy_ns") == 19.0


def test_host_device_copies_are_split_at_the_host_links_price():
    """Host-to-device copies measured exactly at the model's price (pageable 11 GB/s plus the launch): the
    transfer class's fit is (1, 1) and its calibrated time the measured one, since its fixed and throughput
    parts add up to the modeled time. Mutant killed: the ``transfer=`` flag dropped from the split (the copies'
    parts then priced as device-memory copies, 1 TB/s, and the factors pulled far from 1)."""
    sizes = [1 << 16, 1 << 20, 1 << 24, 1 << 26]
    ops = pd.DataFrame({"name": "aten::copy_", "flops": 0, "bytes_read": sizes, "bytes_written": sizes,
                        "dtype": "float32", "shapes": [f"f32[{n // 4}]->f32[{n // 4}]" for n in sizes],
                        "transfer": "h2d"})
    modeled = cm.device_times(ops, TOY)
    assert set(modeled["op_class"]) == {"transfer"}
    g = calibrate(ops.assign(measured_ns=modeled["device_ns"].to_numpy(dtype="float64")), base=TOY)
    info = g.calibration["classes"]["transfer"]
    assert (info["fixed_factor"], info["throughput_factor"]) == (pytest.approx(1.0, rel=1e-6),
                                                                 pytest.approx(1.0, rel=1e-6))
    assert info["ratio_after"] == pytest.approx(1.0, rel=1e-6)
