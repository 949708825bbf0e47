"""The compiled recorder (C++ hot path) and the Python recorder record the same thing from several threads:
two threads each recording its own model at the same time (each trace holds only its own ops), 2 and 4
threads that inherit one recording and run ops at once (every op of every thread recorded with its own
thread's blocks, the per-thread buffers merged into one dense op numbering), and a recording that ends while
threads that inherited it still run ops (no crash, a whole trace). Both backends are compared as in
tests/integration/test_record_backends.py (tests/_record_backends_refs.py).
"""
from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch

import memlens
from _record_backends_refs import _access_ops, _dispatch_blocks, assert_same
from memlens.recording import native
from record_workloads import run_threads_per_backend

pytestmark = pytest.mark.skipif(not native.available(), reason="compiled recorder does not build here")


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
