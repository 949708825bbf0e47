"""The cost model's rules for what real models run, each against a price computed by hand here from the
toy GPU's round constants; the built-in constants table; calibration (the fit, the calibrated prices,
JSON round trip, the CLI and --gpu mygpu.json)."""
from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest
import torch

import memlens
from memlens.cli import main
from memlens.devicetime import costmodel as cm
from memlens.devicetime.calibration import calibrate, fit_factors
from memlens.devicetime.gpus import GPU, gpu, load_gpu, save_gpu
from memlens.errors import InputError

# 1 PFLOP/s bf16 (tensor cores), 0.1 PFLOP/s fp32, 1 TB/s, 4 units, 1 us floors, no efficiency losses
TOY = GPU(name="toy", flops={"bf16": 1e15, "fp32": 1e14}, mem_bw=1e12, launch_ns=1000.0, compute_units=4,
          gemm_floor_ns=2000.0, gemm_k_ns=0.01, attention_floor_ns=3000.0, gemm_efficiency=1.0,
          attention_efficiency=1.0, mem_efficiency=1.0, misaligned_gemm_penalty=2.0, norm_efficiency=0.4,
          softmax_block_efficiency=0.2, pageable_bw=11e9, host_bw=(25e9, 25e9))


def _model(name, flops, read, written, shapes, dtype="bfloat16", g=TOY, **kw):
    return cm.model_op(g, name, flops, read, written, dtype, shapes, **kw)


# ---- the constants table ---------------------------------------------------------------------------------
def test_builtin_constants_exact():
    h100, mi300, a100 = gpu("H100"), gpu("MI300X"), gpu("A100")
    assert (h100.attention_efficiency, h100.attention_floor_ns, h100.norm_efficiency,
            h100.softmax_block_efficiency, h100.pageable_bw, h100.misaligned_gemm_penalty,
            h100.gemm_efficiency) == (0.17, 4500.0, 0.4, 0.2, 11e9, 3.0, 0.7)
    assert (mi300.gemm_efficiency, mi300.attention_efficiency, mi300.attention_floor_ns, mi300.norm_efficiency,
            mi300.softmax_block_efficiency, mi300.pageable_bw, mi300.misaligned_gemm_penalty,
            mi300.vendor) == (0.4, 0.12, 11000.0, 0.25, 0.2, 35e9, 2.0, "amd")
    assert a100.attention_floor_ns == pytest.approx(4500.0 * 1.98 / 1.41) and a100.attention_efficiency == 0.45
    assert gpu("V100").attention_efficiency == 0.3 and gpu("L4").attention_efficiency == 0.45
    mi250 = gpu("MI250X")       # one GCD: half the package; MI300X latencies scaled by clock 2.1 / 1.7
    assert (mi250.flops["bf16"], mi250.mem_bw, mi250.compute_units, mi250.vendor) == (191.5e12, 1.6e12, 110, "amd")
    assert mi250.launch_ns == pytest.approx(2100 * 2.1 / 1.7) and mi250.gemm_floor_ns == pytest.approx(4300 * 2.1 / 1.7)
    assert (mi250.gemm_efficiency, mi250.norm_efficiency, mi250.host_bw) == (0.4, 0.25, (25e9, 25e9))
    assert gpu("MI210").flops["bf16"] == 181e12 and gpu("MI210").compute_units == 104
    assert h100.class_scale == {} and h100.calibration == {}
    row = memlens.gpus().set_index("name").loc["MI300X"]
    assert (row["norm_efficiency"], row["attention_efficiency"], row["pageable_bw"]) == (0.25, 0.12, 35e9)


# ---- rules, hand-computed on TOY -----------------------------------------------------------------------
def test_views_and_noop_composites_launch_nothing():
    for name in ("aten::_unsafe_view", "aten::dropout", "aten::contiguous", "aten::result_type"):
        assert _model(name, 0, 4096, 4096, "bf16[2048]->bf16[2048]") == ("none", 0, 0.0)


def test_host_side_ops_are_off_the_gpu_clock():
    ops = pd.DataFrame({"name": ["aten::add", "aten::add"], "flops": [0, 0], "bytes_read": [1000, 1000],
                        "bytes_written": [500, 500], "dtype": ["bfloat16"] * 2, "shapes": ["x", "x"],
                        "device": ["cpu", "cuda:0"]})
    dt = cm.device_times(ops, TOY)
    assert dt["device_ns"].tolist() == [0, 1002] and dt["op_class"].tolist() == ["none", "elementwise"]


def test_softmax_priced_by_row_length():
    # 32 KiB moved either way: rows <= 1024 at norm_efficiency (0.4), longer rows at 0.2; two floors
    short = _model("aten::_softmax", 0, 16384, 16384, "bf16[8,1024]->bf16[8,1024]")
    long = _model("aten::_softmax", 0, 16384, 16384, "bf16[4,2048]->bf16[4,2048]")
    assert short == ("normalization", 1, pytest.approx(2000 + 32768 / 0.4e12 * 1e9))
    assert long == ("normalization", 1, pytest.approx(2000 + 32768 / 0.2e12 * 1e9))


def test_batch_norm_streams_its_passes():
    shapes = "f32[2,4,8,8],f32[4],f32[4],f32[4],f32[4]->f32[2,4,8,8]"     # activation: 2048 bytes
    assert _model("aten::cudnn_batch_norm", 0, 2112, 2048, shapes, "float32")[2] == \
        pytest.approx(2000 + 3 * 2048 / 1e12 * 1e9)
    bwd = "f32[2,4,8,8],f32[2,4,8,8],f32[4],f32[4],f32[4]->f32[2,4,8,8]"
    assert _model("aten::cudnn_batch_norm_backward", 0, 4144, 2048, bwd, "float32")[2] == \
        pytest.approx(2000 + 5 * 2048 / 1e12 * 1e9)
    # AMD (MIOpen): the passes at norm_efficiency
    amd = replace(TOY, vendor="amd")
    assert _model("aten::cudnn_batch_norm", 0, 2112, 2048, shapes, "float32", g=amd)[2] == \
        pytest.approx(2000 + 3 * 2048 / 0.4e12 * 1e9)


def test_misaligned_gemm_pays_on_memory_too():
    aligned = _model("aten::mm", 2 * 16 * 16 * 8, 10**9, 0, "bf16[16,8],bf16[8,16]->bf16[16,16]")
    odd = _model("aten::mm", 2 * 16 * 15 * 8, 10**9, 0, "bf16[16,8],bf16[8,15]->bf16[16,15]")
    assert aligned[2] == pytest.approx(2000 + 1e6) and odd[2] == pytest.approx(2000 + 2e6)


def test_gemm_without_results_takes_m_and_n_from_its_operands():
    # 64 x 8 output from the operands: 16x16 tiles (4 of them, one wave) win; K = 8 steps of the main
    # loop (0.08 ns) outlast the tile's arithmetic (0.055 ns)
    ns = _model("aten::mm", 2 * 64 * 8 * 8, 0, 0, "bf16[64,8],bf16[8,8]")[2]
    assert ns == pytest.approx(2000 + max(8 * 0.01, 2 * 16 * 16 * 8 / (1e15 / 4 * 0.3) * 1e9))


def test_fp32_convolution_runs_direct_and_bf16_on_tensor_cores():
    shapes = "{d}[1,4,8,8],{d}[8,4,1,1]->{d}[1,8,8,8]"     # 1x1, 4 -> 8 channels, 8x8 pixels
    flops = 2 * 8 * 64 * 4
    direct = _model("aten::convolution", flops, 10**6, 0, shapes.format(d="f32"), "float32")
    assert direct == ("gemm", 1, pytest.approx(2000 + 1000))          # no transposes, no alignment penalty
    tc = _model("aten::convolution", flops, 10**6, 0, shapes.format(d="bf16"), "bfloat16")
    act_bytes = (4 * 64 + 8 * 64) * 2
    assert tc == ("gemm", 3, pytest.approx(2000 + 1000 + 2 * 1000 + 2 * act_bytes / 0.5e12 * 1e9))


def test_channel_padding_to_the_mma_k():
    # bf16, 4 input channels per tap padded to 16: compute at 4/16 of the rate (no bytes, so compute shows)
    shapes = "bf16[1,4,16,16],bf16[64,4,1,1]->bf16[1,64,16,16]"
    flops = 2 * 256 * 64 * 4
    ns = _model("aten::convolution", flops, 0, 0, shapes)[2]
    act = (4 * 256 + 64 * 256) * 2
    per_unit = 1e15 * 0.25 / 4
    candidates = [2 * 256 * 128 * 4 / per_unit * 1e9,                  # 256x128: 1 tile, one wave
                  2 * 128 * 128 * 4 / per_unit * 1e9,                  # 128x128: 2 tiles
                  2 * 128 * 64 * 4 / (per_unit * 0.9) * 1e9,           # 128x64: 2 tiles
                  2 * 64 * 64 * 4 / (per_unit * 0.8) * 1e9,            # 64x64: 4 tiles, one wave
                  2 * 32 * 32 * 4 / (per_unit * 0.5) * 1e9 * 4,        # 32x32: 16 tiles, 4 waves
                  2 * 16 * 16 * 4 / (per_unit * 0.3) * 1e9 * 16]       # 16x16: 64 tiles, 16 waves
    assert ns == pytest.approx(2000 + min(candidates) + 2000 + 2 * act / 0.5e12 * 1e9)


def test_winograd_for_3x3_stride_1_on_cuda_cores():
    shapes = "f32[1,4,8,8],f32[8,4,3,3]->f32[1,8,8,8]"
    flops = 2 * 8 * 64 * 4 * 9
    ns = _model("aten::convolution", flops, 0, 0, shapes, "float32")[2]
    k = flops / 2.25 / (2 * 64 * 8)                                  # 16
    assert ns == pytest.approx(2000 + 2 * 16 * 16 * k / (1e14 / 4 * 0.3) * 1e9)
    # on tensor cores the same layer runs as an implicit GEMM (no Winograd): K = 36 at 16/16 channel use...
    # ... with 4 channels padded to 16: a quarter of the bf16 rate, plus the layout transposes
    tc = _model("aten::convolution", flops, 0, 0, shapes.replace("f32", "bf16"))[2]
    act = (4 * 64 + 8 * 64) * 2
    per_unit = 1e15 * 0.25 / 4
    assert tc == pytest.approx(2000 + 2 * 16 * 16 * 36 / (per_unit * 0.3) * 1e9 + 2000 + 2 * act / 0.5e12 * 1e9)


def test_depthwise_convolution_is_memory_bound():
    ns = _model("aten::convolution", 2 * 8 * 64 * 9, 10**6, 0, "f32[1,8,8,8],f32[8,1,3,3]->f32[1,8,8,8]", "float32")
    assert ns == ("gemm", 1, pytest.approx(1000 + 1000))


def test_convolution_backward_one_gemm_per_gradient():
    # grad_output, input, weight -> grad input only
    shapes = "f32[1,8,8,8],f32[1,4,8,8],f32[8,4,1,1]->f32[1,4,8,8]"
    cls, kernels, ns = _model("aten::convolution_backward", 2 * 8 * 64 * 4, 10**6, 0, shapes, "float32")
    assert (cls, kernels) == ("gemm", 1) and ns == pytest.approx(2000 + 1000)
    both = shapes + ",f32[8,4,1,1]"
    cls, kernels, ns = _model("aten::convolution_backward", 2 * 2 * 8 * 64 * 4, 10**6, 0, both, "float32")
    assert kernels == 2 and ns == pytest.approx(2 * (2000 + 500))


def test_causal_attention_visits_half_the_key_blocks():
    shapes = "bf16[1,2,256,64],bf16[1,2,256,64],bf16[1,2,256,64]->bf16[1,2,256,64]"
    block = 4 * 128 * 128 * 64 / (1e15 / 4) * 1e9
    full = _model("aten::_scaled_dot_product_flash_attention", 0, 1, 1, shapes)[2]
    causal = _model("aten::_scaled_dot_product_flash_attention", 0, 1, 1, shapes, causal=True)[2]
    assert full == pytest.approx(3000 + 2 * block) and causal == pytest.approx(3000 + 1.5 * block)


def test_broadcast_halves_bandwidth_of_two_byte_types():
    assert _model("aten::mul", 0, 10000, 8000, "bf16[4,1000],bf16[1000]->bf16[4,1000]")[2] == \
        pytest.approx(1000 + 2 * 18)
    assert _model("aten::mul", 0, 10000, 8000, "f32[4,500],f32[500]->f32[4,500]", "float32")[2] == \
        pytest.approx(1000 + 18)
    assert _model("aten::mul", 0, 10000, 8000, "bf16[4,1000],bf16[4,1000]->bf16[4,1000]")[2] == \
        pytest.approx(1000 + 18)


def test_max_pool_backward_reads_and_writes_twice():
    ns = _model("aten::max_pool2d_with_indices_backward", 0, 3000, 1000, "f32[1]", "float32")
    assert ns == ("elementwise", 2, pytest.approx(2 * 1000 + (2 * 3000 + 2 * 1000) / 1e12 * 1e9))


def test_host_copies_run_at_the_pageable_rate():
    cls, kernels, ns = _model("aten::copy_", 0, 8000, 4000, "f32[1000],f32[1000]->f32[1000]", "float32",
                              transfer="h2d")
    assert (cls, kernels) == ("transfer", 1) and ns == pytest.approx(1000 + 4000 / 11e9 * 1e9)
    slow_link = replace(TOY, host_bw=(5e9, 2e9))                          # slower than pageable: the link
    assert _model("aten::copy_", 0, 8000, 4000, "f32[1000],f32[1000]->f32[1000]", "float32", g=slow_link,
                  transfer="d2h")[2] == pytest.approx(1000 + 4000 / 5e9 * 1e9)


# ---- calibration -----------------------------------------------------------------------------------------
def test_fit_factors_closed_form():
    a, b = fit_factors([1.0, 0.0], [0.0, 1.0], [2.0, 3.0])
    # shares 0.4 / 0.6; relative parts 0.5 and 1/3; ridge 0.01 towards 1
    assert a == pytest.approx((0.4 * 0.5 + 0.01) / (0.4 * 0.25 + 0.01))
    assert b == pytest.approx((0.6 / 3 + 0.01) / (0.6 / 9 + 0.01))


def _measured_ops():
    return pd.DataFrame({"name": ["aten::add", "aten::add", "aten::add", "aten::view"], "flops": [0, 0, 0, 0],
                         "bytes_read": [1_000_000, 8, 8, 0], "bytes_written": [500_000, 4, 4, 0],
                         "dtype": ["bfloat16"] * 4, "measured_ns": [5000.0, 3000.0, 3000.0, 0.0],
                         "shapes": ["bf16[250000],bf16[250000]->bf16[250000]", "bf16[2],bf16[2]->bf16[2]",
                                    "bf16[2],bf16[2]->bf16[2]", ""]})


def test_calibrated_gpu_prices_with_the_fitted_factors():
    g = calibrate(_measured_ops(), base=TOY)
    # fixed parts: the 1 us floor of each add; throughput parts: 1.5 MB and 12 B (twice) at 1 TB/s
    a, b = fit_factors([1000.0, 1000.0, 1000.0], [1500.0, 0.012, 0.012], [5000.0, 3000.0, 3000.0])
    assert g.class_scale == {"elementwise": (pytest.approx(a), pytest.approx(b))}
    assert _model("aten::add", 0, 1_000_000, 500_000, "bf16[250000],bf16[250000]->bf16[250000]", g=g)[2] == \
        pytest.approx(a * 1000 + b * 1500)
    info = g.calibration["classes"]["elementwise"]
    assert info["ops"] == 3 and info["measured_ns"] == 11000
    assert info["modeled_ns"] == pytest.approx(2500 + 1000 + 1000, abs=1)
    assert info["ratio_after"] == pytest.approx((a * 3000 + b * 1500.024) / 11000, rel=1e-6)
    assert g.calibration["blend"] == 1.0
    assert g.calibration["base"] == "toy" and g.name.startswith("toy calibrated")


def test_calibrate_refuses_without_kernel_times():
    with pytest.raises(InputError, match="no measured kernel times"):
        calibrate(_measured_ops().drop(columns=["measured_ns"]), base=TOY)
    with pytest.raises(InputError, match="cost facts"):
        calibrate(_measured_ops().assign(bytes_read=0, bytes_written=0), base=TOY)


def test_gpu_json_round_trip(tmp_path):
    g = calibrate(_measured_ops(), base="H100")
    path = save_gpu(g, tmp_path / "mygpu.json")
    back = gpu(str(path))
    assert back == g and back.class_scale == g.class_scale and back.calibration == g.calibration
    assert load_gpu(path).host_bw == g.host_bw
    # a prediction on it: the base part's memory facts, under the calibrated GPU's own name
    from memlens.prediction.gpus import gpu_facts
    facts, base = gpu_facts(str(path)), gpu_facts("H100")
    assert facts.name == g.name and g.name != base.name
    assert (facts.total_memory, facts.capability, facts.cuda_context) == \
        (base.total_memory, base.capability, base.cuda_context)
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="not a GPU"):
        gpu(str(tmp_path / "bad.json"))


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory):
    """A recorded run whose ops carry cost facts and (synthetic) kernel times: twice the H100 model."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    with memlens.record(model) as rec:
        model(torch.randn(32, 64)).sum().backward()
    t = rec.trace
    dt = cm.device_times(t.ops, gpu("H100"))
    ops = t.ops.assign(kernel_busy_ns=(2 * dt["device_ns"]).astype("int64"))
    return memlens.Trace.from_tables(t.blocks, t.accesses, ops, metadata=t.metadata).save(
        tmp_path_factory.mktemp("cal") / "run.memlens")


def test_cli_calibrate_then_gpu_json_everywhere(measured_run, tmp_path, capsys):
    out = tmp_path / "mygpu.json"
    assert main(["calibrate", str(measured_run), "-o", str(out), "--base", "H100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["calibration"]["total_ratio_before"] == pytest.approx(0.5, rel=0.01)
    assert doc["calibration"]["total_ratio_after"] == pytest.approx(1.0, rel=0.05)
    g = gpu(str(out))
    assert main(["retime", str(measured_run), "-o", str(tmp_path / "r.memlens"), "--gpu", str(out), "--json"]) == 0
    retimed = json.loads(capsys.readouterr().out)
    assert retimed["clock"]["gpu"] == g.name
    assert main(["ati", str(measured_run), "--gpu", str(out)]) == 0
    assert g.name in capsys.readouterr().out
    assert main(["calibrate", str(measured_run), "-o", str(measured_run / "manifest.json" / "x.json")]) == 2
    assert main(["calibrate", str(measured_run), "-o", str(tmp_path / "y.json"), "--base", "H900"]) == 2


def test_causal_flag_read_from_an_imported_traces_scalar_arguments():
    shapes = "bf16[1,2,256,64],bf16[1,2,256,64],bf16[1,2,256,64]->bf16[1,2,256,64]"
    ops = pd.DataFrame({"name": ["aten::_scaled_dot_product_flash_attention"] * 3, "flops": [0] * 3,
                        "bytes_read": [1] * 3, "bytes_written": [1] * 3, "dtype": ["bfloat16"] * 3,
                        "shapes": [shapes] * 3,
                        "concrete_inputs": ['["","","","0.","True","False","0.125"]',
                                            '["","","","0.","False","False","0.125"]', None]})
    block = 4 * 128 * 128 * 64 / (1e15 / 4) * 1e9
    assert cm.device_times(ops, TOY)["device_ns"].tolist() == \
        [round(3000 + 1.5 * block), round(3000 + 2 * block), round(3000 + 2 * block)]


def test_causal_argument_positions_match_the_schemas():
    from memlens.devicetime.rules.names import CAUSAL_ARG
    for name, pos in CAUSAL_ARG.items():
        schema = getattr(torch.ops.aten, name.split("::")[1]).default._schema
        assert schema.arguments[pos].name in ("is_causal", "custom_mask_type"), name


def test_non_contiguous_operands_lose_the_vectorized_path():
    from memlens.devicetime.rules.memory import non_contiguous
    shape = [(("bf16", (2, 3, 4)))]
    assert non_contiguous(shape, [[12, 4, 1], []]) is False
    assert non_contiguous(shape, "[[12, 1, 3]]") is True            # permuted, as JSON text
    assert non_contiguous([("bf16", (2, 1, 4))], [[4, 99, 1]]) is False   # size-1 dims: any stride
    assert non_contiguous(shape, None) is False and non_contiguous(shape, "not json") is False
    # priced: 2-byte types pay 1.5x on the bytes; 4-byte types and cat do not
    base = 1000 + 18
    assert _model("aten::neg", 0, 9000, 9000, "bf16[4500]->bf16[4500]", strided=True)[2] == \
        pytest.approx(1000 + 1.5 * 18)
    assert _model("aten::neg", 0, 9000, 9000, "f32[2250]->f32[2250]", "float32", strided=True)[2] == \
        pytest.approx(base)
    assert _model("aten::cat", 0, 9000, 9000, "[bf16[2250],bf16[2250]]->bf16[4500]", strided=True)[2] == \
        pytest.approx(base)
    ops = pd.DataFrame({"name": ["aten::neg"] * 2, "flops": [0, 0], "bytes_read": [9000] * 2,
                        "bytes_written": [9000] * 2, "dtype": ["bfloat16"] * 2,
                        "shapes": ["bf16[3,1500]->bf16[3,1500]"] * 2,
                        "input_strides": ["[[1500, 1]]", "[[1, 3]]"]})
    assert cm.device_times(ops, TOY)["device_ns"].tolist() == [1018, 1027]
