"""The compiled recorder (C++ hot path) and the Python recorder record the same thing.

On each workload both backends record the same program; we compare what a user reads from the trace:
- the ops that access memory, in order, each with its accesses as (block size, block category,
  read/write) -- so the same counts and the same read/write flags;
- the blocks that tensors showed (size, category, allocating op, allocated before recording);
- the blocks only the allocator saw (temporaries inside ops), above 8 bytes: below that are the 0-d
  tensors that Python numbers are wrapped into, which the Python recorder's dispatch mode wraps again
  (its own artefact, absent from a plain run).
Expected values are not taken from either backend: equality between two independent implementations
(a Python TorchDispatchMode with weakrefs and the profiler's allocation events vs a C++ RecordFunction
callback with a memory-reporting hook) is the check; a few absolute facts are asserted as well.
Several threads feeding recordings are compared in tests/integration/test_record_backends_threads.py; the comparison
helpers are in tests/_record_backends_refs.py.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

import memlens
from _record_backends_refs import _access_ops, _accumulations, _dispatch_blocks, assert_same
from memlens.recording import native
from record_workloads import Square, record_both, transformer_training

pytestmark = pytest.mark.skipif(not native.available(), reason="compiled recorder does not build here")


def _train(model, opt, batch, target, steps=2, accumulate=1):
    def run():
        for _ in range(steps):
            for _ in range(accumulate):
                loss = torch.nn.functional.cross_entropy(model(batch), target)
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            memlens.step()
    return run


def test_mlp_adamw():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = _train(model, opt, torch.randn(16, 32), torch.randint(0, 10, (16,)))
    run()                                           # optimizer state exists before recording
    py, cc = record_both(run, model)
    assert_same(py, cc)
    cats = cc.blocks.groupby("category")["size"].sum()
    n_param_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert cats["parameter"] == n_param_bytes
    assert cats["optimizer_state"] >= 2 * n_param_bytes      # exp_avg and exp_avg_sq
    assert cc.ops["iteration"].max() == 1 == py.ops["iteration"].max()   # two steps: 0 and 1


def test_cnn_batchnorm_sgd():
    from memlens.demo import make_cnn
    torch.manual_seed(0)
    model = make_cnn(channels=8).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    run = _train(model, opt, torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
    run()
    py, cc = record_both(run, model)
    assert_same(py, cc)
    # batch norm writes its running statistics (a mutation the schema omits)
    bn = cc.ops[cc.ops["name"].str.contains("batch_norm")]
    buf = cc.blocks.set_index("block_id")["category"]
    writes = cc.accesses[cc.accesses["op_id"].isin(bn["op_id"]) & cc.accesses["is_write"]]
    assert (writes["block_id"].map(buf) == "buffer").sum() >= 2 * len(bn[bn["phase"] == "forward"])


def test_transformer_adamw():
    run, model = transformer_training()
    py, cc = record_both(run, model)
    assert_same(py, cc)
    # module paths reach backward ops too
    bwd = cc.ops[cc.ops["phase"] == "backward"]
    assert bwd["module"].str.startswith("model.").mean() > 0.5
    assert (py.ops.groupby("phase").size().drop("other", errors="ignore").index.tolist()
            == cc.ops.groupby("phase").size().drop("other", errors="ignore").index.tolist())


def test_grad_accumulation():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    run = _train(model, opt, torch.randn(4, 8), torch.randint(0, 4, (4,)), steps=1, accumulate=3)
    run()
    py, cc = record_both(run, model)
    # Under a TorchDispatchMode autograd accumulates gradients out of place (the mode makes tensors
    # "subclass-like"); without one -- the plain program and the compiled recorder -- in place. So the
    # compiled trace has the in-place accumulation the real program does: the same gradient block is
    # written by each later backward.
    grads = cc.blocks[cc.blocks["category"] == "gradient"]
    n_params = len(list(model.parameters()))
    assert len(grads) == n_params
    acc = cc.accesses[cc.accesses["block_id"].isin(grads["block_id"]) & cc.accesses["is_write"]]
    assert acc.groupby("block_id").size().min() >= 3           # made once, accumulated into twice
    # everything that is not gradient accumulation agrees
    assert _access_ops(py)[:10] == _access_ops(cc)[:10]


def test_weight_tying_inplace_views_out():
    torch.manual_seed(0)

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(32, 16)
            self.head = torch.nn.Linear(16, 32, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, idx):
            h = self.emb(idx)
            h = h.transpose(0, 1).contiguous().transpose(0, 1)      # views and a copy
            h.mul_(2.0)                                              # in place
            return self.head(h)

    model = Tied()
    opt = torch.optim.AdamW(model.parameters())
    idx = torch.randint(0, 32, (4, 5))
    out_buf = torch.empty(4, 4)
    a, b = torch.randn(4, 4), torch.randn(4, 4)

    def run():
        logits = model(idx)
        logits.sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.add(a, b, out=out_buf)                 # out=: a write to out_buf
        v = out_buf.view(16)[2:10]                   # a view: not an access
        v.add_(1)                                     # in place through a view: a write to out_buf
        torch.mm(a, b, out=out_buf)
    run()
    py, cc = record_both(run, model)
    assert_same(py, cc)
    params = cc.blocks[cc.blocks["category"] == "parameter"]
    assert len(params) == 1                          # tied: one storage
    ob = cc.blocks[(cc.blocks["size"] == 64) & cc.blocks["allocated_before"]]
    writes = cc.accesses[cc.accesses["block_id"].isin(ob["block_id"]) & cc.accesses["is_write"]]
    assert len(writes) >= 3                           # add out=, add_ through the view, mm out=
    views = cc.ops[cc.ops["name"].isin(["aten::view", "aten::slice", "aten::transpose"])]
    assert not cc.accesses["op_id"].isin(views["op_id"]).any()


def test_nested_tensors():
    """Jagged and strided nested tensors record to the end on both backends, with the same data blocks.

    Not compared op by op: the Python recorder's dispatch mode sees a jagged op (NJT's `linear`) and maps
    it to the values' storage; the compiled recorder records the dense ops NJT's __torch_dispatch__
    runs on the values instead. It also sees ops NJT runs with modes disabled (an `empty` in its
    constructor) and not the size queries the mode sees (`_nested_tensor_size`, `sym_size`), so
    op names and a few tiny blocks differ; the data blocks agree."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3)

    def run():
        for layout in (torch.jagged, torch.strided):
            nt = torch.nested.nested_tensor([torch.randn(2, 6), torch.randn(5, 6)], layout=layout)
            out = lin(nt)
            out.values().sum() if layout == torch.jagged else torch.nested.to_padded_tensor(out, 0.0).sum()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)      # "nested tensors are a prototype"
        py, cc = record_both(run, lin)
    for t in (py, cc):
        assert t.metadata["stop_reason"] is None
        data = t.blocks[t.blocks["source"].str.startswith("dispatch") & (t.blocks["size"] > 32)]
        # values 7x6, output 7x3 (twice: jagged and strided), padded 2x5x3, the parameters
        assert Counter(data["size"].astype(int)) >= Counter({168: 2, 84: 2, 120: 3, 72: 1, 48: 2})
    names = set(cc.ops["name"])
    # strided nested ops are recorded as such; jagged ones (a Python subclass) through the dense ops
    # their __torch_dispatch__ runs on the values
    assert {"aten::linear", "aten::to_padded_tensor", "aten::addmm"} <= names
    big = lambda t: Counter(t.blocks.loc[t.blocks["size"] > 32, "size"].astype(int))   # noqa: E731
    assert big(py) == big(cc)


def test_module_paths_phases_and_inputs_agree():
    """The compiled recorder tracks modules in C++ (its own forward hooks): the module path and phase of
    every op with accesses equal the Python recorder's, for a model with a child called twice, a module
    not under `model=` (named as a new root), a forward that raises (the post hook pops back to the
    caller), and the root's tensor arguments marked as inputs."""
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh())
            self.head = torch.nn.Linear(6, 2)

        def forward(self, x):
            return self.head(self.enc(self.enc(x)))

    class Boom(torch.nn.Module):
        def forward(self, x):
            x = x * 2
            raise ValueError("boom")

    model, stranger, boom = Net(), torch.nn.Linear(2, 2), Boom()
    opt = torch.optim.SGD(list(model.parameters()) + list(stranger.parameters()), lr=0.1, momentum=0.9)
    x = torch.randn(3, 6)

    def run():
        for _ in range(2):
            out = stranger(model(x))
            try:
                boom(out)
            except ValueError:
                pass
            (out * 3).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            memlens.step()

    def placed(trace):
        """[(op name, module path, phase)] of the ops with accesses, in order."""
        ops = trace.ops
        touched = set(trace.accesses["op_id"]) - set(_accumulations(trace)["op_id"])
        return [tuple(r) for r in ops[ops["op_id"].isin(touched)][["name", "module", "phase"]].values.tolist()]

    run()   # momentum buffers exist before both recordings (the first step clones them)
    py, cc = record_both(run, model, allocator="none")
    assert_same(py, cc)
    assert placed(py) == placed(cc)
    modules = set(cc.ops["module"])
    assert {"model.enc.0", "model.enc.1", "model.head", "Linear", "Boom"} <= modules, modules
    assert ("aten::mul", "", "other") in placed(cc)     # `out * 3`: in no module again after Boom raised
    inputs = lambda t: sorted(t.blocks.loc[t.blocks["category"] == "input", "size"])   # noqa: E731
    assert inputs(py) == inputs(cc) and inputs(cc)


def test_custom_autograd_function_with_allocator_hook():
    """A custom autograd Function's apply asks torch whether a profiler runs (it reads the PROFILER_STATE
    slot, where the compiled recorder's memory hook sits): the program runs unchanged and both backends
    agree. It used to raise std::bad_alloc into the user's code under the compiled recorder."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)

    def run():
        Square.apply(model(torch.ones(2, 4))).sum().backward()
        model.zero_grad(set_to_none=True)      # the next backend's run starts without gradients too
    py, cc = record_both(run, model)
    assert_same(py, cc)
    assert cc.metadata["stop_reason"] is None
    assert (cc.ops["name"] == "aten::mul").sum() >= 3         # forward x * x, backward grad * 2 * x


def test_new_users_mlp_adamw_differs_only_as_documented():
    """A new user's first recording: an MLP, a fresh AdamW (its state made inside the recording), 3 steps,
    each backend on its own fresh copy. The traces differ in exactly the ways docs/record.md
    lists, with the numbers AdamW's algorithm gives (not read from either backend):
    - per step, the Python recorder lists 4 more `aten::detach` ops (a dispatch mode makes autograd detach
      the outputs it saves for backward, relu's and log_softmax's, when saving and when unpacking them;
      views: no block, no access);
    - the compiled one lists `aten::empty` + `aten::detach_` of each `torch.tensor(0.)` (AdamW's step
      counter, once per parameter), which a dispatch mode does not see (only their `lift_fresh`); each
      writes the 4-byte counter: 2 accesses per parameter, and the counter's block names `aten::empty` as
      its op (no op in the Python trace);
    - each op with a Python number argument (per parameter and step: `step += 1`, the weight-decay and
      beta2 `mul_`, the division by the bias correction, `+ eps`: 5) allocates its number as an 8-byte
      0-d tensor, and casts it to a 4-byte float inside the op; the Python recorder's mode hands the op a
      Python number and calls it again, which wraps it once more: one more 8-byte block per such op.
    Everything else agrees op by op: blocks, sizes, categories, accesses."""
    steps = 3

    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return model, _train(model, opt, torch.randn(32, 64), torch.randint(0, 10, (32,)), steps=steps)

    traces = {}
    for backend in ("python", "compiled"):
        model, run = make()
        with memlens.record(model, backend=backend) as rec:
            run()
        traces[backend] = rec.trace
    py, cc = traces["python"], traces["compiled"]
    n_params = len(list(model.parameters()))                  # 4: two weights, two biases
    number_ops = 5 * n_params * steps                          # ops given a Python number: 60

    # ops
    names_py, names_cc = Counter(py.ops["name"]), Counter(cc.ops["name"])
    assert names_py - names_cc == {"aten::detach": 4 * steps}
    assert names_cc - names_py == {"aten::empty": n_params, "aten::detach_": n_params}
    assert len(py.ops) - len(cc.ops) == 4 * steps - 2 * n_params

    # accesses: op by op the same, but for the step counters' empty and detach_ in the compiled trace
    counter = ((4, "optimizer_state", True),)
    assert _access_ops(py) == [x for x in _access_ops(cc) if x not in (("aten::empty", counter),
                                                                       ("aten::detach_", counter))]
    assert len(cc.accesses) - len(py.accesses) == 2 * n_params

    # blocks tensors showed: the same, but the step counters' op
    made_by_empty = Counter({(4, "optimizer_state", "aten::empty", False): n_params})
    made_by_none = Counter({(4, "optimizer_state", "", False): n_params})
    assert _dispatch_blocks(cc) - made_by_empty == _dispatch_blocks(py) - made_by_none
    assert _dispatch_blocks(cc) & made_by_empty == made_by_empty
    assert _dispatch_blocks(py) & made_by_none == made_by_none

    # blocks only the allocator saw: the numbers and their casts (the Python recorder's two clocks
    # place some at an op's edge outside it, so which op they belong to is not compared)
    only_alloc = lambda t: Counter(t.blocks.loc[~t.blocks["source"].str.startswith("dispatch"), "size"])  # noqa: E731
    assert only_alloc(cc) == {8: number_ops, 4: number_ops}
    assert only_alloc(py) == {8: 2 * number_ops, 4: number_ops}
    assert len(py.blocks) - len(cc.blocks) == number_ops
