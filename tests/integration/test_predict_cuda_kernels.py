"""memlens.predict: which CUDA kernels a prediction takes and the scratch memory they allocate.

The same kernel CUDA would pick (the foreach optimizer path, flash or memory-efficient attention by dtype and
GPU), and the blocks those kernels take from the caching allocator: sorted index_put's temporaries, the
reductions' global buffers and semaphores, the opt-in cuDNN workspace allowance (API and CLI), each checked
against expectations worked out by hand from the ATen source; and the cs336 model's peaks and sort
temporaries against its real CUDA snapshots. Predictions run in a child process (tests/_predict_cases.py).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from _predict_cases import ROOT, built_shim, run_child  # noqa: F401  (the shim fixture)


REAL = {  # from the real snapshots (memlens.simulate on them reproduces the recorded segments)
    "inference": ("snapshots/cs336_wedsonlin_medium_128_inference.pickle",),
    "training": ("snapshots/cs336_wedsonlin_medium_128_training.pickle",),
}


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.parametrize("kind", ["inference", "training"])
def test_cs336_matches_real_snapshot(kind, shared):
    path = shared(REAL[kind][0])
    import memlens
    from memlens.simulate import simulate
    real = simulate(memlens.load(path)).devices["cuda:0"]
    real_allocated, real_reserved = real.peak_allocated, real.recorded["peak_reserved"]
    r = run_child(f"""
from tests.workloads import cs336_lm
# the snapshots' 8,519,680-byte cuBLAS workspaces say: a pre-Hopper GPU (A100 class)
with memlens.predict(gpu="A100") as p:
    cs336_lm.{kind}_run()
b = p.trace.blocks
scratch = b[b.op.str.startswith(("index_put sort", "cub radix_sort")).fillna(False)]
last = scratch[scratch.alloc_op_id == scratch.alloc_op_id.max()] if len(scratch) else scratch
ev = sorted([(int(x.alloc_seq), "alloc", int(x.requested_size)) for x in last.itertuples()]
            + [(int(x.free_seq), "free", int(x.requested_size)) for x in last.itertuples()])
result = {{"allocated": p.peak_allocated_since_reset, "reserved": p.peak_reserved,
          "sort_calls": int(scratch.alloc_op_id.nunique()), "sort_events": [e[1:] for e in ev],
          "reduce_blocks": int(b.op.str.startswith("reduce ").fillna(False).sum())}}
""", timeout=1200)
    assert abs(r["allocated"] - real_allocated) / real_allocated < 0.005, (r, real_allocated)
    assert abs(r["reserved"] - real_reserved) / real_reserved < 0.02, (r, real_reserved)
    # The embedding lookup's backward sorts its token ids (index_put_with_sort_kernel): the real snapshot's
    # allocations made inside that kernel (read from their C++ frames), in order, against the modelled blocks
    # of the last predicted step (one lookup per step; 5 warm-up steps + the recorded one).
    import pickle
    with open(path, "rb") as f:
        snap = pickle.load(f)
    real_events = [("alloc" if e["action"] == "alloc" else "free", int(e["size"]))
                   for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested")
                   and any("index_put_with_sort_kernel" in fr["name"] for fr in e.get("frames", []))]
    assert [tuple(e) for e in r["sort_events"]] == real_events
    # ATen's reduce kernel takes no global buffer in this model (every reduction here keeps < 256 values per
    # thread after splitting over warps); the real snapshot agrees: no allocation from gpu_reduce_kernel
    real_reduce = sum(1 for e in snap["device_traces"][0] if e["action"] == "alloc"
                      and any("gpu_reduce_kernel" in fr["name"] for fr in e.get("frames", [])))
    assert r["reduce_blocks"] == 0 and real_reduce == 0
    if kind == "training":
        # 512 int64 token ids: five 4096-byte index temporaries and cub's 1-byte single-tile request
        assert sorted(s for a, s in real_events if a == "alloc") == [1, 4096, 4096, 4096, 4096, 4096]
        assert r["sort_calls"] == 6
    else:
        assert r["sort_calls"] == 0 and real_events == []


def test_optimizer_takes_cudas_foreach_path():
    r = run_child("""
import torch.nn as nn
def run(**opt_kwargs):
    with memlens.predict(gpu="H100") as p:
        model = nn.Sequential(*[nn.Linear(1024, 1024, bias=False) for _ in range(8)]).cuda()
        opt = torch.optim.AdamW(model.parameters(), **opt_kwargs)
        model(torch.randn(8, 1024, device="cuda")).sum().backward()
        opt.step()
    return p
default, loop = run(), run(foreach=False)
result = {"foreach_ops": int(default.trace.ops["name"].str.contains("_foreach_").sum()),
          "loop_foreach_ops": int(loop.trace.ops["name"].str.contains("_foreach_").sum()),
          "default": default.peak_allocated, "loop": loop.peak_allocated}
""")
    # on CUDA, AdamW defaults to foreach; fake parameters must not push it onto the per-parameter loop
    assert r["foreach_ops"] > 0 and r["loop_foreach_ops"] == 0
    # foreach computes sqrt(exp_avg_sq) for all 8 weights (4 MiB each) at once, the loop for one weight at a
    # time (plus its division's temporary): at least half the weights' worth more at the optimizer's peak
    assert r["default"] - r["loop"] >= 4 * (4 << 20)


def test_attention_uses_the_fused_kernel_cuda_would_pick():
    r = run_child("""
import torch.nn.functional as F
def run(dtype, gpu):
    with memlens.predict(gpu=gpu) as p:
        q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=dtype, requires_grad=True)
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    b = p.trace.blocks
    return {"ops": sorted(set(p.trace.ops["name"])), "largest": int(b[b.device == "cuda:0"]["requested_size"].max())}
result = {"bf16_h100": run(torch.bfloat16, "H100"), "fp32_h100": run(torch.float32, "H100"),
          "bf16_v100": run(torch.bfloat16, "V100")}
""")
    q_bytes_bf16, scores_bf16 = 8 * 1024 * 64 * 2, 8 * 1024 * 1024 * 2
    assert "aten::_scaled_dot_product_flash_attention" in r["bf16_h100"]["ops"]
    assert "aten::_scaled_dot_product_flash_attention_backward" in r["bf16_h100"]["ops"]
    # flash never materialises the 8 x 1024 x 1024 scores; the largest block is its backward's fp32 dq_accum
    # (1 x 1024 x 8 x 64 x 4 B: a q-sized tensor in fp32)
    assert r["bf16_h100"]["largest"] == 2 * q_bytes_bf16 < scores_bf16
    assert "aten::_scaled_dot_product_efficient_attention" in r["fp32_h100"]["ops"]
    # flash needs sm80; on a V100 bf16 goes to the memory-efficient kernel
    assert "aten::_scaled_dot_product_efficient_attention" in r["bf16_v100"]["ops"]


def test_sorted_index_put_temporaries_follow_atens_cuda_code():
    """index_put with accumulate (or under deterministic algorithms) sorts its indices on CUDA
    (Indexing.cu index_put_with_sort_kernel): its temporaries are modelled blocks, in the kernel's order.
    Expectations worked out by hand from the ATen/cub source (memlens/prediction/scratch/index_put.py docstring)."""
    r = run_child("""
def events(p):
    b = p.trace.blocks
    m = b[(b.source == "predict:model") & ~b.op.str.startswith("cublas")]
    ev = sorted([(int(x.alloc_seq), "alloc", int(x.requested_size)) for x in m.itertuples()]
                + [(int(x.free_seq), "free", int(x.requested_size)) for x in m.itertuples()])
    return [list(e[1:]) for e in ev], sorted(set(m.category))
with memlens.predict(gpu="A100") as p1:
    x = torch.zeros(100, 8, device="cuda")
    x.index_put_((torch.randint(0, 100, (3000,), device="cuda"),), torch.ones(3000, 8, device="cuda"), accumulate=True)
with memlens.predict(gpu="A100") as p2:
    x = torch.zeros(100, 50, 8, device="cuda")
    i = torch.randint(0, 50, (10, 20), device="cuda", dtype=torch.int32)
    x.index_put_((i, i), torch.ones(10, 20, 8, device="cuda"), accumulate=True)
with memlens.predict(gpu="A100") as p3:
    x = torch.zeros(10, 4, device="cuda")
    x[torch.arange(6, device="cuda")] = torch.ones(6, 4, device="cuda")
torch.use_deterministic_algorithms(True)
try:
    with memlens.predict(gpu="A100") as p4:
        x = torch.zeros(10, 4, device="cuda")
        x[torch.arange(6, device="cuda")] = torch.ones(6, 4, device="cuda")
finally:
    torch.use_deterministic_algorithms(False)
with memlens.predict(gpu="A100", kernel_scratch=False) as p5:
    x = torch.zeros(100, 8, device="cuda")
    x.index_put_((torch.randint(0, 100, (3000,), device="cuda"),), torch.ones(3000, 8, device="cuda"), accumulate=True)
result = {"p1": events(p1), "p2": events(p2), "p3": events(p3), "p4": events(p4), "p5": events(p5),
          "n1": p1.trace.metadata["prediction"]["kernel_scratch_blocks"]}
""")
    A, F = "alloc", "free"
    # 1) 3000 int64 indices, a user's index_put_ (range checked): max and min scalars (8 B each), remainder
    # (3000 x 8 = 24000 B) and index*stride (24000 B, the linear index), remainder freed; sorted_indices,
    # orig_indices, arange (24000 B each); 3000 > 2304 (one cub tile of 8-byte pairs): the multi-pass sort's
    # two alternate buffers, 2 x 24000 B; then freed in reverse, the linear index last.
    n = 24000
    assert r["p1"][0] == [[A, 8], [F, 8], [A, 8], [F, 8], [A, n], [A, n], [F, n], [A, n], [A, n], [A, n],
                          [A, 2 * n], [F, 2 * n], [F, n], [F, n], [F, n], [F, n]]
    assert r["p1"][1] == ["workspace"] and r["n1"] == 8   # max, min, remainder, linear, sorted, orig, range, cub
    # 2) two int32 index tensors of 10 x 20 = 200 elements: each converted to int64 first (1600 B, kept);
    # per tensor: max/min checks, remainder + product (1600 B each), remainder freed; the second product is
    # added into the first and freed; sorted/orig/arange (1600 B); 200 items fit one tile: cub asks for 1 byte.
    m = 1600
    per_index = [[A, 8], [F, 8], [A, 8], [F, 8], [A, m], [A, m], [F, m]]
    assert r["p2"][0] == ([[A, m], [A, m]] + per_index + per_index + [[F, m]]
                          + [[A, m], [A, m], [A, m], [A, 1], [F, 1], [F, m], [F, m], [F, m], [F, m], [F, m], [F, m]])
    # 3) setitem without accumulate and without deterministic algorithms: the unsorted kernel, no temporaries
    assert r["p3"][0] == []
    # 4) the same under torch.use_deterministic_algorithms(True): the sorted path, 6 int64 indices (48 B)
    k = 48
    assert r["p4"][0] == [[A, 8], [F, 8], [A, 8], [F, 8], [A, k], [A, k], [F, k], [A, k], [A, k], [A, k],
                          [A, 1], [F, 1], [F, k], [F, k], [F, k], [F, k]]
    # 5) switched off
    assert r["p5"][0] == []


def test_cudnn_workspace_allowance_is_off_by_default_and_transient_per_conv_call():
    r = run_child("""
def run(**kw):
    with memlens.predict(gpu="A100", **kw) as p:
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 3)).cuda()
        m(torch.randn(4, 3, 32, 32, device="cuda")).sum().backward()
        with torch.inference_mode():        # conv2d reaches the recorder whole here
            m(torch.randn(4, 3, 32, 32, device="cuda"))
    b = p.trace.blocks
    ws = b[b.op.str.startswith("cudnn workspace")]
    ops = p.trace.ops.set_index("op_id")
    inside = all(ops.loc[x.alloc_op_id, "start_ns"] <= x.alloc_ns < x.free_ns <= ops.loc[x.alloc_op_id, "end_ns"]
                 for x in ws.itertuples())
    return {"n": len(ws), "sizes": sorted(set(ws.requested_size.tolist())), "inside": inside,
            "ops": sorted(ops.loc[ws.alloc_op_id, "name"].tolist()), "peak": p.peak_allocated}
base, ws, fn = run(), run(cudnn_workspace="64MiB"), run(cudnn_workspace=lambda op: 1 << 20)
try:
    memlens.predict(gpu="A100", cudnn_workspace="lots")
    bad = None
except memlens.errors.InputError as exc:
    bad = str(exc)
result = {"base": base, "ws": ws, "fn": fn, "bad": bad}
""")
    # off by default: no block at all
    assert r["base"]["n"] == 0
    # 2 convolutions forward + 2 convolution_backward + 2 conv2d under inference_mode: one allowance each
    assert r["ws"]["n"] == 6 and r["ws"]["sizes"] == [64 << 20] and r["ws"]["inside"]
    assert r["ws"]["ops"] == sorted(["aten::convolution"] * 2 + ["aten::convolution_backward"] * 2
                                    + ["aten::conv2d"] * 2)
    # transient: the peak rises by at most one allowance (never two at once), and by some of it
    assert 0 < r["ws"]["peak"] - r["base"]["peak"] <= 64 << 20
    assert r["fn"]["n"] == 6 and r["fn"]["sizes"] == [1 << 20]
    assert r["bad"] and "cudnn_workspace" in r["bad"]


def test_reduction_global_buffers_follow_setreduceconfig():
    """CUDA reductions that split one output across CTAs take a staging buffer and semaphores from the caching
    allocator (Reduce.cuh). Expectations worked out by hand from setReduceConfig's rule (A100: 108 SMs, H100:
    132, both 2048 threads per SM)."""
    r = run_child("""
def scratch(gpu, fn):
    with memlens.predict(gpu=gpu) as p:
        fn()
    b = p.trace.blocks
    m = b[b.op.str.startswith("reduce ")].sort_values("alloc_seq")
    return [[o.split(" (")[0], int(s)] for o, s in zip(m.op, m.requested_size)]
cols = lambda: torch.randn(8192, 4096, device="cuda").sum(0)
rows = lambda: torch.randn(512, 10000, device="cuda").amax(-1)
full = lambda: torch.randn(2 ** 21, device="cuda").sum()
tall = lambda: torch.randn(65536, 8, device="cuda").max(0)
# logits of 4 x 128 tokens over a 10000 vocabulary laid out vocab-major (as a transposed matmul leaves them)
rowmax = lambda: torch.randn(10000, 4, 128, device="cuda").permute(1, 2, 0).max(-1)
result = {"rowmax": scratch("H100", rowmax), "cols_h100": scratch("H100", cols), "cols_a100": scratch("A100", cols), "rows": scratch("A100", rows),
          "full": scratch("A100", full), "tall": scratch("A100", tall)}
""")
    # (8192, 4096).sum(0): 4096 outputs of 8192 inputs, reduced dim not the fastest -> outputs vectorised by 4
    # (1024 left), at most 512/4 = 128 threads: block 32 x 4; outputs split over the 32 lanes; 8192 values >= 64
    # -> inputs split over the 4 warps: 2048 values per thread >= 256, grid 4096/4/32 = 32 CTAs. H100: 128-thread
    # blocks, 16 per SM, target 132 x 16 = 2112 -> ctas = max(min(ceil(2112/32)=66, 2048/16=128), 2048/256=8) = 66;
    # buffer = 4 B (float) x 4096 outputs x 66 x (32 lanes x 4 vector) = 138,412,032 B; semaphores 4 B x 32.
    assert r["cols_h100"] == [["reduce global buffer", 138412032], ["reduce semaphores", 128]]
    # A100: target 108 x 16 = 1728 -> ctas = 54: 4 x 4096 x 54 x 128 = 113,246,208 B
    assert r["cols_a100"] == [["reduce global buffer", 113246208], ["reduce semaphores", 128]]
    # (512, 10000).amax(-1): reduce along the fastest dim, vectorised input 10000/4 = 2500, block 32 x 16;
    # 10000/32 = 313 values >= 256 -> split over the 16 warps: 10000/512 = 20 values < 256: one CTA, no buffer
    assert r["rows"] == []
    # 2^21 elements summed to one: block 512 x 1, 2^21/512 = 4096 values, grid 1 <= 108 x 4 = 432 ->
    # ctas = max(min(432, 4096/16=256), 16) = 256; buffer 4 B x 1 x 256 = 1024 B (lanes reduce in-block); sem 4 B
    assert r["full"] == [["reduce global buffer", 1024], ["reduce semaphores", 4]]
    # (65536, 8).max(0): value+index pairs (16 B), 8 outputs vectorised by 4 -> 2, block 2 x 64 (128 threads),
    # 65536 values per output -> split over warps: 1024 values; grid ceil(2/2) = 1 <= 1728 ->
    # ctas = max(min(1728, 64), 4) = 64; buffer 16 x 8 x 64 x (2 x 4) = 65,536 B; sem 4 B
    assert r["tall"] == [["reduce global buffer", 65536], ["reduce semaphores", 4]]
    # the "157 MiB for a loss's row max at 4x128 tokens" (a real run): 512 outputs (stride 1) of 10000
    # values (stride 512), value+index pairs. Outputs vectorised by 4 -> 128, block 32 x 4, outputs over lanes,
    # 10000 >= 64 -> inputs over 4 warps: 2500 values; grid 512/4/32 = 4 <= 2112 ->
    # ctas = max(min(528, ceil(2500/16) = 157), 10) = 157; 16 B x 512 x 157 x (32 x 4) = 164,626,432 B = 157 MiB
    assert r["rowmax"] == [["reduce global buffer", 164626432], ["reduce semaphores", 16]]


def test_cli_predict_cudnn_allowance_and_bad_size(tmp_path):
    script = tmp_path / "cnn.py"
    script.write_text(textwrap.dedent("""
        import torch
        conv = torch.nn.Conv2d(3, 8, 3).cuda()
        conv(torch.randn(2, 3, 16, 16, device="cuda")).sum().backward()
    """))
    out = tmp_path / "cnn.memlens"
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "memlens", "predict", "--gpu", "A100", "--json", "--out", str(out)]
    proc = subprocess.run(cmd + ["--cudnn-workspace", "16MiB", "--", "python", str(script)], capture_output=True,
                          text=True, cwd=ROOT, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import memlens
    blocks = memlens.load(out).blocks
    ws = blocks[blocks["op"].str.startswith("cudnn workspace").fillna(False)]
    # one forward convolution and one convolution_backward: one 16 MiB allowance each, freed inside the op
    assert ws["requested_size"].tolist() == [16 << 20, 16 << 20] and ws["free_ns"].notna().all()
    bad = subprocess.run(cmd + ["--cudnn-workspace", "lots", "--", "python", str(script)], capture_output=True,
                         text=True, cwd=ROOT, timeout=600, env=env)
    assert bad.returncode == 2 and "cudnn_workspace" in bad.stderr and "Traceback" not in bad.stderr
