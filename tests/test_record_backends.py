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
"""
from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch

import memlens
from memlens.record import native
from record_workloads import Square, run_threads_per_backend, record_both, transformer_training

pytestmark = pytest.mark.skipif(not native.available(), reason="compiled recorder does not build here")


# Under a TorchDispatchMode autograd accumulates gradients out of place (`add`; the mode makes tensors
# "subclass-like"); in the plain program -- and under the compiled recorder, which is no mode -- in
# place (`add_`). These backward accumulations are compared by count only (see test_grad_accumulation).
_ACCUMULATE = ("aten::add", "aten::add_")


def _accumulations(trace):
    ops = trace.ops
    return ops[(ops["phase"] == "backward") & ops["name"].isin(_ACCUMULATE)]


def _access_ops(trace):
    """[(op name, sorted ((size, category, is_write), ...))] for ops with at least one access."""
    b = trace.blocks.set_index("block_id")
    acc = trace.accesses.join(b[["size", "category"]], on="block_id")
    acc = acc[~acc["op_id"].isin(_accumulations(trace)["op_id"])]
    names = trace.ops.set_index("op_id")["name"]
    out = []
    for op_id, grp in acc.groupby("op_id", sort=True):
        keys = sorted(zip(grp["size"].astype(int), grp["category"], grp["is_write"].astype(bool)))
        out.append((names[op_id], tuple(keys)))
    return out


def _dispatch_blocks(trace):
    b = trace.blocks[trace.blocks["source"].str.startswith("dispatch")]
    b = b[~b["alloc_op_id"].isin(_accumulations(trace)["op_id"])]
    return Counter(zip(b["size"].astype(int), b["category"], b["op"], b["allocated_before"].astype(bool)))


def _allocator_blocks(trace):
    b = trace.blocks[~trace.blocks["source"].str.startswith("dispatch") & (trace.blocks["size"] > 8)]
    return Counter(zip(b["size"].astype(int), b["category"], b["op"]))


def assert_same(py, cc):
    a, b = _access_ops(py), _access_ops(cc)
    assert len(a) == len(b), (len(a), len(b))
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"op {i}: python {x} != compiled {y}"
    assert _dispatch_blocks(py) == _dispatch_blocks(cc)
    assert _allocator_blocks(py) == _allocator_blocks(cc)
    assert len(_accumulations(py)) == len(_accumulations(cc))
    # the per-op cost facts agree too (computed from the signatures each backend logged)
    if "flops" in cc.ops.columns:
        keep = lambda t: t.ops[~t.ops["op_id"].isin(_accumulations(t)["op_id"])]   # noqa: E731
        for col in ("flops", "bytes_written"):
            assert keep(py)[col].sum() == keep(cc)[col].sum(), col


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


def test_threads_record_independently():
    """Two threads, each recording its own model at the same time: each trace holds only its own ops,
    and both backends agree on each thread's blocks and accesses."""
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(8 * (i + 1), 8), torch.nn.ReLU()) for i in range(2)]
    inputs = [torch.randn(4, 8 * (i + 1)) for i in range(2)]
    results = {}
    barrier = threading.Barrier(2)

    def worker(i, backend):
        barrier.wait()
        with memlens.record(models[i], backend=backend, allocator="none") as rec:
            for _ in range(3):
                models[i](inputs[i]).sum().backward()
                models[i].zero_grad(set_to_none=True)
        results[(i, backend)] = rec.trace

    run_threads_per_backend(worker)
    for i in range(2):
        py, cc = results[(i, "python")], results[(i, "compiled")]
        assert_same(py, cc)
        params = cc.blocks[cc.blocks["category"] == "parameter"]
        assert sorted(params["size"]) == sorted(p.numel() * 4 for p in models[i].parameters())


def _inheriting_threads(fns):
    """Threads that inherit this thread's recording (its thread-local state), as autograd's device
    threads do; each runs one callable. `.join()` waits and re-raises the first error."""
    return native.load()._InheritingThreads(fns)


@pytest.mark.parametrize("n_threads", [2, 4])
def test_threads_feeding_one_recording_are_all_recorded(n_threads):
    """2-4 threads feed one recording at once, each started and finished inside it, each on its own
    tensors (its own sizes): every op of every thread is recorded, each op with its own thread's blocks
    (op numbers, accesses and blocks stay consistent when the threads' records are merged), and both
    backends give the same blocks, accesses and read/write flags."""
    steps = 150
    # ops long enough (~0.1 ms) that another thread takes the GIL while one is inside an op
    xs = [torch.randn((1 << 16) * (i + 1)) for i in range(n_threads)]
    barrier = threading.Barrier(n_threads)

    def work(i):
        def run():
            x = xs[i].clone()
            barrier.wait()           # all threads run their ops at the same time
            for _ in range(steps):
                y = x * 2
                x.add_(y)
                x.div_(3.0)
        return run

    traces = {}
    for backend in ("python", "compiled"):
        with memlens.record(backend=backend, allocator="none") as rec:
            _inheriting_threads([work(i) for i in range(n_threads)]).join()
        traces[backend] = rec.trace
    py, cc = traces["python"], traces["compiled"]
    for t in (py, cc):
        assert t.metadata["stop_reason"] is None
        counts = Counter(t.ops["name"])
        for name in ("aten::mul", "aten::add_", "aten::div_"):
            assert counts[name] == steps * n_threads, (t.metadata["recorder"], name, counts)
    assert Counter(_access_ops(py)) == Counter(_access_ops(cc))
    assert _dispatch_blocks(py) == _dispatch_blocks(cc)
    # each op touches one thread's tensors only: y = x * 2 reads x and writes y, both of x's size
    sizes = {x.numel() * 4 for x in xs}
    for name, keys in _access_ops(cc):
        assert len({k[0] for k in keys}) == 1 and keys[0][0] in sizes, (name, keys)
    # the threads' ops did interleave (else this would test one thread after another)
    size_of_op = cc.accesses.merge(cc.blocks[["block_id", "size"]], on="block_id").groupby("op_id")["size"].first()
    assert (size_of_op.diff().fillna(0) != 0).sum() >= 10 * n_threads
    assert cc.metadata["recorder_buffers"]["n_threads"] == n_threads
    assert list(cc.ops["op_id"]) == list(range(len(cc.ops)))   # merged into one dense numbering


def test_leaving_the_recording_while_other_threads_run_ops():
    """The recording ends (and its buffers are merged and freed) while two threads that inherited it are
    still running ops: no crash, the trace is whole, and the threads carry on unrecorded."""
    for backend in ("python", "compiled"):
        stop = threading.Event()
        started = threading.Barrier(3)
        x = torch.randn(4096)

        def spin():
            started.wait()
            n = 0
            while not stop.is_set() or n < 50:
                (x * 2).sum()
                n += 1

        with memlens.record(backend=backend, allocator="none") as rec:
            threads = _inheriting_threads([spin, spin])
            started.wait()
            for _ in range(20):
                x.add(1)
        stop.set()
        threads.join()
        trace = rec.trace
        assert trace.metadata["stop_reason"] is None
        assert (trace.ops["name"] == "aten::add").sum() == 20
        acc = trace.accesses.merge(trace.ops[["op_id", "name"]], on="op_id")
        assert len(acc) > 0 and acc["block_id"].isin(trace.blocks["block_id"]).all()


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
    each backend on its own fresh copy. The traces differ in exactly the ways README's recorder section
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
