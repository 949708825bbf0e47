"""`stacks=True` on both recorder backends: the compiled recorder captures the Python stack of each op in
C++ (native/op_stacks.h), the Python recorder with `sys._getframe` (stacks.py). On each workload both
record the same program and must give every op, and every block made by an op, the same user frames
(name, file, line), innermost first -- not the same ids only: the stacks themselves.

Ops are compared as in test_record_backends.py: the ops with accesses, in order, leaving out backward's
gradient accumulations (out of place under the Python recorder's dispatch mode, in place without it).
"""
from __future__ import annotations

import os

import threading
from collections import Counter

import pytest
import torch

import memlens
from memlens.recording import native
from memlens.recording.stacks import DEFAULT_MAX_DEPTH
from record_workloads import Square, assert_same_per_op, run_threads_per_backend, transformer_training
from record_workloads import record_both as record_both_backends

pytestmark = pytest.mark.skipif(not native.available(), reason="compiled recorder does not build here")

_ACCUMULATE = ("aten::add", "aten::add_")


def _frames_by_id(trace) -> dict:
    """stack id -> ((name, filename, line), ...) innermost first; -1 (no stack) -> None."""
    st = trace.stacks.sort_values(["stack_id", "depth"])
    frames = {int(sid): tuple(zip(g["name"], g["filename"], g["line"].astype(int)))
              for sid, g in st.groupby("stack_id", sort=False)}
    frames[-1] = None
    return frames


def _ids(column) -> list:
    """A nullable stack_id column as ints, -1 where missing."""
    return [int(v) for v in column.fillna(-1)]


def _skipped_ops(trace):
    ops = trace.ops
    return set(ops.loc[(ops["phase"] == "backward") & ops["name"].isin(_ACCUMULATE), "op_id"])


def op_stacks(trace) -> list:
    """[(op name, its stack's frames)] for the ops with accesses, in order."""
    frames = _frames_by_id(trace)
    touched = set(trace.accesses["op_id"]) - _skipped_ops(trace)
    ops = trace.ops[trace.ops["op_id"].isin(touched)]
    return [(name, frames.get(sid, ())) for name, sid in zip(ops["name"], _ids(ops["stack_id"]))]


def block_stacks(trace) -> tuple[Counter, Counter]:
    """Counters of (size, category, allocating op, its stack's frames): over the blocks ops made that
    tensors showed, and over those only the allocator saw (temporaries inside ops) above 8 bytes (see
    test_record_backends.py: the 0-d tensors the dispatch mode wraps Python numbers into are its own)."""
    frames = _frames_by_id(trace)
    b = trace.blocks[trace.blocks["alloc_op_id"].notna()]
    b = b[~b["alloc_op_id"].isin(_skipped_ops(trace))]
    shown = b["source"].str.startswith("dispatch")
    out = []
    for sel in (b[shown], b[~shown & (b["size"] > 8)]):
        out.append(Counter((int(size), cat, op, frames.get(sid, ()))
                           for size, cat, op, sid in zip(sel["size"], sel["category"], sel["op"],
                                                         _ids(sel["stack_id"]))))
    return tuple(out)


def record_both(run, model=None, **options):
    return record_both_backends(run, model, stacks=True, **options)


def assert_same_stacks(py, cc):
    assert_same_per_op(op_stacks(py), op_stacks(cc))
    assert block_stacks(py) == block_stacks(cc)
    for t in (py, cc):     # every recorded op has a stack (possibly the empty one: no user frame)
        assert t.ops["stack_id"].notna().all()
        made = t.blocks["alloc_op_id"].notna()
        assert t.blocks.loc[made, "stack_id"].notna().all()
        # no frame inside torch or memlens themselves; compared with their install folders, not with any path
        # holding "/memlens/" (a clone in a folder named memlens, git's default, holds these tests)
        for package in (torch, memlens):
            inside = os.path.dirname(os.path.abspath(package.__file__)) + os.sep
            assert not t.stacks["filename"].str.startswith(inside).any(), package.__name__
        assert (t.stacks.groupby("stack_id").size() <= DEFAULT_MAX_DEPTH).all()


def _scaled(t):
    return t * 3


def test_mlp_training_with_user_functions():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def step():
        h = Square.apply(model(x))
        loss = torch.nn.functional.cross_entropy(_scaled(h), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def run():
        for _ in range(2):
            step()
            memlens.step()

    run()       # optimizer state exists before recording
    py, cc = record_both(run, model)
    assert_same_stacks(py, cc)
    ops = cc.ops.set_index("op_id")
    frames = _frames_by_id(cc)
    tops = {frames[int(s)][0][0] for s in ops["stack_id"] if frames[int(s)]}
    # the user's functions are innermost frames: _scaled's mul, Square's forward and backward
    assert {"_scaled", "forward", "backward", "step"} <= tops, tops
    bwd = [frames[int(s)] for s in ops.loc[ops["phase"] == "backward", "stack_id"]]
    assert any(f and f[0][0] == "backward" and f[0][1] == Square.backward.__code__.co_filename for f in bwd)


def test_transformer_training():
    run, model = transformer_training()
    py, cc = record_both(run, model)
    assert_same_stacks(py, cc)
    # the model's own forward frames (memlens/demo.py is memlens: skipped) leave the caller's line: the
    # training loop's file
    tops = set(cc.stacks.loc[cc.stacks["depth"] == 0, "filename"])
    assert tops == {run.__code__.co_filename}, tops


def test_deep_recursion_is_cut_at_max_depth():
    """A stack deeper than the kept depth: both backends keep the innermost DEFAULT_MAX_DEPTH user frames."""
    x = torch.ones(3)

    def down(n):
        return x + n if n == 0 else down(n - 1)

    def run():
        down(DEFAULT_MAX_DEPTH + 10)
        down(3)

    py, cc = record_both(run, allocator="none")
    assert_same_stacks(py, cc)
    frames = _frames_by_id(cc)
    deep, shallow = (frames[sid] for sid in _ids(cc.ops.loc[cc.ops["name"] == "aten::add", "stack_id"]))
    assert [f[0] for f in deep] == ["down"] * DEFAULT_MAX_DEPTH
    assert [f[0] for f in shallow[:5]] == ["down"] * 4 + ["run"]


def test_threads_capture_their_own_stacks():
    """Two threads recording at once: each trace holds its own thread's frames only."""
    torch.manual_seed(0)
    data = [torch.randn(4, 4) for _ in range(2)]
    results = {}
    barrier = threading.Barrier(2)

    def work_a(t):
        return (t @ t).relu()

    def work_b(t):
        return (t * 2).sum()

    workers = (work_a, work_b)

    def worker(i, backend):
        barrier.wait()
        with memlens.record(backend=backend, stacks=True, allocator="none") as rec:
            for _ in range(20):
                workers[i](data[i])
        results[(i, backend)] = rec.trace

    run_threads_per_backend(worker)
    for i in range(2):
        py, cc = results[(i, "python")], results[(i, "compiled")]
        assert_same_stacks(py, cc)
        names = set(cc.stacks.loc[cc.stacks["depth"] == 0, "name"])
        assert workers[i].__name__ in names and workers[1 - i].__name__ not in names


def test_stacks_record_with_the_compiled_backend():
    """stacks=True no longer falls back to the Python recorder: no note, the compiled recorder's stacks."""
    with memlens.record(stacks=True, backend="compiled", allocator="none") as rec:
        _scaled(torch.ones(2))
    trace = rec.trace
    assert trace.metadata["recorder"] == "compiled"
    assert not any("stacks" in n for n in trace.metadata.get("notes", []))
    sid = int(trace.ops.loc[trace.ops["name"] == "aten::mul", "stack_id"].iloc[0])
    top = trace.stacks[(trace.stacks["stack_id"] == sid) & (trace.stacks["depth"] == 0)].iloc[0]
    assert (top["name"], top["filename"]) == ("_scaled", __file__)
    assert trace.metadata["recorder_buffers"]["stacks"] > 0


def test_stacks_survive_save_and_load(tmp_path):
    with memlens.record(stacks=True, backend="compiled", allocator="none") as rec:
        _scaled(torch.ones(2))
    path = tmp_path / "t.memlens"
    rec.trace.save(path)
    loaded = memlens.load(path)
    assert op_stacks(loaded) == op_stacks(rec.trace)



def test_stacks_spill_with_the_records():
    """Over the byte budget the per-op stack ids are spilled with the other records and read back in order."""
    x = torch.ones(4)

    def left(t):
        return t + 1

    def right(t):
        return t - 1

    n = 20000
    with memlens.record(backend="compiled", stacks=True, allocator="none", max_buffer_bytes=64 * 1024) as rec:
        for i in range(n):
            x = left(x) if i % 3 else right(x)
    trace = rec.trace
    assert trace.metadata["recorder_spilled_bytes"] > 0 and len(trace.ops) == n
    # ~1 B per op coded: what is left in memory at the end is less than that, the rest was spilled
    assert trace.metadata["recorder_buffers"]["stacks"] < n
    frames = _frames_by_id(trace)
    tops = [frames[sid][0][0] for sid in _ids(trace.ops["stack_id"])]
    assert tops == ["left" if i % 3 else "right" for i in range(n)]
