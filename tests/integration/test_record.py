"""The recorder on real small models: what every block, access and free must be, checked against what
the model must do (parameters read in forward and written by the optimizer, gradients made in backward
and freed by zero_grad, saved activations read in backward, nothing touched outside its lifetime)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

import memlens  # noqa: E402
from memlens.demo import make_cnn, make_mlp, make_transformer, train_transformer_steps  # noqa: E402


def _block_of(trace, tensor_ptr: int, size: int, category: str | None = None) -> pd.Series:
    b = trace.blocks
    sel = b[(b["addr"] == tensor_ptr) & (b["size"] == size)]
    if category is not None:
        sel = sel[sel["category"] == category]
    assert len(sel) >= 1, f"no block at {tensor_ptr:#x} of {size} bytes"
    return sel.iloc[-1]


def assert_accesses_inside_lifetimes(trace):
    a = trace.accesses.merge(trace.blocks[["block_id", "alloc_ns", "free_ns"]], on="block_id")
    early = a["alloc_ns"].notna() & (a["t_ns"] < a["alloc_ns"])
    late = a["free_ns"].notna() & (a["t_ns"] > a["free_ns"])
    assert not early.any(), a[early].head()
    assert not late.any(), a[late].head()


@pytest.fixture(scope="module")
def mlp_sgd_run():
    torch.manual_seed(0)
    model = make_mlp(d_in=16, hidden=32, d_out=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = 3
    with memlens.record(model) as rec:
        for _ in range(steps):
            x = torch.randn(8, 16)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            memlens.step()
    return model, opt, rec.trace, steps


def test_parameters_read_in_forward_and_written_by_optimizer(mlp_sgd_run):
    model, _, trace, steps = mlp_sgd_run
    ops = trace.ops.set_index("op_id")
    acc = trace.accesses.join(ops[["phase", "iteration"]], on="op_id")
    for name, p in model.named_parameters():
        blk = _block_of(trace, p.data_ptr(), p.untyped_storage().nbytes(), "parameter")
        assert blk["module"] == "model." + name.rsplit(".", 1)[0]
        mine = acc[acc["block_id"] == blk["block_id"]]
        for it in range(steps):
            in_it = mine[mine["iteration"] == it]
            assert ((in_it["phase"] == "forward") & ~in_it["is_write"]).any(), (name, it)
            assert ((in_it["phase"] == "optimizer") & in_it["is_write"]).any(), (name, it)
        assert not (mine["is_write"] & (mine["phase"] != "optimizer")).any()


def test_gradients_made_in_backward_and_freed_by_zero_grad(mlp_sgd_run):
    model, _, trace, steps = mlp_sgd_run
    grads = trace.blocks[trace.blocks["category"] == "gradient"]
    assert len(grads) == steps * len(list(model.parameters()))
    ops = trace.ops.set_index("op_id")
    assert (ops.loc[grads["alloc_op_id"].astype(int), "phase"] == "backward").all()
    # set_to_none runs no op: the free falls after the optimizer step and before the next forward op
    opt_end = trace.ops[trace.ops["phase"] == "optimizer"].groupby("iteration")["end_ns"].max()
    fwd_start = trace.ops[trace.ops["phase"] == "forward"].groupby("iteration")["start_ns"].min()
    it = ops.loc[grads["alloc_op_id"].astype(int), "iteration"].to_numpy()
    free = grads["free_ns"].to_numpy(dtype="float64")
    assert not np.isnan(free).any()
    assert (free >= opt_end.loc[it].to_numpy()).all()
    nxt = [fwd_start.get(i + 1, np.inf) for i in it]
    assert (free <= np.asarray(nxt)).all()
    assert grads["module"].str.startswith("model.").all()
    # the ones_like seed of loss.backward() is autograd's, not unknown
    seeds = trace.blocks[trace.blocks["op"] == "aten::ones_like"]
    assert len(seeds) == steps and (seeds["category"] == "autograd_detail").all()


def test_saved_activations_read_in_backward(mlp_sgd_run):
    _, _, trace, _ = mlp_sgd_run
    b, ops = trace.blocks, trace.ops.set_index("op_id")
    acc = trace.accesses.join(ops[["phase", "name"]], on="op_id")
    # ReLU outputs feed the next Linear, whose weight gradient (mm) reads them in backward
    relu_out = b[(b["op"] == "aten::relu") & (b["category"] == "activation")]
    assert len(relu_out) == 2 * 3
    for bid in relu_out["block_id"]:
        mine = acc[acc["block_id"] == bid]
        assert ((mine["phase"] == "backward") & ~mine["is_write"]).any()


def test_no_access_outside_lifetime_and_valid_trace(mlp_sgd_run, tmp_path):
    _, _, trace, _ = mlp_sgd_run
    assert_accesses_inside_lifetimes(trace)
    trace.validate()
    loaded = memlens.load(trace.save(tmp_path / "mlp.memlens"))
    assert len(loaded.accesses) == len(trace.accesses)
    assert loaded.metadata["source_kind"] == "memlens_record"
    assert loaded.metadata["iteration_source"] == "memlens.step"
    assert set(loaded.metadata["settings"]) >= {"stacks", "allocator", "max_buffer_bytes"}


def test_transformer_adamw_modules_in_forward_and_backward_and_optimizer_state():
    torch.manual_seed(0)
    model = make_transformer(vocab=64, d_model=32, n_heads=2, n_layers=2, seq_len=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with memlens.record(model) as rec:
        train_transformer_steps(model, opt, 2, batch=4, seq_len=16, vocab=64)
    trace = rec.trace
    ops = trace.ops
    qkv = "model.layers.1.attn.qkv"
    assert ((ops["module"] == qkv) & (ops["phase"] == "forward") & (ops["name"] == "aten::addmm")).any()
    assert ((ops["module"] == qkv) & (ops["phase"] == "backward") & (ops["name"] == "aten::mm")).any()
    # the weight gradient of qkv is made by a backward op attributed to qkv
    w = model.layers[1].attn.qkv.weight
    grads = trace.blocks[(trace.blocks["category"] == "gradient") & (trace.blocks["size"] == w.numel() * 4)]
    assert (grads["module"] == qkv).any()
    # AdamW's exp_avg / exp_avg_sq are optimizer state, alive at the end, at the live tensors' addresses
    state_ptrs = {v.data_ptr() for s in opt.state.values() for k, v in s.items() if k != "step"}
    st = trace.blocks[trace.blocks["category"] == "optimizer_state"]
    assert state_ptrs <= set(st["addr"].dropna().astype(int))
    assert st[st["addr"].isin(state_ptrs)]["free_ns"].isna().all()
    assert trace.metadata["iteration_source"] == "memlens.step"
    assert_accesses_inside_lifetimes(trace)
    emb = _block_of(trace, model.embed.weight.data_ptr(), model.embed.weight.nbytes, "parameter")
    assert emb["module"] == "model.embed"


def test_cnn_inference_no_grad():
    torch.manual_seed(0)
    model = make_cnn(channels=4).eval()
    with memlens.record(model) as rec, torch.no_grad():
        for _ in range(2):
            model(torch.randn(2, 3, 32, 32))
            memlens.step()
    trace = rec.trace
    assert not (trace.ops["phase"] == "backward").any()
    assert not (trace.blocks["category"] == "gradient").any()
    assert not trace.accesses.merge(trace.blocks, on="block_id").query(
        "category in ['parameter', 'buffer'] and is_write").shape[0]
    bn = model[1]
    blk = _block_of(trace, bn.running_mean.data_ptr(), bn.running_mean.nbytes, "buffer")
    assert blk["module"] == "model.1"
    conv_out = trace.blocks[(trace.blocks["op"] == "aten::convolution") | (trace.blocks["op"] == "aten::mkldnn_convolution")]
    assert (conv_out["module"].isin(["model.0", "model.4"])).all() and len(conv_out) >= 4
    assert set(trace.ops["iteration"].dropna().unique()) == {0, 1}
    assert_accesses_inside_lifetimes(trace)


def test_batchnorm_training_writes_running_stats():
    model = torch.nn.BatchNorm1d(4)
    with memlens.record(model, allocator="none") as rec:
        model(torch.randn(8, 4))
    trace = rec.trace
    blk = _block_of(trace, model.running_mean.data_ptr(), model.running_mean.nbytes, "buffer")
    mine = trace.accesses[trace.accesses["block_id"] == blk["block_id"]]
    assert mine["is_write"].any()


def test_views_are_not_accesses_and_inplace_out_are_writes():
    x = torch.randn(16)
    out = torch.empty(16)
    with memlens.record(allocator="none") as rec:
        v = x.view(4, 4).t()           # views: no bytes touched
        v.add_(1.0)                     # in-place: write
        torch.mul(x, 2.0, out=out)      # out=: write to `out`, read of x
    trace = rec.trace
    names = trace.ops.set_index("op_id")["name"]
    acc = trace.accesses.join(names, on="op_id")
    assert not acc["name"].isin(["aten::view", "aten::t"]).any()
    assert set(trace.ops["name"]) >= {"aten::view", "aten::t", "aten::add_", "aten::mul"}
    bx = _block_of(trace, x.data_ptr(), x.nbytes)["block_id"]
    bo = _block_of(trace, out.data_ptr(), out.nbytes)["block_id"]
    add = acc[acc["name"] == "aten::add_"]
    assert add[add["block_id"] == bx]["is_write"].all() and len(add[add["block_id"] == bx]) == 1
    mul = acc[acc["name"] == "aten::mul"].set_index("block_id")["is_write"]
    assert mul[bo] and not mul[bx]


def test_never_keeps_a_tensor_alive_and_sees_the_free():
    import gc
    import weakref
    with memlens.record(allocator="none") as rec:
        x = torch.randn(1000)
        y = x * 2
        ref = weakref.ref(y)
        ptr = y.data_ptr()
        del y
        gc.collect()
        assert ref() is None            # died while recording: nothing of ours held it
        keep = x + 1
    b = rec.trace.blocks
    blk = b[(b["addr"] == ptr) & (b["op"] == "aten::mul")].iloc[0]   # `keep` may reuse the address
    assert not pd.isna(blk["free_ns"]) and blk["size"] == 4000
    assert keep.shape == (1000,)


def test_resize_in_place_is_a_free_and_a_new_block():
    x = torch.zeros(4)
    with memlens.record(allocator="none") as rec:
        old_ptr = x.data_ptr()
        x.resize_(1000)                 # same storage object, a new allocation of 4000 bytes
        x.fill_(1.0)
    b = rec.trace.blocks
    old = b[(b["addr"] == old_ptr) & (b["size"] == 16)].iloc[0]
    new = b[(b["addr"] == x.data_ptr()) & (b["size"] == 4000)].iloc[0]
    assert not pd.isna(old["free_ns"]) and new["op"] == "aten::resize_" and pd.isna(new["free_ns"])
    fills = rec.trace.accesses.merge(rec.trace.ops, on="op_id").query("name == 'aten::fill_'")
    assert fills["block_id"].tolist() == [new["block_id"]]
    assert_accesses_inside_lifetimes(rec.trace)
    with memlens.record(allocator="none") as rec:
        y = torch.empty(0)
        y.resize_(8)                    # an empty tensor's first bytes are made by resize_
        z = torch.empty(0)
        z.set_(y.untyped_storage())     # shares y's storage: no new block
    b = rec.trace.blocks
    assert b["size"].tolist() == [32] and b["op"].tolist() == ["aten::resize_"]
