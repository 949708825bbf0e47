"""Workloads and helpers shared by the tests that record the same program with both recorders."""
from __future__ import annotations

import threading

import torch

import memlens


def record_both(run, model=None, **options):
    """Record `run()` with the Python and then the compiled recorder; returns (python trace, compiled trace).
    With `stacks=True` in `options`, each trace must hold a stack table."""
    traces = {}
    for backend in ("python", "compiled"):
        with memlens.record(model, backend=backend, **options) as rec:
            run()
        assert rec.trace.metadata["recorder"] == backend
        if options.get("stacks"):
            assert rec.trace.stacks is not None and len(rec.trace.stacks)
        traces[backend] = rec.trace
    return traces["python"], traces["compiled"]


def assert_same_per_op(python_rows: list, compiled_rows: list) -> None:
    """The two recorders' per-op rows (one entry per op, in order) are equal, the first difference named by
    its op index."""
    assert len(python_rows) == len(compiled_rows), (len(python_rows), len(compiled_rows))
    for i, (x, y) in enumerate(zip(python_rows, compiled_rows)):
        assert x == y, f"op {i}: python {x} != compiled {y}"


def transformer_training():
    """A small transformer trained 2 steps with AdamW, once outside any recording (the optimizer state
    exists when recording begins); returns (run, model), `run` doing the same 2 steps again."""
    from memlens.demo import make_transformer
    torch.manual_seed(0)
    model = make_transformer(vocab=64, d_model=32, n_heads=2, n_layers=2, seq_len=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 64, (2, 17))

    def run():
        for _ in range(2):
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            memlens.step()
    run()
    return run, model


class Square(torch.autograd.Function):
    """A user's autograd Function: its backward's ops have the user's backward frame on their stack."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 * x


def run_threads_per_backend(worker, n: int = 2) -> None:
    """For the Python and then the compiled backend, run `worker(i, backend)` in `n` threads at once and
    wait for them."""
    for backend in ("python", "compiled"):
        threads = [threading.Thread(target=worker, args=(i, backend)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
