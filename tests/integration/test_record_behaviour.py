"""Defined behaviour of the recorder around the edges: exceptions, internal failures, the memory
budget, nesting, threads, the decorator, step markers, stacks and the `memlens record` command."""
from __future__ import annotations

import sys
import threading
import warnings

import pytest

torch = pytest.importorskip("torch")

import memlens  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from memlens.cli import main  # noqa: E402


def test_exception_inside_block_keeps_partial_trace():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(KeyError):
        with memlens.record(model, allocator="none") as rec:
            model(torch.randn(2, 4))
            raise KeyError("boom")
    trace = rec.trace
    assert trace is not None and "aten::addmm" in set(trace.ops["name"])
    assert "KeyError" in trace.metadata["exception"]
    assert any("raised KeyError" in n for n in trace.metadata["notes"])


def test_internal_failure_warns_stops_and_keeps_trace(monkeypatch):
    from memlens.recording import session as session_mod
    real = session_mod.classify

    def broken(func):
        if func._schema.name == "aten::relu":
            raise RuntimeError("simulated recorder bug")
        return real(func)

    monkeypatch.setattr(session_mod, "classify", broken)
    x = torch.randn(8)
    with pytest.warns(RuntimeWarning, match="recording stopped"):
        with memlens.record(allocator="none", backend="python") as rec:   # a Python-recorder internal
            y = x * 2
            z = y.relu()          # the recorder fails here; the user's op still runs and returns
            w = z + 1
    assert torch.equal(w, (x * 2).relu() + 1)
    trace = rec.trace
    assert list(trace.ops["name"]) == ["aten::mul"]
    assert "simulated recorder bug" in trace.metadata["stop_reason"]


def test_buffer_budget_stops_recording_with_bounded_memory():
    x = torch.ones(4)
    with pytest.warns(RuntimeWarning, match="budget"):
        with memlens.record(allocator="none", max_buffer_bytes=64 * 1024, backend="python") as rec:
            for _ in range(6000):
                x = x + 1
    trace = rec.trace
    assert float(x[0]) == 6001.0
    assert 100 < len(trace.ops) < 6000
    over = trace.metadata["recorder_overhead"]
    assert 64 * 1024 < over["peak_event_buffer_bytes"] <= 64 * 1024 + 1024
    # x = x + 1 frees the previous x: only a couple of storages are watched at any time
    assert 1 <= over["peak_tracked_storages"] <= 3
    assert over["tracking_bytes_estimate"] == 300 * over["peak_tracked_storages"]
    assert "budget" in trace.metadata["stop_reason"]
    trace.validate()        # a trace cut short is still a whole, consistent trace


def test_nested_recorders_both_record():
    a = torch.randn(8)
    with memlens.record() as outer:
        b = a * 2
        with memlens.record() as inner:
            c = b + 1
        d = c - 1
    assert list(inner.trace.ops["name"]) == ["aten::add"]
    assert list(outer.trace.ops["name"]) == ["aten::mul", "aten::add", "aten::sub"]
    if inner.trace.metadata["recorder"] == "python":   # one profiler: the inner one has no allocator events
        assert any("outer memlens recorder" in n for n in inner.trace.metadata["notes"])
    else:                                               # the compiled memory hook feeds both
        assert "memory_hook" in inner.trace.metadata["sources"]
    assert d.shape == (8,)
    rec = memlens.record(allocator="none")
    with rec:
        with pytest.raises(RuntimeError, match="already recording"):
            rec.__enter__()


def test_threads_record_their_own_ops_and_frees_from_other_threads():
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def worker(name, op):
        try:
            x = torch.randn(64)
            with memlens.record() as rec:      # both want the process-wide profiler: one gets it
                barrier.wait()
                for _ in range(50):
                    x = op(x)
                barrier.wait()
            results[name] = rec.trace
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=("mul", lambda t: t * 1.0)),
               threading.Thread(target=worker, args=("add", lambda t: t + 1.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert set(results["mul"].ops["name"]) == {"aten::mul"}
    assert set(results["add"].ops["name"]) == {"aten::add"}
    if results["mul"].metadata["recorder"] == "python":
        owners = ["profiler" in t.metadata["sources"] for t in results.values()]
        assert sorted(owners) == [False, True]
        other = next(t for t in results.values() if "profiler" not in t.metadata["sources"])
        assert any("another thread owns" in n for n in other.metadata["notes"])
    else:   # the compiled recorder's memory hook is per thread: both threads see their allocations
        assert all("memory_hook" in t.metadata["sources"] for t in results.values())
        for t in results.values():
            assert t.blocks["source"].str.contains("profiler").sum() >= 50
    # a tensor made while recording and dropped in another thread: the free is still seen
    holder = {}
    with memlens.record(allocator="none") as rec:
        holder["t"] = torch.randn(256) * 3
        ptr = holder["t"].data_ptr()
        t = threading.Thread(target=holder.clear)
        t.start()
        t.join()
    b = rec.trace.blocks
    assert b.loc[b["addr"] == ptr, "free_ns"].notna().all()


def test_step_is_noop_outside_recording_and_numbers_iterations():
    memlens.step()  # nothing recording: no error, no effect
    x = torch.ones(3)
    with memlens.record(allocator="none") as rec:
        for _ in range(3):
            x = x * 2
            memlens.step()
    it = rec.trace.ops["iteration"].tolist()
    assert it == [0, 1, 2]
    assert rec.trace.metadata["iteration_source"] == "memlens.step"


def test_decorator_records_each_call():
    @memlens.record(allocator="none")
    def work(n):
        return (torch.ones(n) * 2).sum()

    assert float(work(4)) == 8.0
    first = work.recorder.trace
    work(5)
    second = work.recorder.trace
    assert first is not second
    assert list(second.ops["name"]) == ["aten::ones", "aten::mul", "aten::sum"]
    assert 20 in set(second.blocks["size"])


def test_stacks_are_deduplicated_user_frames():
    def inner_fn(t):
        return t * 3

    with memlens.record(stacks=True, allocator="none") as rec:
        x = torch.ones(4)
        for _ in range(3):
            inner_fn(x)
    trace = rec.trace
    stacks = trace.stacks
    assert stacks is not None and len(stacks)
    assert not stacks["filename"].str.contains("/torch/").any()
    muls = trace.ops[trace.ops["name"] == "aten::mul"]
    assert muls["stack_id"].nunique() == 1          # three calls from one line: one stack
    sid = int(muls["stack_id"].iloc[0])
    top = stacks[(stacks["stack_id"] == sid) & (stacks["depth"] == 0)].iloc[0]
    assert top["name"] == "inner_fn" and top["filename"] == __file__


SCRIPT = """
import sys, torch, memlens
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(4, 8)).sum().backward()
    opt.step(); opt.zero_grad()
    memlens.step()
print("args", sys.argv[1:])
sys.exit(int(sys.argv[1]))
"""


def test_cli_record_runs_script_and_saves_trace(tmp_path, capsys, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run.memlens"
    code = main(["record", "-o", str(out), "--allocator", "none", "--", "python", str(script), "0"])
    assert code == 0
    assert "args ['0']" in capsys.readouterr().out
    trace = memlens.load(out)
    assert set(trace.ops["iteration"].dropna()) == {0, 1}
    assert (trace.ops["phase"] == "optimizer").any()
    # the script's exit status is ours, and the trace is saved anyway
    out2 = tmp_path / "run2.memlens"
    assert main(["record", "-o", str(out2), "--allocator", "none", "--", sys.executable, str(script), "3"]) == 3
    assert memlens.load(out2).summary()["ops"] > 0
    # an existing output without --force, or a missing script: one-line error, exit 2
    assert main(["record", "-o", str(out), "--", "python", str(script), "0"]) == 2
    assert main(["record", "-o", str(tmp_path / "x.memlens"), "--", "python", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "no such script" in err
    # `python -m package` runs with the current directory importable, as Python itself does
    pkg = tmp_path / "trainpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("import torch\nprint(float((torch.ones(3) * 2).sum()))\n")
    monkeypatch.chdir(tmp_path)
    out3 = tmp_path / "m.memlens"
    assert main(["record", "-o", str(out3), "--allocator", "none", "--", "python", "-m", "trainpkg"]) == 0
    assert capsys.readouterr().out.strip() == "6.0"
    assert list(memlens.load(out3).ops["name"]) == ["aten::ones", "aten::mul", "aten::sum", "aten::_local_scalar_dense"]


def test_iterations_detected_from_the_repeating_pattern_without_markers():
    from memlens.demo import make_mlp
    torch.manual_seed(0)
    model = make_mlp(d_in=16, hidden=32, d_out=4)
    with memlens.record(model) as rec:
        for _ in range(5):               # manual SGD: no optimizer hook, no memlens.step()
            model(torch.randn(8, 16)).square().mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
    trace = rec.trace
    from memlens.analysis.iterations import split_iterations
    # the recorder numbers no iterations of its own (it never depends on an analysis); the analysis finds them
    assert trace.metadata["iteration_source"] == "none" and trace.ops["iteration"].isna().all()
    its = split_iterations(trace)
    assert its["source"].iloc[0] == "detected"
    idx = np.searchsorted(its["start_ns"].to_numpy(), trace.ops["start_ns"].to_numpy(), side="right") - 1
    counts = pd.Series(idx[idx >= 0]).value_counts().sort_index()
    assert len(counts) >= 4
    assert counts.iloc[1:-1].nunique() == 1        # the full iterations have the same op count


def test_tensors_without_storage_are_skipped_not_fatal():
    dense = torch.randn(4, 4)
    sparse = dense.to_sparse()
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # no "recording stopped" warning may appear
        with memlens.record(allocator="none") as rec:
            y = torch.sparse.mm(sparse, dense)
            z = y * 2
    trace = rec.trace
    assert trace.metadata["stop_reason"] is None
    assert "aten::mul" in set(trace.ops["name"])
    assert any("had no storage" in n for n in trace.metadata["notes"])
    bz = trace.blocks[trace.blocks["addr"] == z.data_ptr()]
    assert len(bz) == 1 and bz["op"].iloc[0] == "aten::mul"
    assert torch.allclose(z, 2 * (sparse.to_dense() @ dense))


def test_one_session_fed_by_several_threads_keeps_each_op_record_whole():
    """Autograd's device threads (one per GPU) run backward ops through the same session at once."""
    xs = [torch.randn(8) for _ in range(3)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # switch threads as often as possible: without the lock this tears
    try:
        with memlens.record(allocator="none", backend="python") as rec:   # drives the Python mode directly
            mode = rec._session._mode

            def work(x):
                for _ in range(300):
                    mode.__torch_dispatch__(torch.ops.aten.mul.Tensor, (), (x, x))

            threads = [threading.Thread(target=work, args=(x,)) for x in xs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(interval)
    trace = rec.trace
    assert len(trace.ops) == 900 and (trace.ops["name"] == "aten::mul").all()
    acc = trace.accesses.merge(trace.blocks[["block_id", "addr"]], on="block_id")
    per_op = acc.groupby("op_id").agg(n=("block_id", "size"), writes=("is_write", "sum"),
                                      reads=("addr", lambda a: a[~acc.loc[a.index, "is_write"]].iloc[0]))
    assert (per_op["n"] == 2).all() and (per_op["writes"] == 1).all()
    assert set(per_op["reads"]) == {x.data_ptr() for x in xs}


def test_modules_are_named_without_model_argument(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 2)))
    with memlens.record(allocator="none") as rec:
        net(torch.randn(3, 4)).sum().backward()
    trace = rec.trace
    fwd = trace.ops[trace.ops["phase"] == "forward"]
    assert {"Sequential.0", "Sequential.1.0", "Sequential.1.1"} <= set(fwd["module"])
    bwd = trace.ops[trace.ops["phase"] == "backward"]
    assert "Sequential.1.1" in set(bwd["module"])
    # parameters met through the hooks are categorised with their owner, as with model=
    w = trace.blocks[trace.blocks["addr"] == net[1][1].weight.data_ptr()].iloc[0]
    assert (w["category"], w["module"]) == ("parameter", "Sequential.1.1")
    with memlens.record(net, module_prefix="net", allocator="none") as rec:
        net(torch.randn(3, 4))
    assert "net.1.1" in set(rec.trace.ops["module"])
    rec.trace.save(tmp_path / "t.memlens")


def test_a_recorder_that_cannot_start_warns_and_the_block_still_runs():
    class Exploding(torch.nn.Module):
        def named_modules(self, *args, **kwargs):
            raise RuntimeError("simulated broken module tree")

    with pytest.warns(RuntimeWarning, match="recording stopped"):
        with memlens.record(Exploding(), allocator="none") as rec:
            y = torch.ones(3) * 2
    assert float(y.sum()) == 6.0
    assert rec.trace is not None and "simulated broken module tree" in rec.trace.metadata["stop_reason"]
    with memlens.record(allocator="none") as after:   # nothing left behind: the next one works
        torch.ones(2) + 1
    assert list(after.trace.ops["name"]) == ["aten::ones", "aten::add"]


@pytest.mark.parametrize("backend", ["python", "compiled"])
def test_instruments_that_fail_to_stop_keep_the_dispatch_trace(monkeypatch, backend):
    """The allocator's instruments raising at stop (e.g. a profiler stopped from another thread) lose only
    their events: the ops, blocks and accesses recorded are kept, and the notes say what was lost."""
    from memlens.recording import native
    from memlens.recording.instruments import Instruments
    if backend == "compiled" and not native.available():
        pytest.skip("compiled recorder does not build here")

    stop = Instruments.stop

    def broken_stop(self):
        stop(self)        # the profiler really stops (a later test starts its own), then the failure
        raise RuntimeError("simulated profiler failure")
    monkeypatch.setattr(Instruments, "stop", broken_stop)
    with pytest.warns(RuntimeWarning, match="allocator events lost"):
        with memlens.record(backend=backend) as rec:
            y = torch.ones(4) * 3
    assert float(y.sum()) == 12.0
    trace = rec.trace
    assert trace is not None
    assert list(trace.ops["name"]) == ["aten::ones", "aten::mul"]
    made = trace.blocks[trace.blocks["size"] == 16]          # the two 4-float tensors (the compiled recorder's
    assert sorted(made["op"]) == ["aten::mul", "aten::ones"]  # own memory hook still adds the small temporaries)
    assert len(trace.accesses) == 3                           # ones writes 1; mul reads 1, writes 1
    assert any("allocator events lost" in n for n in trace.metadata["notes"])
