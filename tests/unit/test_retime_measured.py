"""Retiming a measured profile onto another GPU: each op's measured kernel time scaled by its compute- or
memory-bound ratio (hand-computed on made-up GPUs), the busy-time contract, and the shared H100 / MI300X
profiles of the same models."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import memlens
from memlens.devicetime import GPU
from memlens.devicetime.gpus import gpu_of_device
from memlens.errors import InputError

# ridge points: 100 FLOP/B on SRC (100 TFLOP/s over 1 TB/s), 200 FLOP/B on DST (400 over 2)
SRC = GPU(name="src part", flops={"fp32": 100e12}, mem_bw=1e12, gemm_efficiency=1.0, mem_efficiency=1.0,
          launch_ns=1000.0)
DST = GPU(name="dst part", flops={"fp32": 400e12}, mem_bw=2e12, gemm_efficiency=1.0, mem_efficiency=1.0,
          launch_ns=3000.0)
GB = 1e9


def measured_trace(rows, *, gpu="src part"):
    """A trace on the measured kernel clock: rows of (name, flops, bytes_read, own_ns, kernels, parent)."""
    n = len(rows)
    own = np.array([r[3] for r in rows], dtype=np.int64)
    parent = pd.array([r[5] for r in rows], dtype="Int64")
    ops = pd.DataFrame({"op_id": np.arange(n), "name": [r[0] for r in rows], "flops": [r[1] for r in rows],
                        "bytes_read": [r[2] for r in rows], "bytes_written": 0, "dtype": "float32",
                        "kernels": [r[4] for r in rows], "parent_op_id": parent})
    from memlens.clock import device_time_columns
    cols, busy = device_time_columns(ops, self_ns=own)
    start = np.concatenate([[0], np.cumsum(own)[:-1]])
    ops["start_ns"], ops["end_ns"] = start, start + cols["device_ns"]
    ops["device_self_ns"], ops["device_ns"] = cols["device_self_ns"], cols["device_ns"]
    blocks = pd.DataFrame({"block_id": [0], "addr": [0], "size": [512], "alloc_ns": [0], "free_ns": [int(own.sum())],
                           "device": ["cuda:0"]})
    clock = {"kind": "cuda", "gpu": gpu, "model": None, "from": "host", "device_busy_ns": busy,
             "kernels": int(sum(r[4] for r in rows)), "source_units": None}
    return memlens.Trace.from_tables(blocks, None, ops, metadata={"clock": clock})


def test_each_regime_scales_by_its_own_ratio():
    rows = [("compute on both", 1000 * GB, 1 * GB, 10_000_000, 0, None),    # 1000 FLOP/B: 100/400
            ("memory on both", 10 * GB, 1 * GB, 1_000_000, 0, None),        # 10 FLOP/B: 1/2
            ("flips", 150 * GB, 1 * GB, 1_500_000, 0, None),                # src compute 1.5 ms, dst memory 0.5 ms
            ("at the source ridge", 100 * GB, 1 * GB, 1_000_000, 0, None),  # 1 ms both ways on SRC; DST memory 0.5
            ("triton_fused", 0, 0, 800_000, 0, None)]                       # unpriced: memory-rate ratio 1/2
    r = memlens.retime(measured_trace(rows), gpu=DST, source_gpu=SRC)
    assert r.ops["device_self_ns"].tolist() == [2_500_000, 500_000, 500_000, 500_000, 400_000]
    assert r.ops["scale_priced"].tolist() == [True, True, True, True, False]
    clock = r.metadata["clock"]
    assert clock["kind"] == "modeled" and clock["gpu"] == "dst part"
    assert clock["model"] == "scaled from measured src part" and clock["measured_gpu"] == "src part"
    assert clock["device_busy_ns"] == 4_400_000


def test_launch_floor_moves_to_the_targets_and_the_rest_scales():
    # memory-bound op, 2 kernels, 5 us measured: 2 x 1 us floor -> 2 x 3 us, the other 3 us scale by 1/2
    # a 0.5 us op with one kernel sits under the floor: all of it is floor, 0.5 * 3 = 1.5 us
    rows = [("add", 10 * GB, 1 * GB, 5_000, 2, None), ("tiny", 0, 8, 500, 1, None)]
    r = memlens.retime(measured_trace(rows), gpu=DST, source_gpu=SRC)
    assert r.ops["device_self_ns"].tolist() == [6_000 + 1_500, 1_500]


def test_nested_ops_keep_the_busy_time_contract():
    # linear (own 0, its kernel is the child's) > addmm; a top-level add beside it
    rows = [("aten::linear", 1000 * GB, 1 * GB, 0, 1, None), ("aten::addmm", 1000 * GB, 1 * GB, 10_000_000, 1, 0),
            ("aten::add", 10 * GB, 1 * GB, 1_000_000, 1, None)]
    r = memlens.retime(measured_trace(rows), gpu=DST, source_gpu=SRC)
    o = r.ops
    # addmm: a GEMM, whose floor is gemm_floor_ns (5 us on both parts); add: launch_ns, 1 us -> 3 us
    own = [0, 5000 + (10_000_000 - 5000) // 4, 3000 + (1_000_000 - 1000) // 2]   # 2_503_750, 502_500
    assert o["device_self_ns"].tolist() == own
    assert o["device_ns"].tolist() == [own[1], own[1], own[2]]      # inclusive: the child summed into linear
    top = o["parent_op_id"].isna()
    assert o.loc[top, "device_ns"].sum() == r.metadata["clock"]["device_busy_ns"] == own[1] + own[2]
    assert o["device_self_ns"].sum() == r.metadata["clock"]["device_busy_ns"]
    # the linear's own kernel count is 0 (its column counts its child's): no floor charged twice
    assert o.loc[0, "device_self_ns"] == 0


def test_class_efficiencies_and_facts_inherited_from_the_parent():
    src = GPU(name="a", flops={"bf16": 100e12}, mem_bw=1e12, gemm_efficiency=1.0, attention_efficiency=0.5,
              mem_efficiency=1.0, norm_efficiency=0.5, launch_ns=1000.0)
    dst = GPU(name="b", flops={"bf16": 100e12}, mem_bw=1e12, gemm_efficiency=1.0, attention_efficiency=0.1,
              mem_efficiency=1.0, norm_efficiency=0.25, launch_ns=1000.0)
    rows = [("aten::_scaled_dot_product_flash_attention", 1000 * GB, 1 * GB, 0, 1, None),
            ("aten::_flash_attention_forward", 0, 0, 1_001_000, 1, 0),   # facts on the parent: x 0.5 / 0.1
            ("aten::native_layer_norm", 1 * GB, 1 * GB, 1_001_000, 1, None),   # memory at 0.5 vs 0.25: x 2
            ("aten::mm", 1000 * GB, 1 * GB, 1_001_000, 1, None)]   # gemm efficiency equal: x 1
    trace = measured_trace(rows)
    trace.ops["dtype"] = "bfloat16"
    r = memlens.retime(trace, gpu=dst, source_gpu=src)
    # floors (equal on both parts): attention 7 us (attention_floor_ns), norm 1 us (launch_ns), mm 5 us
    assert r.ops["device_self_ns"].tolist() == [0, 7000 + (1_001_000 - 7000) * 5, 1000 + 2_000_000, 1_001_000]
    assert r.ops["scale_priced"].tolist() == [True, True, True, True]


def test_same_gpu_both_ways_is_the_identity():
    rows = [("mm", 1000 * GB, 1 * GB, 10_000_000, 1, None), ("k", 0, 0, 7_000, 1, None)]
    r = memlens.retime(measured_trace(rows), gpu=SRC, source_gpu=SRC)
    assert r.ops["device_self_ns"].tolist() == [10_000_000, 7_000]


def test_source_gpu_from_the_profile_device_name_or_required():
    assert gpu_of_device("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert gpu_of_device("AMD Instinct MI300X VF").name == "MI300X"
    assert gpu_of_device("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert gpu_of_device("Some Accelerator 9000") is None
    rows = [("k", 0, 0, 7_000, 1, None)]
    r = memlens.retime(measured_trace(rows, gpu="NVIDIA H100 80GB HBM3"), gpu="H100")
    assert r.ops["device_self_ns"].tolist() == [7_000]
    with pytest.raises(InputError, match="source_gpu"):
        memlens.retime(measured_trace(rows, gpu="Some Accelerator 9000"), gpu="H100")


PAIRS = ["bert_small", "qwen_0.5b_chat", "timesformer_base"]


@pytest.mark.slow
@pytest.mark.parametrize("model", PAIRS)
def test_shared_profiles_h100_and_mi300x_both_ways(shared, model):
    measured = {g: memlens.onto_kernel_clock(memlens.load(shared(f"kineto/tracelens_{g}_{model}.json.gz")))
                for g in ("h100", "mi300")}
    for src, dst, name in (("h100", "mi300", "MI300X"), ("mi300", "h100", "H100")):
        r = memlens.retime(measured[src], gpu=name)
        clock = r.metadata["clock"]
        top = r.ops["parent_op_id"].isna()
        assert r.ops.loc[top, "device_ns"].sum() == clock["device_busy_ns"]
        assert clock["measured_gpu"] == {"h100": "H100 SXM", "mi300": "MI300X"}[src]
        ratio = clock["device_busy_ns"] / measured[dst].metadata["clock"]["device_busy_ns"]
        # measured: bert 0.79 / 1.30, qwen 0.96 / 1.01, timesformer 1.14 / 0.92 (H100 -> MI300X / back);
        # the bert profiles are 60 small kernels, most near their floors
        assert 0.6 < ratio < 1.5, (model, src, ratio)
        if model != "bert_small":
            assert abs(ratio - 1) <= 0.2, (model, src, ratio)
