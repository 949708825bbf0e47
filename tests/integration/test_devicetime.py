"""Device time: the GPU table, each cost-model rule (against hand-computed numbers), retime's
self-consistency on recorded training steps, and the model against real H100 / MI300X kernels."""
from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

import memlens
from memlens.devicetime import costmodel as cm
from memlens.devicetime.gpus import GPU, gpu
from memlens.errors import InputError

# a round-number device: 1 PFLOP/s bf16, 1 TB/s, 4 compute units, 1 us floors, no efficiency losses
TOY = GPU(name="toy", flops={"bf16": 1e15, "fp32": 1e14}, mem_bw=1e12, launch_ns=1000.0, compute_units=4,
          gemm_floor_ns=2000.0, gemm_k_ns=0.01, attention_floor_ns=3000.0, gemm_efficiency=1.0,
          attention_efficiency=1.0, mem_efficiency=1.0, misaligned_gemm_penalty=2.0)


# ---- the GPU table ---------------------------------------------------------------------------------
def test_builtin_gpus_have_sources_and_datasheet_peaks():
    table = memlens.gpus()
    for name in ("H100 SXM", "H100 PCIe", "H200", "A100 SXM 80GB", "L4", "V100 SXM2 32GB", "MI300X"):
        assert name in set(table["name"])
    assert table["source"].str.len().gt(10).all() and table["latency_source"].str.len().gt(10).all()
    h100 = table.set_index("name").loc["H100 SXM"]
    assert h100["bf16_flops"] == pytest.approx(989.4e12) and h100["mem_bw"] == pytest.approx(3.35e12)
    assert table.set_index("name").loc["MI300X", "bf16_flops"] == pytest.approx(1307.4e12)
    # H200 = H100 compute with faster memory
    h200 = table.set_index("name").loc["H200"]
    assert h200["bf16_flops"] == h100["bf16_flops"] and h200["mem_bw"] > h100["mem_bw"]


def test_gpu_lookup_aliases_and_fallback_rates():
    assert gpu("h100").name == gpu("H100-SXM").name == "H100 SXM"
    assert gpu("mi300").name == "MI300X"
    with pytest.raises(InputError, match="unknown GPU"):
        gpu("H900")
    v100 = gpu("V100")
    assert v100.peak_flops("bfloat16") == v100.flops["fp32"]          # no bf16 tensor cores
    a100 = gpu("A100")
    assert a100.peak_flops("float32") == 19.5e12 and a100.peak_flops("float32", tf32=True) == 156e12
    assert a100.peak_flops("float8_e4m3fn") == a100.flops["fp16"]       # no fp8 on Ampere


def test_custom_gpu_accepts_torch_dtype_keys():
    g = GPU(name="x", flops={torch.bfloat16: 4e14, "float32": 5e13}, mem_bw=1e12)
    assert g.flops == {"bf16": 4e14, "fp32": 5e13} and g.peak_flops("bfloat16") == 4e14


def test_custom_gpu_is_validated():
    with pytest.raises(InputError, match="unknown flops keys"):
        GPU(name="x", flops={"bf17": 1.0}, mem_bw=1e12)
    with pytest.raises(InputError, match="host_bw"):
        GPU(name="x", flops={"fp32": 1e12}, mem_bw=1e12, host_bw=(1e9,))
    with pytest.raises(InputError, match="mem_efficiency"):
        GPU(name="x", flops={"fp32": 1e12}, mem_bw=1e12, mem_efficiency=1.5)


# ---- the cost model, rule by rule ---------------------------------------------------------------------
def _model(name, flops, read, written, shapes, dtype="bfloat16", g=TOY):
    return cm.model_op(g, name, flops, read, written, dtype, shapes)


def test_views_and_allocations_launch_nothing():
    assert _model("aten::view", 0, 0, 0, "") == ("none", 0, 0.0)
    assert _model("aten::empty_like", 0, 0, 0, "bf16[4]->bf16[4]") == ("none", 0, 0.0)


def test_elementwise_is_one_floor_plus_bytes_at_bandwidth():
    # 1 MB read + 0.5 MB written at 1 TB/s = 1.5 us, plus the 1 us floor
    cls, kernels, ns = _model("aten::add.Tensor", 0, 1_000_000, 500_000, "bf16[250000],bf16[250000]->bf16[250000]")
    assert (cls, kernels) == ("elementwise", 1) and ns == pytest.approx(2500.0)
    # a tiny op is all floor: the roofline would say ~0
    assert _model("aten::add.Tensor", 0, 8, 4, "bf16[2],bf16[2]->bf16[2]")[2] == pytest.approx(1000.0, abs=1)


def test_normalization_and_reductions_pay_two_floors():
    # row-wise norms stream at norm_efficiency (TOY: the default 0.4): 2 MB / 0.4 TB/s = 5 us, plus 2 floors
    assert _model("aten::native_layer_norm", 0, 1_000_000, 1_000_000, "")[2] == pytest.approx(2000 + 5000)
    assert _model("aten::all", 0, 100, 1, "b8[100]->b8[]") [0] == "reduction"
    assert _model("aten::all", 0, 100, 1, "b8[100]->b8[]")[2] == pytest.approx(2000.1, rel=1e-3)


def test_several_kernels_pay_one_floor_each():
    cls, kernels, ns = _model("aten::native_layer_norm_backward", 0, 0, 1000, "")
    assert kernels == cm.MULTI_KERNEL["aten::native_layer_norm_backward"] == 2
    assert ns == pytest.approx((kernels + 1) * 1000 + 1000 / 0.4e12 * 1e9)


def test_gather_counts_rows_fetched_not_the_table():
    # a 100 MB table, 10 rows of 1 KB fetched: 10 KB out + 80 B of indices
    shapes = "bf16[50000000,512],i64[10]->bf16[10,512]"
    cls, _, ns = _model("aten::embedding", 0, 100_000_080, 10_240, shapes)
    assert cls == "gather"
    assert ns == pytest.approx(2 * 1000 + (2 * 10_240 + 80) / 1e12 * 1e9)


def test_foreach_launches_one_kernel_per_group_of_tensors():
    shapes = "[f32[10],f32[10],f32[10],...+197]->"     # 200 tensors in one list: 110 per launch
    cls, kernels, ns = _model("aten::_foreach_mul_.Scalar", 0, 8000, 8000, shapes, dtype="float32")
    assert (cls, kernels) == ("foreach", 2)
    two_lists = "[f32[10],f32[10],f32[10],...+97],[f32[10],f32[10],f32[10],...+97]->"
    assert _model("aten::_foreach_add_.List", 0, 8000, 4000, two_lists, dtype="float32")[1] == 2   # 64 per launch


def test_item_is_one_small_transfer():
    assert _model("aten::_local_scalar_dense", 0, 2, 0, "b8[]") == ("transfer", 1, 1000.0)


def test_large_gemm_reaches_the_peak_and_small_gemm_is_latency_bound():
    g = replace(gpu("H100"))
    n = 8192
    flops = 2 * n ** 3
    shapes = f"bf16[{n},{n}],bf16[{n},{n}]->bf16[{n},{n}]"
    _, _, big = _model("aten::mm", flops, 2 * 2 * n * n, 2 * n * n, shapes, g=g)
    ideal = flops / (g.flops["bf16"] * g.gemm_efficiency) * 1e9
    assert ideal <= big - g.gemm_floor_ns <= 1.1 * ideal          # within wave quantization of the peak
    small_shapes = "bf16[16,16],bf16[16,16]->bf16[16,16]"
    _, _, small = _model("aten::mm", 2 * 16 ** 3, 1024, 512, small_shapes, g=g)
    assert small == pytest.approx(g.gemm_floor_ns + 16 * g.gemm_k_ns, rel=0.01)
    # the naive roofline of the small GEMM is ~0 ns: the model is orders of magnitude above it
    assert cm.roofline_op(g, 2 * 16 ** 3, 1536, "bfloat16") < 1.0


def test_gemm_wave_quantization_and_k_latency():
    # TOY has 4 compute units: a 256x256 output is exactly one wave of 128x128 tiles; 256x384 needs more
    k = 4096
    one = _model("aten::mm", 2 * 256 * 256 * k, 0, 0, f"bf16[256,{k}],bf16[{k},256]->bf16[256,256]")[2]
    more = _model("aten::mm", 2 * 256 * 384 * k, 0, 0, f"bf16[256,{k}],bf16[{k},384]->bf16[256,384]")[2]
    per_flop_one = (one - TOY.gemm_floor_ns) / (256 * 256)
    per_flop_more = (more - TOY.gemm_floor_ns) / (256 * 384)
    assert per_flop_more > 1.05 * per_flop_one          # the extra half wave costs more than its flops
    # one wave of 128x128 tiles at full efficiency: 2*128*128*K flops per unit at 1/4 of the peak
    assert one - TOY.gemm_floor_ns == pytest.approx(2 * 128 * 128 * k / (1e15 / 4) * 1e9, rel=1e-6)


def test_misaligned_gemm_pays_the_penalty_on_compute():
    k = 4096
    aligned = _model("aten::mm", 2 * 256 * 256 * k, 0, 0, f"bf16[256,{k}],bf16[{k},256]->bf16[256,256]")[2]
    odd = _model("aten::mm", 2 * 256 * 255 * k, 0, 0, f"bf16[256,{k}],bf16[{k},255]->bf16[256,255]")[2]
    assert odd - TOY.gemm_floor_ns == pytest.approx(2 * (aligned - TOY.gemm_floor_ns), rel=1e-6)


def test_attention_is_floor_plus_key_blocks():
    def attn(s):
        shapes = f"bf16[1,2,{s},64],bf16[1,2,{s},64],bf16[1,2,{s},64]->bf16[1,2,{s},64],f32[1,2,{s}]"
        return _model("aten::_scaled_dot_product_flash_attention", 4 * 2 * s * s * 64, 0, 0, shapes)[2]
    # 2 heads x (s / 128) query blocks <= 4 units: one wave; work grows with the key blocks
    w128, w256 = attn(128) - TOY.attention_floor_ns, attn(256) - TOY.attention_floor_ns
    assert w128 == pytest.approx(4 * 128 * 128 * 64 / (1e15 / 4) * 1e9)
    assert w256 == pytest.approx(2 * w128)
    assert cm.op_class("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"


def test_device_times_deduplicates_and_keeps_order():
    ops = pd.DataFrame({"name": ["aten::view", "aten::add.Tensor", "aten::view", "aten::add.Tensor"],
                        "flops": [0, 0, 0, 0], "bytes_read": [0, 1000, 0, 1000],
                        "bytes_written": [0, 500, 0, 500], "dtype": ["", "bfloat16", "", "bfloat16"],
                        "shapes": ["", "x", "", "x"]})
    dt = cm.device_times(ops, TOY)
    assert dt["device_ns"].tolist() == [0, 1002, 0, 1002] and dt["kernels"].tolist() == [0, 1, 0, 1]
    assert dt["op_class"].tolist() == ["none", "elementwise", "none", "elementwise"]


# ---- retime: self-consistency on recorded runs ----------------------------------------------------------
@pytest.fixture(scope="module")
def training_trace():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 8))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(16, 32)
    with memlens.record(model) as rec:
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            memlens.step()
    return rec.trace


def _inside_lifetimes(trace):
    acc = trace.accesses.merge(trace.lifetimes()[["block_id", "start_ns", "end_ns", "alloc_ns", "free_ns"]],
                               on="block_id")
    lo = acc["alloc_ns"].isna() | (acc["t_ns"] >= acc["alloc_ns"].fillna(0))
    hi = acc["free_ns"].isna() | (acc["t_ns"] <= acc["free_ns"].fillna(0))
    return (lo & hi).to_numpy()


def test_retime_is_self_consistent(training_trace):
    t = training_trace
    r = memlens.retime(t, gpu="H100")
    ops, old = r.ops, t.ops
    # order kept, back to back, never overlapping, durations = device_ns
    order_old = np.lexsort((old["op_id"], old["start_ns"]))
    order_new = np.lexsort((ops["op_id"], ops["start_ns"]))
    assert (ops["op_id"].to_numpy()[order_new] == old["op_id"].to_numpy()[order_old]).all()
    s, e = ops["start_ns"].to_numpy()[order_new], ops["end_ns"].to_numpy()[order_new]
    assert (s[1:] == e[:-1]).all() and s[0] == 0
    assert ((ops["end_ns"] - ops["start_ns"]) == ops["device_ns"]).all()
    assert r.metadata["clock"]["device_busy_ns"] == ops["device_ns"].sum()
    # views launch nothing
    assert (ops.loc[ops["name"].isin(["aten::t", "aten::view", "aten::detach"]), "device_ns"] == 0).all()
    # accesses re-stamped inside their op: reads at its start, writes at its end
    acc = r.accesses.merge(ops[["op_id", "start_ns", "end_ns"]], on="op_id")
    assert (acc["t_ns"] == np.where(acc["is_write"], acc["end_ns"], acc["start_ns"])).all()
    # every access that was inside its block's lifetime still is
    before = _inside_lifetimes(t)
    after = _inside_lifetimes(r)
    assert before.all() and after.all()
    # same event order, so the same live-bytes curve and peak
    assert r.peak_live_bytes() == t.peak_live_bytes()
    assert (r.blocks["alloc_seq"] == t.blocks["alloc_seq"]).all()
    assert r.metadata["clock"]["kind"] == "modeled" and r.metadata["clock"]["gpu"] == "H100 SXM"
    assert t.metadata["clock"]["kind"] == "host"           # the input is untouched
    assert (r.ops["recorded_start_ns"] == old["start_ns"]).all()
    r.validate()


def test_retime_clock_depends_on_the_gpu_and_composes(training_trace):
    h100 = memlens.retime(training_trace, gpu="H100")
    l4 = memlens.retime(training_trace, gpu="L4")
    a100 = memlens.retime(training_trace, gpu="A100")
    # a launch-bound step: the older part's longer kernel floors show
    assert a100.metadata["clock"]["device_busy_ns"] > h100.metadata["clock"]["device_busy_ns"]
    # the CPU recording is far slower than the modeled GPU
    assert h100.duration_ns < training_trace.duration_ns
    again = memlens.retime(l4, gpu="H100")
    assert (again.ops["start_ns"] == h100.ops["start_ns"]).all()
    assert (again.accesses["t_ns"] == h100.accesses["t_ns"]).all()
    assert again.metadata["clock"]["from"] == "modeled"


def test_retime_needs_cost_facts(training_trace):
    bare = memlens.Trace.from_tables(training_trace.blocks, training_trace.accesses,
                                     training_trace.ops.drop(columns=["flops", "bytes_read", "bytes_written"]))
    with pytest.raises(InputError, match="cost facts"):
        memlens.retime(bare, gpu="H100")


def test_retime_with_a_custom_gpu(training_trace):
    custom = GPU(name="my accelerator", flops={"fp32": 50e12, "bf16": 400e12}, mem_bw=1e12, launch_ns=3000.0)
    r = memlens.retime(training_trace, gpu=custom)
    assert r.metadata["clock"]["gpu"] == "my accelerator"
    kernels = r.ops["kernels"].to_numpy()
    assert (r.ops["device_ns"].to_numpy()[kernels > 0] >= 3000).all()


# ---- against real kernels (shared TraceLens profiles) -------------------------------------------------
def test_model_matches_real_bert_small_kernels(shared):
    h100 = shared("kineto/tracelens_h100_bert_small.json.gz")
    mi300 = shared("kineto/tracelens_mi300_bert_small.json.gz")
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import device_time
    finally:
        sys.path.pop(0)
    trace = device_time.record_bert_small()
    for name, path in (("H100", h100), ("MI300X", mi300)):
        table = device_time.compare(trace, name, path).set_index("class")
        assert table.loc["total", "real_us"] == pytest.approx({"H100": 307.197, "MI300X": 388.344}[name], abs=0.01)
        assert abs(table.loc["total", "model_ratio"] - 1) <= 0.25, table
        for c in ("gemm", "attention", "normalization", "elementwise"):
            assert abs(table.loc[c, "model_ratio"] - 1) <= 0.35, (name, c, table)
        # and the naive roofline is far off (the issue: ~0.1x)
        assert table.loc["total", "roofline_ratio"] < 0.2


def test_optimizer_step_counters_read_on_the_host_cost_nothing():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
    opt = torch.optim.Adam(model.parameters(), foreach=True)
    x = torch.randn(4, 16)
    with memlens.record(model) as rec:
        model(x).sum().backward()
        opt.step()
    r = memlens.retime(rec.trace, gpu="H100")
    items = r.ops[r.ops["name"].str.startswith("aten::_local_scalar_dense")]
    assert len(items) and (items["phase"] == "optimizer").all()     # Adam's step counters
    assert (items["device_ns"] == 0).all() and (items["kernels"] == 0).all()
    foreach = r.ops[r.ops["op_class"] == "foreach"]
    assert len(foreach) >= 3 and (foreach["kernels"] >= 1).all()


def test_split_k_when_the_tiles_cannot_fill_the_device():
    # a weight-gradient-like GEMM: 768 x 768 output (36 tiles of 128x128 on 132 units), K = 8192
    g = gpu("H100")
    k = 8192
    flops = 2 * 768 * 768 * k
    _, _, ns = cm.model_op(g, "aten::mm", flops, 2 * 2 * 768 * k, 2 * 768 * 768, "bfloat16",
                           f"bf16[768,{k}],bf16[{k},768]->bf16[768,768]")
    # without splitting, one wave of 128x128 tiles would take the whole K loop at 0.7 of the per-unit peak
    one_wave = 2 * 128 * 128 * k / (g.flops["bf16"] * g.gemm_efficiency / g.compute_units) * 1e9
    assert ns < g.gemm_floor_ns + one_wave
    # and never faster than the whole device at its achieved peak
    assert ns > g.gemm_floor_ns + flops / (g.flops["bf16"] * g.gemm_efficiency) * 1e9


def test_devicetime_sits_between_trace_and_the_analyses():
    """devicetime never imports an analysis or anything above; the recorder, io and the shared clock
    helpers never import devicetime (they use memlens.clock / memlens.gpu_activity below it)."""
    import ast
    from pathlib import Path
    root = Path(memlens.__file__).resolve().parent
    above = ("memlens.analysis", "memlens.viz", "memlens.reporting", "memlens.widgets", "memlens.commands",
             "memlens.simulate", "memlens.plan", "memlens.swap", "memlens.whatif", "memlens.diff",
             "memlens.magics", "memlens.cli")
    rules = {root / "devicetime": above,
             root / "recording": ("memlens.devicetime",) + above,
             root / "io": ("memlens.devicetime",) + above}
    files = {f: banned for d, banned in rules.items() for f in d.glob("*.py")}
    files.update({root / "clock.py": ("memlens.devicetime",) + above,
                  root / "gpu_activity.py": ("memlens.devicetime", "memlens.recording") + above})
    bad = []
    for f, banned in files.items():
        for node in ast.walk(ast.parse(f.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [f"{f.name}: {n}" for n in names if n.startswith(banned)]
    assert not bad, bad
