"""Kineto import: exact per-op nanoseconds on fractional-microsecond stamps, and the nesting tolerance.

Profiles are built by hand (tests/_kineto_cases.py builders) at a realistic epoch-sized base (1.7e12 us, where
a float64 still resolves 0.25 ns); every expected value is the stamp minus the trace's first instant, in ns,
rounded to the nearest ns by hand. Each test names the mutant it kills.
"""
from __future__ import annotations

import pandas as pd

from _kineto_cases import _gpu, _launch, _memory, _op
from memlens.io.kineto.importer import kineto_to_trace

B = 1_700_000_000_000.0  # us: Kineto stamps are epoch-based
F32 = "float"


def _profile(ops, runtime=(), gpu=(), memory=()):
    return {"schemaVersion": 1, "deviceProperties": [{"name": "Hand GPU"}],
            "traceEvents": list(ops) + list(runtime) + list(gpu) + list(memory)}


def test_op_and_kernel_nanoseconds_on_fractional_microsecond_stamps():
    """mm at 1.5 us for 0.25 us is the trace's first instant (t = 0): [0, 250] ns. add at 2.0017 us for 0.0009
    us: 501.7 -> 502 and 502.6 -> 503 ns (nearest, not truncated). mm's kernel at 5.004 us for 0.3 us:
    [3504, 3804] ns, busy 300 ns. The [memory] instant at 1.7507 us: the alloc at 250.7 -> 251 ns (stamps are
    picked so that their float64 at the base, 1/4096 us apart, still rounds to the stated ns).
    Mutants killed: ``np.rint(...)`` -> truncation (``astype`` alone) in the op or kernel stamps (add would be
    [501, 502]); ``* 1000`` dropped or t0 not subtracted; the same truncation in the [memory] stamps."""
    ops = [_op("aten::mm", B + 1.5, 0.25, 1, [[4, 4], [4, 4]], [F32, F32]),
           _op("aten::add", B + 2.0017, 0.0009, 2, [[4, 4], [4, 4], []], [F32, F32, "Scalar"], ["", "", "1"])]
    trace = kineto_to_trace(_profile(ops, [_launch(B + 1.6, 11, 1)], [_gpu("kernel", "mm_k", B + 5.004, 0.3, 11)],
                                     [_memory(B + 1.7507, 64, 4096)]))
    by = trace.ops.set_index("name")
    assert (by.loc["aten::mm", "start_ns"], by.loc["aten::mm", "end_ns"]) == (0, 250)
    assert (by.loc["aten::add", "start_ns"], by.loc["aten::add", "end_ns"]) == (502, 503)
    assert (by.loc["aten::mm", "kernel_start_ns"], by.loc["aten::mm", "kernel_end_ns"]) == (3504, 3804)
    assert by.loc["aten::mm", "kernel_busy_ns"] == 300 and by.loc["aten::add", "kernels"] == 0
    assert trace.blocks["alloc_ns"].tolist() == [251]


def test_a_child_ending_2_ns_after_its_parent_is_nested_and_3_ns_is_not():
    """Thread 1: linear [10, 11] us with addmm [10.5, 11.002] (ends 2 ns late: float rounding of the
    profile's microseconds): addmm's parent is linear, depth 1. Thread 2: linear [20, 21] with addmm
    [20.5, 21.003] (3 ns late: only overlapping, a malformed trace): no parent.
    Mutants killed: the tolerance ``ends - 2`` -> ``ends - 1`` (thread 1's addmm loses its parent) or
    ``ends - 3`` (thread 2's gains one)."""
    dims, types = [[4, 4], [4, 4]], [F32, F32]
    ops = [_op("aten::linear", B + 10, 1, 1, dims, types, tid=1),
           _op("aten::addmm", B + 10.5, 0.502, 2, dims, types, tid=1),
           _op("aten::linear", B + 20, 1, 3, dims, types, tid=2),
           _op("aten::addmm", B + 20.5, 0.503, 4, dims, types, tid=2)]
    trace = kineto_to_trace(_profile(ops))
    o = trace.ops.sort_values("start_ns").reset_index(drop=True)
    assert o["end_ns"].tolist() == [1000, 1002, 11000, 11003]  # t0 = 10 us
    assert o.loc[1, "parent_op_id"] == o.loc[0, "op_id"] and o.loc[1, "depth"] == 1
    assert o.loc[3, "parent_op_id"] is pd.NA
    assert o.loc[0, "parent_op_id"] is pd.NA and o.loc[2, "parent_op_id"] is pd.NA
