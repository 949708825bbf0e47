"""The blocks memlens itself adds to or moves within a prediction carry their real category: the modelled
cuBLAS workspaces and kernel temporaries are ``workspace``, and parameters a step builds on the CPU and moves
onto the GPU are ``parameter`` on the CPU too (the copy op links each original to its GPU parameter). Checked
against the sizes computed by hand, and the predicted peak's top category is never "unknown".
Predictions run in a child (tests/_predict_cases.py).
"""
from __future__ import annotations

from _predict_cases import built_shim, run_child  # noqa: F401  (built_shim: the module fixture)


def test_workspaces_and_moved_in_parameters_have_their_categories():
    r = run_child("""
from memlens.analysis.peak_cause import peak_cause
def step():
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    torch.nn.init.normal_(model[0].weight)           # initialised on the CPU, then moved in
    model.cuda()
    model(torch.randn(8, 256, device="cuda")).sum().backward()
    x = torch.zeros(100, 8, device="cuda")           # an accumulating index_put_: modelled sort temporaries
    x.index_put_((torch.randint(0, 100, (3000,), device="cuda"),), torch.ones(3000, 8, device="cuda"),
                 accumulate=True)
p = memlens.predict(step, gpu="H100")
b = p.trace.blocks
model = b[b.source == "predict:model"]
cause = peak_cause(p.trace)["cuda:0"]
result = {"cublas": sorted(model.loc[model.op.str.startswith("cublas"), "size"].tolist()),
          "model_categories": sorted(set(model.category)), "scratch": int((~model.op.str.startswith("cublas")).sum()),
          "scratch_bytes": int(model.loc[~model.op.str.startswith("cublas"), "size"].sum()),
          "ws_bytes": p.gpu.cublas_workspace,
          "cpu": sorted(zip(b.loc[b.device == "cpu", "category"], b.loc[b.device == "cpu", "size"].astype(int))),
          "by_category": {k: int(v) for k, v in cause.by_category.items()}}
""")
    # two cuBLAS workspaces (the main thread's forward GEMMs, autograd's device thread's backward GEMMs),
    # 32 MiB each on an H100, and the index_put_ sort's temporaries: all "workspace"
    assert r["ws_bytes"] == 32 * 2**20 and r["cublas"] == [r["ws_bytes"]] * 2
    assert r["model_categories"] == ["workspace"] and r["scratch"] > 0
    # the four CPU-built tensors, fp32: weights 1024x256 and 256x1024, biases 1024 and 256 elements
    assert [tuple(c) for c in r["cpu"]] == sorted([("parameter", 1024 * 256 * 4), ("parameter", 256 * 1024 * 4),
                                                  ("parameter", 1024 * 4), ("parameter", 256 * 4)])
    # at the peak (inside the sort), the 64 MiB of cuBLAS workspaces and some of the sort's temporaries lead;
    # "unknown" holds only the user's own tensors made outside any module: x (100x8 fp32), the indices (3000
    # int64) and the values (3000x8 fp32), each rounded up to 512 bytes as the caching allocator does
    by = r["by_category"]
    assert max(by, key=by.get) == "workspace"
    assert 2 * r["ws_bytes"] < by["workspace"] <= 2 * r["ws_bytes"] + r["scratch_bytes"]
    def rounded(n):
        return -(-n // 512) * 512
    assert by["unknown"] == rounded(100 * 8 * 4) + rounded(3000 * 8) + rounded(3000 * 8 * 4)
