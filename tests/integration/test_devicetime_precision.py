"""fp32 products at the TF32 rate or not (the trace's switches, else PyTorch's defaults, said in the clock),
the GEMM alignment penalty by load width, and backend convolutions priced from a worked-out result shape:
each against a price or shape computed by hand here; on the shared profiles, the ops these rules decide
moved into a stated band of their measured kernel time."""
from __future__ import annotations

import gzip
import json
from dataclasses import replace

import pytest
import torch

import memlens
from memlens.analysis.clock import describe_clock
from memlens.devicetime import costmodel as cm
from memlens.devicetime.rules import gemm
from memlens.devicetime.gpus import gpu
from memlens.devicetime.tf32 import tf32_setting
from memlens.io.kineto.facts import signature_facts
from memlens.io.kineto.importer import tf32_from_kernels
from memlens.io.kineto.settings import header_torch_settings, kernel_tf32_evidence
from memlens.opfacts.convshape import conv_output_shape
from memlens.opfacts.costs import op_costs

# 1 PFLOP/s bf16, 0.5 PFLOP/s tf32, 0.1 PFLOP/s fp32, 1 TB/s, 4 units, no efficiency losses, penalty 2
TOY = memlens.GPU(name="toy", vendor="nvidia", flops={"bf16": 1e15, "tf32": 5e14, "fp32": 1e14}, mem_bw=1e12,
                  launch_ns=1000.0, compute_units=4, gemm_floor_ns=2000.0, gemm_k_ns=0.0, gemm_efficiency=1.0,
                  mem_efficiency=1.0, misaligned_gemm_penalty=2.0)
HOPPER_TOY = replace(TOY, capability=(9, 0))
AMD_TOY = replace(TOY, vendor="amd")


def _mm(width, dtype="bf16", g=TOY, moved=10**9, **kw):
    """A memory-bound mm (1 GB moved: 1e6 ns at 1 TB/s) whose result is `width` wide."""
    torch_dtype = {"bf16": "bfloat16", "f32": "float32"}[dtype]
    shapes = f"{dtype}[16,16],{dtype}[16,{width}]->{dtype}[16,{width}]"
    return cm.model_op(g, "aten::mm", 2 * 16 * width * 16, moved, 0, torch_dtype, shapes, **kw)[2]


# ---- alignment ------------------------------------------------------------------------------------------
def test_alignment_bytes_is_the_widest_load_every_operand_allows():
    assert gemm.alignment_bytes([("bf16", (16, 16))], [("bf16", (16, 64))]) == 16
    assert gemm.alignment_bytes([("bf16", (16, 16))], [("bf16", (16, 30))]) == 4     # 60 bytes: 4 | 60
    assert gemm.alignment_bytes([("bf16", (16, 16))], [("bf16", (16, 15))]) == 2     # 30 bytes
    assert gemm.alignment_bytes([("f32", (16, 15))], []) == 4                        # TF32 align1: 4 bytes
    assert gemm.alignment_bytes([("f32", (16, 4))], []) == 16                        # NVIDIA: multiple of 4
    assert gemm.alignment_bytes([("bf16", (16, 1))], [("bf16", (8,))]) == 16         # size-1 rows do not count


def test_penalty_grows_with_the_loads_per_16_bytes():
    aligned = _mm(64)
    assert aligned == pytest.approx(2000 + 1e6)
    assert _mm(15) == pytest.approx(2000 + 2 * 1e6)                  # bf16 align1: 8 loads, the whole penalty
    assert _mm(30) == pytest.approx(2000 + (1 + 3 / 7) * 1e6)        # bf16 align2: 4 loads, 3/7 of the excess
    assert _mm(15, "f32", tf32=True) == pytest.approx(2000 + (1 + 3 / 7) * 1e6)   # TF32 align1: 4 loads
    assert _mm(14, "f32", tf32=True) == pytest.approx(2000 + (1 + 1 / 7) * 1e6)   # 56 bytes: 8-byte loads


def test_cuda_core_fp32_pays_no_alignment_penalty_and_hopper_pays_all_of_it():
    assert _mm(15, "f32", tf32=False) == pytest.approx(2000 + 1e6)     # simt sgemm: FMA-bound
    assert _mm(30, g=HOPPER_TOY) == pytest.approx(2000 + 2 * 1e6)     # no TMA kernel below 16 bytes


# ---- TF32 -----------------------------------------------------------------------------------------------
def test_fp32_matmul_at_the_tf32_rate_only_when_allowed():
    # compute-bound: 2 x 512 x 512 x 512 flops, no bytes; 256x128 tiles: 8 tiles on 4 units = 2 waves
    flops = 2 * 512 ** 3
    shapes = "f32[512,512],f32[512,512]->f32[512,512]"
    tile = 2 * 256 * 128 * 512
    off = cm.model_op(TOY, "aten::mm", flops, 0, 0, "float32", shapes, tf32=False)[2]
    on = cm.model_op(TOY, "aten::mm", flops, 0, 0, "float32", shapes, tf32=True)[2]
    assert off == pytest.approx(2000 + 2 * tile / (1e14 / 4) * 1e9)
    assert on == pytest.approx(2000 + 2 * tile / (5e14 / 4) * 1e9)
    # a mapping sets each switch; the default is PyTorch's (matmul off) on NVIDIA
    assert cm.model_op(TOY, "aten::mm", flops, 0, 0, "float32", shapes, tf32={"matmul": True, "conv": False})[2] == on
    assert cm.model_op(TOY, "aten::mm", flops, 0, 0, "float32", shapes)[2] == off


def test_defaults_and_what_the_trace_says():
    assert tf32_setting(None, {}, "nvidia") == {"matmul": False, "conv": True,
                                                "source": "assumed: PyTorch >= 1.12 defaults"}
    # PyTorch 1.7-1.11 ran fp32 matmuls in TF32 by default
    assert tf32_setting(None, {"torch_version": "1.10.2"}, "nvidia")["matmul"] is True
    assert tf32_setting(None, {"torch_version": "1.12.0"}, "nvidia")["matmul"] is False
    told = {"torch_settings": {"matmul_allow_tf32": True, "cudnn_allow_tf32": False}}
    assert tf32_setting(None, told, "nvidia") == {"matmul": True, "conv": False, "source": "from the trace"}
    assert tf32_setting(False, told, "nvidia") == {"matmul": False, "conv": False, "source": "given: tf32 argument"}
    amd = tf32_setting(None, told, "amd")       # ROCm: the switches alone turn nothing on
    assert (amd["matmul"], amd["conv"]) == (False, False) and "ROCm" in amd["source"]


def test_kernel_names_say_which_products_ran_tf32():
    assert kernel_tf32_evidence("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4") == ("matmul", True)
    assert kernel_tf32_evidence("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>") == \
        ("matmul", True)
    assert kernel_tf32_evidence("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1>") \
        is None                                                      # a bf16 product on the same MMA shape
    assert kernel_tf32_evidence("cutlass_80_simt_sgemm_128x32_8x5_nn_align1") == ("matmul", False)
    assert kernel_tf32_evidence("volta_scudnn_128x64_relu_interior_nn_v1") == ("conv", False)
    assert kernel_tf32_evidence("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw") == ("conv", True)
    assert kernel_tf32_evidence("void at::native::vectorized_elementwise_kernel<4>") is None
    # one TF32 kernel proves the switch on even beside CUDA-core ones
    events = type("Collected", (), {"kernel_names": {"ampere_sgemm_128x64_nn", "sm80_xmma_gemm_f32f32_tf32f32_f32"}})
    assert tf32_from_kernels(events) == {"matmul": True}


def test_h100_profile_kernels_say_matmul_tf32_was_off(shared):
    """The H100 Qwen profile's one fp32 product ran ``cutlass_80_simt_sgemm_*``: on a part with TF32 that
    says the matmul switch was off, and the clock names the kernels as its source."""
    trace = memlens.load(shared("kineto/tracelens_h100_qwen_0.5b_chat.json.gz"))
    assert trace.metadata["torch_settings"]["matmul_allow_tf32"] is False
    tf32 = memlens.retime(trace, gpu="A100").metadata["clock"]["tf32"]
    assert (tf32["matmul"], tf32["conv"]) == (False, True)
    assert tf32["source"] == "matmul from the trace's kernel names; the other assumed: PyTorch 2.6.0 defaults"


def test_profile_header_switches_are_read():
    header = {"traceEvents": [{"name": "allow_tf32", "args": {"allow_tf32": True}}],
              "metadata": {"backends": {"cudnn": {"allow_tf32": "False"}, "matmul": {"allow_tf32": 1}},
                           "pip_packages": ["numpy==2.0", "torch==2.6.0"]}}
    assert header_torch_settings(header) == {"cudnn_allow_tf32": False, "matmul_allow_tf32": True,
                                             "torch_version": "2.6.0"}
    assert header_torch_settings({"run": {"float32_matmul_precision": "high"}}) == {
        "float32_matmul_precision": "high", "matmul_allow_tf32": True}
    assert header_torch_settings({"traceEvents": [], "deviceProperties": []}) == {}


@pytest.fixture(scope="module")
def fp32_trace():
    """One fp32 forward of a 512-wide linear layer, recorded on the CPU with PyTorch's default switches."""
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)
    with torch.no_grad(), memlens.record(model) as rec:
        model(torch.randn(256, 512))
    return rec.trace


def test_recording_keeps_the_switches_and_the_clock_says_them(fp32_trace):
    training_trace = fp32_trace
    said = training_trace.metadata["torch_settings"]
    assert said["matmul_allow_tf32"] is False and said["cudnn_allow_tf32"] is True      # this process's
    retimed = memlens.retime(training_trace, gpu="A100")
    assert retimed.metadata["clock"]["tf32"] == {"matmul": False, "conv": True, "source": "from the trace"}
    assert describe_clock(retimed.metadata["clock"]).endswith("; TF32 matmul off, conv on (from the trace)")
    forced = memlens.retime(training_trace, gpu="A100", tf32=True).metadata["clock"]
    assert forced["tf32"]["matmul"] is True and forced["device_busy_ns"] < retimed.metadata["clock"]["device_busy_ns"]


# ---- backend convolutions without a logged result ------------------------------------------------------
def test_conv_output_shape_by_hand():
    # 224 + 2*0 - 1*(16-1) - 1 = 208; 208 // 16 + 1 = 14
    assert conv_output_shape((128, 3, 224, 224), (768, 3, 16, 16), 16, 0) == (128, 768, 14, 14)
    # 32 + 2 - 2*2 - 1 = 29; 29 // 2 + 1 = 15 (dilation 2, padding 1, stride 2)
    assert conv_output_shape((2, 8, 32, 32), (16, 4, 3, 3), [2, 2], [1, 1], [2, 2], groups=2) == (2, 16, 15, 15)
    # transposed: (7 - 1) * 2 - 2 + (3 - 1) + 1 + 1 = 14; channels weight[1] x groups
    assert conv_output_shape((1, 8, 7, 7), (8, 4, 3, 3), 2, 1, 1, groups=2, transposed=True,
                             output_padding=1) == (1, 8, 14, 14)
    assert conv_output_shape((1, 3, 4, 4), (8, 3, 5, 5)) is None          # kernel larger than the input
    assert conv_output_shape((1, 3, 8, 8), (8, 3, 3, 3), 1, "same") == (1, 8, 8, 8)


def test_miopen_convolution_gets_its_result_and_flops():
    # schema order: self, weight, bias, padding, stride, dilation, groups (padding before stride)
    args = {"Input Dims": [[4, 3, 32, 32], [16, 3, 4, 4], [16], [], [], [], [], [], []],
            "Input type": ["c10::BFloat16"] * 3 + ["ScalarList"] * 3 + ["Int", "Bool", "Bool"],
            "Concrete Inputs": ["", "", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False"]}
    facts, own, known = signature_facts("aten::miopen_convolution", args)
    # (32 + 2 - 3 - 1) // 2 + 1 = 16
    assert facts.shapes == "bf16[4,3,32,32],bf16[16,3,4,4],bf16[16]->bf16[4,16,16,16]" and known
    assert facts.flops == 2 * 4 * 16 * 16 * 16 * 3 * 4 * 4
    assert facts.bytes_written == 4 * 16 * 16 * 16 * 2
    assert facts.bytes_read == (4 * 3 * 32 * 32 + 16 * 3 * 16 + 16) * 2
    cls, _, _ = cm.model_op(gpu("MI300X"), "aten::miopen_convolution", facts.flops, facts.bytes_read,
                            facts.bytes_written, facts.dtype, facts.shapes)
    assert cls == "gemm"
    # the recorder's path (a signature without a result) works it out the same way, defaults filled in
    again = op_costs("aten::miopen_convolution", (((4, 3, 32, 32), "bfloat16"), ((16, 3, 4, 4), "bfloat16"), None,
                                                  [0, 0], [1, 1], [1, 1], 1, False, False))
    assert again.shapes.endswith("->bf16[4,16,29,29]") and again.flops == 2 * 4 * 16 * 29 * 29 * 3 * 16


# ---- on the shared profiles -----------------------------------------------------------------------------
def _logged_args(path, name):
    with gzip.open(path) as f:
        return [e["args"] for e in json.load(f)["traceEvents"] if e.get("name") == name and e.get("ph") == "X"]


def test_mi300x_patch_convolution_priced_as_a_convolution(shared):
    """TimeSformer's 16x16 / stride-16 patch convolution on MI300X: priced from the backend op's own logged
    arguments it was 0 flops, an elementwise op at 0.03 of its measured 386 us (11.5 us); now within 0.7-1.4
    (393 us)."""
    path = shared("kineto/tracelens_mi300_timesformer_base.json.gz")
    (args,) = _logged_args(path, "aten::miopen_convolution")
    facts, _, known = signature_facts("aten::miopen_convolution", args)
    assert known and facts.shapes.endswith("->bf16[128,768,14,14]")
    assert facts.flops == 2 * 128 * 768 * 14 * 14 * 3 * 16 * 16
    ops = memlens.load(path).ops
    measured = float(ops.loc[ops["name"] == "aten::miopen_convolution", "kernel_busy_ns"].iloc[0])
    cls, _, ns = cm.model_op(gpu("MI300X"), "aten::miopen_convolution", facts.flops, facts.bytes_read,
                             facts.bytes_written, facts.dtype, facts.shapes)
    assert cls == "gemm" and 0.7 <= ns / measured <= 1.4


@pytest.mark.parametrize("profile, gpu, band", [("tracelens_h100_bert_small", "H100", (0.9, 1.3)),
                                                ("tracelens_mi300_bert_small", "MI300X", (0.85, 1.2))])
def test_30522_wide_decoder_gemm_in_band(shared, profile, gpu, band):
    """bert-small's vocabulary product (30522 wide, bf16: 4-byte loads): the H100 runs an sm80 ``align2``
    kernel (no TMA below 16 bytes: the whole penalty), the MI300X 3/7 of it."""
    trace = memlens.load(shared(f"kineto/{profile}.json.gz"))
    retimed = memlens.retime(trace, gpu=gpu)
    pick = trace.ops["shapes"].str.endswith("->bf16[141,30522]") & (trace.ops["flops"] > 0)
    ratio = retimed.ops.loc[pick, "device_self_ns"].sum() / trace.ops.loc[pick, "kernel_busy_ns"].sum()
    assert band[0] <= ratio <= band[1]
