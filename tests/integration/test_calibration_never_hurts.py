"""Calibration never makes its own profile worse than the built-in constants, per class and in total: a class
is fitted only with enough of its own priced ops, its factors stay bounded, and the factors are pulled back
towards 1 just as far as needed for the in-sample total. Expected values come from the closed-form fit
(`fit_factors`, checked by hand in tests/integration/test_devicetime_rules.py) and a brute-force search over the blends.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import memlens
from memlens.devicetime import costmodel as cm
from memlens.devicetime.calibration import BLENDS, FACTOR_RANGE, MIN_OPS, calibrate, fit_factors
from memlens.devicetime.gpus import GPU

# round constants: 1 PFLOP/s bf16, 1 TB/s, 1 us launch floor, 2 us GEMM floor, no efficiency losses
TOY = GPU(name="toy", flops={"bf16": 1e15, "fp32": 1e14}, mem_bw=1e12, launch_ns=1000.0, compute_units=4,
          gemm_floor_ns=2000.0, gemm_k_ns=0.01, attention_floor_ns=3000.0, gemm_efficiency=1.0,
          attention_efficiency=1.0, mem_efficiency=1.0, misaligned_gemm_penalty=2.0, norm_efficiency=0.4,
          softmax_block_efficiency=0.2, pageable_bw=11e9, host_bw=(25e9, 25e9))


def _adds(sizes):
    return pd.DataFrame({"name": "aten::add", "flops": [n for n in sizes], "bytes_read": [4 * n for n in sizes],
                         "bytes_written": [2 * n for n in sizes], "dtype": "bfloat16",
                         "shapes": [f"bf16[{n}],bf16[{n}]->bf16[{n}]" for n in sizes]})


def _mms(sizes):
    return pd.DataFrame({"name": "aten::mm", "flops": [2 * n ** 3 for n in sizes],
                         "bytes_read": [4 * n * n for n in sizes], "bytes_written": [2 * n * n for n in sizes],
                         "dtype": "bfloat16", "shapes": [f"bf16[{n},{n}],bf16[{n},{n}]->bf16[{n},{n}]" for n in sizes]})


def _with_measured(ops, times):
    modeled = cm.device_times(ops, TOY)["device_ns"].to_numpy(dtype="float64")
    return ops.assign(measured_ns=modeled * times), modeled


def _parts(ops):
    pairs = [cm.split_parts(TOY, r.name, r.flops, r.bytes_read, r.bytes_written, r.dtype, r.shapes)
             for r in ops.itertuples()]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def test_a_class_with_enough_ops_is_fitted_towards_its_measured_time():
    ops, modeled = _with_measured(_adds([1000, 100_000, 1_000_000, 4_000_000]), 2.0)
    g = calibrate(ops, base=TOY)
    fixed, work = _parts(ops)
    a, b = fit_factors(fixed, work, ops["measured_ns"].to_numpy())
    assert g.class_scale["elementwise"] == (pytest.approx(a), pytest.approx(b))
    info = g.calibration["classes"]["elementwise"]
    assert info["fitted"] and info["ratio_before"] == pytest.approx(0.5, rel=1e-3)
    assert abs(info["ratio_after"] - 1) < abs(info["ratio_before"] - 1)
    assert g.calibration["blend"] == 1.0


def test_a_class_with_too_few_ops_keeps_the_built_in_constants():
    ops, _ = _with_measured(_mms([256, 512][:MIN_OPS - 1]), 3.0)
    g = calibrate(pd.concat([ops, _with_measured(_adds([1000, 2000, 3000]), 1.0)[0]], ignore_index=True), base=TOY)
    assert "gemm" not in g.class_scale and not g.calibration["classes"]["gemm"]["fitted"]
    assert g.calibration["classes"]["gemm"]["ratio_after"] == pytest.approx(g.calibration["classes"]["gemm"]["ratio_before"],
                                                                           rel=1e-4)   # ns rounding
    assert cm.model_op(g, "aten::mm", 2 * 256 ** 3, 4 * 256 ** 2, 2 * 256 ** 2, "bfloat16",
                       "bf16[256,256],bf16[256,256]->bf16[256,256]") == \
        cm.model_op(TOY, "aten::mm", 2 * 256 ** 3, 4 * 256 ** 2, 2 * 256 ** 2, "bfloat16",
                    "bf16[256,256],bf16[256,256]->bf16[256,256]")


def test_factors_are_bounded():
    # measured at 1/1000 of the model: the unbounded fit would be ~0.001 on both parts
    ops, _ = _with_measured(_adds([1000, 100_000, 1_000_000]), 0.001)
    fixed, work = _parts(ops)
    lo, hi = FACTOR_RANGE
    assert fit_factors(fixed, work, ops["measured_ns"].to_numpy()) == (lo, lo)
    assert calibrate(ops, base=TOY).class_scale["elementwise"] == (lo, lo)


@pytest.mark.parametrize("largest_add,blend", [(2_000_000, 0.0), (4_000_000, 0.45), (9_000_000, 1.0)])
def test_the_total_is_never_worse_than_the_built_in(largest_add, blend):
    """Elementwise ops run 2x their model (fitted: 3 ops); two GEMMs run 0.5x theirs (too few to fit). The
    built-in total errs by (GEMMs' model / 2 - elementwise model): the fit alone raises the elementwise
    time, which worsens the total when the built-in error was positive or small (the cancellation is lost),
    so the factors are blended back just as far as the total needs: all the way (blend 0), part way, or not
    at all when the fit helps the total too."""
    adds, e_model = _with_measured(_adds([100_000, 1_000_000, largest_add]), 2.0)
    mms = _mms([2048, 2048])
    g_model = cm.device_times(mms, TOY)["device_ns"].to_numpy(dtype="float64")
    ops = pd.concat([adds, mms.assign(measured_ns=0.5 * g_model)], ignore_index=True)
    measured_total = ops["measured_ns"].sum()
    built_in_err = abs(e_model.sum() + g_model.sum() - measured_total)
    g = calibrate(ops, base=TOY)
    calibrated_total = cm.device_times(ops, g)["device_ns"].sum()
    assert abs(calibrated_total - measured_total) <= built_in_err + 2      # ns rounding of 5 ops
    # the blend is the largest of the grid that keeps the total no worse (brute force, from the raw fit)
    fixed, work = _parts(adds)
    a, b = fit_factors(fixed, work, adds["measured_ns"].to_numpy())
    ok = [t for t in BLENDS if abs(a ** t * fixed.sum() + b ** t * work.sum() + g_model.sum() - measured_total)
          <= built_in_err * (1 + 1e-9)]
    assert g.calibration["blend"] == pytest.approx(max(ok)) == pytest.approx(blend)
    assert g.class_scale["elementwise"] == (pytest.approx(a ** blend), pytest.approx(b ** blend))


def test_the_shared_profiles_are_never_worse_in_sample(shared):
    """The real profiles, calibrated on themselves: the modeled total no further from the measured one."""
    for rel, base in (("kineto/tracelens_h100_bert_small.json.gz", "H100"),
                      ("kineto/tracelens_mi300_bert_small.json.gz", "MI300X")):
        trace = memlens.load(shared(rel))
        truth = memlens.onto_kernel_clock(trace).metadata["clock"]["device_busy_ns"]
        before = memlens.retime(trace, gpu=base).metadata["clock"]["device_busy_ns"]
        after = memlens.retime(trace, gpu=calibrate(trace, base=base)).metadata["clock"]["device_busy_ns"]
        assert abs(after - truth) <= abs(before - truth) * 1.001 + 1000
