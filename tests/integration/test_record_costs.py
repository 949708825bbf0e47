"""Per-op cost facts: formulas checked against hand-computed numbers, the signature path the recorder
uses, deduplication, and the columns a recorded trace carries (and an old trace still loads without)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import memlens
from memlens.recording.costs import (CostCache, TensorMeta, dtype_name, facts_table, op_costs, resolve_op,
                                  shapes_string, signature_value)

BF16, F32 = torch.bfloat16, torch.float32


def test_addmm_flops_and_bytes_by_hand():
    # y[141, 2048] = b[2048] + x[141, 512] @ w[512, 2048] in bf16
    f = op_costs("aten::addmm", ((( 2048,), BF16), ((141, 512), BF16), ((512, 2048), BF16)),
                 out=((141, 2048), BF16))
    assert f.flops == 2 * 141 * 512 * 2048
    assert f.bytes_read == 2 * (2048 + 141 * 512 + 512 * 2048)
    assert f.bytes_written == 2 * 141 * 2048
    assert f.dtype == "bfloat16"
    assert f.shapes == "bf16[2048],bf16[141,512],bf16[512,2048]->bf16[141,2048]"


def test_bmm_and_conv_flops_need_the_scalars():
    bmm = op_costs(torch.ops.aten.bmm.default, (((8, 141, 64), F32), ((8, 64, 141), F32)), out=((8, 141, 141), F32))
    assert bmm.flops == 2 * 8 * 141 * 64 * 141
    # conv 3x3, 16 -> 32 channels, 8x8 output, batch 2: 2 * N * Cout * Hout * Wout * Cin * kh * kw
    args = (((2, 16, 8, 8), F32), ((32, 16, 3, 3), F32), None, (1, 1), (1, 1), (1, 1), False, (0, 0), 1)
    conv = op_costs("aten::convolution", args, out=((2, 32, 8, 8), F32))
    assert conv.flops == 2 * 2 * 32 * 8 * 8 * 16 * 3 * 3
    # the same weights transposed: the formula changes with the `transposed` scalar
    targs = (((2, 32, 8, 8), F32), ((32, 16, 3, 3), F32), None, (1, 1), (1, 1), (1, 1), True, (0, 0), 1)
    tconv = op_costs("aten::convolution", targs, out=((2, 16, 8, 8), F32))
    assert tconv.flops == 2 * 2 * 32 * 8 * 8 * 16 * 3 * 3


def test_cpu_flash_attention_counts_like_cuda_sdpa():
    q = ((1, 8, 141, 64), BF16)
    f = op_costs("aten::_scaled_dot_product_flash_attention_for_cpu", (q, q, q, 0.0, False),
                 out=(q, ((1, 8, 141), F32)))
    assert f.flops == 4 * 1 * 8 * 141 * 141 * 64     # QK^T and PV, 2 flops per multiply-add
    assert f.dtype == "bfloat16"


def test_inplace_reads_and_writes_self_out_is_written_not_read():
    x = ((1000,), F32)
    inplace = op_costs("aten::add_.Tensor", (x, x), out=x)
    assert inplace.bytes_read == 8000 and inplace.bytes_written == 4000   # self once, not again as result
    out_variant = op_costs("aten::add.out", (x, x), {"out": x}, out=x)
    assert out_variant.bytes_read == 8000 and out_variant.bytes_written == 4000


def test_views_and_allocations_cost_nothing_fills_write():
    x = ((64, 64), F32)
    assert op_costs("aten::view", (x, (4096,)), out=((4096,), F32))[:3] == (0, 0, 0)
    assert op_costs("aten::empty_like", (x,), out=x)[:3] == (0, 0, 0)
    zeros = op_costs("aten::zeros_like", (x,), out=x)
    assert (zeros.bytes_read, zeros.bytes_written) == (0, 64 * 64 * 4)


def test_batch_norm_running_stats_count_as_writes():
    x, c = ((4, 8, 5, 5), F32), ((8,), F32)
    f = op_costs("aten::native_batch_norm", (x, c, c, c, c, True, 0.1, 1e-5), out=(x, c, c))
    # schema-omitted writes of running mean/var (2 x 32 B) + 3 fresh results
    assert f.bytes_written == 2 * 32 + (4 * 8 * 5 * 5 * 4 + 32 + 32)


def test_dtype_names_and_kineto_spellings():
    assert dtype_name(torch.bfloat16) == dtype_name("c10::BFloat16") == dtype_name("torch.bfloat16") == "bfloat16"
    assert dtype_name("float") == "float32" and dtype_name("long int") == "int64"
    # metas with Kineto dtype strings give the same facts as torch dtypes
    a = op_costs("aten::mm", (((4, 8), "c10::BFloat16"), ((8, 2), "c10::BFloat16")), out=((4, 2), "c10::BFloat16"))
    b = op_costs("aten::mm", (((4, 8), BF16), ((8, 2), BF16)), out=((4, 2), BF16))
    assert a == b


def test_mixed_dtypes_dominant_is_the_largest_float_argument():
    f = op_costs("aten::index_select", (((30522, 512), BF16), 0, ((141,), torch.int64)), out=((141, 512), BF16))
    assert f.dtype == "bfloat16"
    assert f.bytes_read == 30522 * 512 * 2 + 141 * 8     # what is passed (an upper bound for a gather)


def test_long_tensor_lists_are_shortened():
    metas = [TensorMeta((10,), F32)] * 5
    s = shapes_string((metas,), {}, None)
    assert s == "[f32[10],f32[10],f32[10],...+2]"


def test_resolve_op_spellings():
    assert resolve_op("aten::add.Tensor") is torch.ops.aten.add.Tensor
    assert resolve_op("aten.mm") is torch.ops.aten.mm.default
    assert resolve_op("aten::no_such_op") is None
    assert op_costs("aten::no_such_op", (((3,), F32),), out=((3,), F32)).bytes_read == 12


def test_signature_value_of_real_tensors_matches_metas():
    x = torch.randn(3, 4, dtype=BF16)
    sig = signature_value((x, [x, 2], 1.5, None))
    assert sig == (((3, 4), BF16), (((3, 4), BF16), 2), 1.5, None)
    hash(sig)


def test_cache_deduplicates_and_table_matches_single_calls():
    cache = CostCache()
    a = (((2, 3), F32), ((3, 4), F32))
    i = cache.index(("mm", a), "aten::mm", a, {}, ((2, 4), F32))
    j = cache.index(("mm", a), "aten::mm", a, {}, ((2, 4), F32))
    k = cache.index(("add", a[:1]), "aten::add.Tensor", a[:1] * 2, {}, ((2, 3), F32))
    assert i == j == 0 and k == 1 and len(cache) == 2
    table = cache.facts()
    assert table["flops"].tolist() == [2 * 2 * 3 * 4, 0]
    assert table.dtypes["flops"] == np.int64
    assert facts_table([]).empty


def _bert_block(x, w_qkv, w_o, ln_w, ln_b):
    qkv = F.linear(x, w_qkv)
    q, k, v = qkv.view(1, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 16, 32)
    return F.layer_norm(x + F.linear(a, w_o), (32,), ln_w, ln_b)


def test_recorded_trace_carries_cost_columns_and_views_cost_zero(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 32, generator=g)
    w_qkv, w_o = torch.randn(96, 32, generator=g), torch.randn(32, 32, generator=g)
    ln_w, ln_b = torch.ones(32), torch.zeros(32)
    with torch.no_grad(), memlens.record() as rec:
        for _ in range(3):
            _bert_block(x, w_qkv, w_o, ln_w, ln_b)
    ops = rec.trace.ops
    for col, dtype in (("flops", np.int64), ("bytes_read", np.int64), ("bytes_written", np.int64)):
        assert ops[col].dtype == dtype
    mm = ops[ops["name"].isin(["aten::mm", "aten::addmm"])]
    # the QKV projection: 16 tokens x 32 -> 96 (2 flops per multiply-add); the output projection 32 -> 32
    assert sorted(set(mm["flops"])) == [2 * 16 * 32 * 32, 2 * 16 * 32 * 96]
    assert (mm["dtype"] == "float32").all()
    attn = ops[ops["name"].str.contains("scaled_dot_product")]
    assert (attn["flops"] == 4 * 4 * 16 * 16 * 8).all()
    views = ops[ops["name"].isin(["aten::view", "aten::permute", "aten::transpose", "aten::t", "aten::unbind"])]
    assert len(views) and (views[["flops", "bytes_read", "bytes_written"]] == 0).all().all()
    ln = ops[ops["name"] == "aten::native_layer_norm"]
    assert (ln["bytes_read"] == 4 * (16 * 32 + 32 + 32)).all()
    assert ln["shapes"].iloc[0].startswith("f32[1,16,32],")
    # three identical iterations: identical facts per position
    per_iter = len(ops) // 3
    a, b = ops.iloc[:per_iter], ops.iloc[per_iter:2 * per_iter]
    assert a["flops"].tolist() == b["flops"].tolist() and a["shapes"].tolist() == b["shapes"].tolist()
    # saved and loaded unchanged
    back = memlens.load(rec.trace.save(tmp_path / "run.memlens"))
    pd.testing.assert_frame_equal(back.ops[["flops", "bytes_read", "bytes_written", "dtype", "shapes"]],
                                  ops[["flops", "bytes_read", "bytes_written", "dtype", "shapes"]])


def test_a_trace_saved_without_cost_columns_still_loads(tmp_path):
    with torch.no_grad(), memlens.record() as rec:
        torch.randn(4, 4) @ torch.randn(4, 4)
    path = rec.trace.save(tmp_path / "run.memlens")
    # rewrite the ops table as an older memlens wrote it (no cost columns)
    import hashlib
    ops = pd.read_parquet(path / "ops.parquet").drop(columns=["flops", "bytes_read", "bytes_written", "dtype",
                                                              "shapes"])
    ops.to_parquet(path / "ops.parquet", index=False)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["tables"]["ops"]["sha256"] = hashlib.sha256((path / "ops.parquet").read_bytes()).hexdigest()
    if "bytes" in manifest["tables"]["ops"]:
        manifest["tables"]["ops"]["bytes"] = (path / "ops.parquet").stat().st_size
    (path / "manifest.json").write_text(json.dumps(manifest))
    back = memlens.load(path)
    assert (back.ops["flops"] == 0).all() and (back.ops["shapes"] == "").all()


def test_compiled_and_python_recorders_give_the_same_cost_facts():
    from memlens.recording import native
    if not native.available():
        pytest.skip("the compiled recorder cannot be built here")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    tables = {}
    for backend in ("python", "compiled"):
        model.zero_grad(set_to_none=True)          # the same step each time (no accumulation into .grad)
        with memlens.record(model, backend=backend) as rec:
            model(x).sum().backward()
        assert rec.trace.metadata["recorder"] == backend
        tables[backend] = rec.trace.ops[["name", "flops", "bytes_read", "bytes_written"]]
    pd.testing.assert_frame_equal(tables["python"], tables["compiled"])
    addmm = tables["compiled"][tables["compiled"]["name"] == "aten::addmm"]
    assert sorted(addmm["flops"]) == [2 * 8 * 32 * 4, 2 * 8 * 16 * 32]   # keyword-only beta/alpha handled
