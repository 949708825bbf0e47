"""The measured CUDA clock: kernel activity read from profiler events, attached to the launching ops, and
the whole trace moved onto the kernels' clock. No GPU here: the profiler events are stand-ins with the
`_KinetoEvent` methods the recorder calls, and the wiring is exercised through the real recorder."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import memlens
from memlens.clock import clock_label, onto_kernel_clock
from memlens.errors import InputError
from memlens.recording.instruments import kernel_events


class _Event:
    """The subset of torch's `_KinetoEvent` that `kernel_events` reads."""

    def __init__(self, name, device, corr, start, dur):
        self._n, self._d, self._c, self._s, self._u = name, device, corr, start, dur

    def name(self):
        return self._n

    def device_type(self):
        return f"DeviceType.{self._d}"

    def correlation_id(self):
        return self._c

    def start_ns(self):
        return self._s

    def duration_ns(self):
        return self._u


def test_kernel_events_match_launches_by_correlation():
    events = [_Event("cudaLaunchKernel", "CPU", 5, 100, 3), _Event("ampere_gemm", "CUDA", 5, 900, 40),
              _Event("cudaMemcpyAsync", "CPU", 6, 200, 2), _Event("Memcpy DtoH (Device -> Pinned)", "CUDA", 6, 950, 5),
              _Event("orphan_kernel", "CUDA", 7, 990, 1), _Event("aten::mm", "CPU", 0, 90, 20)]
    df = kernel_events(events)
    assert df["name"].tolist() == ["ampere_gemm", "Memcpy DtoH (Device -> Pinned)"]
    assert df["category"].tolist() == ["kernel", "gpu_memcpy"]
    assert df[["launch_unix_ns", "start_unix_ns", "end_unix_ns"]].values.tolist() == [[100, 900, 940], [200, 950, 955]]


@pytest.fixture(scope="module")
def cpu_trace():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with memlens.record(model) as rec:
        model(x).sum().backward()
    return rec.trace


def _fake_kernels(ops: pd.DataFrame) -> pd.DataFrame:
    """One kernel per op that moves bytes, launched mid-op, running 2 us later for 1 us + 1 ns per byte."""
    work = ops[(ops["bytes_read"] + ops["bytes_written"]) > 0]
    launch = (work["start_ns"] + work["end_ns"]) // 2
    start, rows, t = [], [], 0
    for l, b in zip(launch, work["bytes_read"] + work["bytes_written"]):
        t = max(t, l + 2000)
        start.append(t)
        t += 1000 + int(b)
    start = np.asarray(start, dtype=np.int64)
    dur = 1000 + (work["bytes_read"] + work["bytes_written"]).to_numpy(np.int64)
    return pd.DataFrame({"name": "k", "category": "kernel", "launch_ns": launch.to_numpy(np.int64),
                         "start_ns": start, "end_ns": start + dur})


def test_onto_kernel_clock_invariants(cpu_trace):
    from memlens.recording.cuda import kernel_times_per_op
    ops = cpu_trace.ops
    kernels = _fake_kernels(ops)
    per = kernel_times_per_op(kernels, ops)
    assert len(per) == len(kernels) and (per["kernels"] == 1).all()
    with_k = ops.merge(per, on="op_id", how="left")
    for c in ("kernel_start_ns", "kernel_end_ns", "kernels", "kernel_busy_ns"):
        with_k[c] = with_k[c].astype("Int64")
    trace = memlens.Trace.from_tables(cpu_trace.blocks, cpu_trace.accesses, with_k, metadata=cpu_trace.metadata)
    out = onto_kernel_clock(trace, gpu="NVIDIA H100 80GB HBM3")
    assert out.metadata["clock"] == {"kind": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "model": None,
                                     "device_busy_ns": int(per["kernel_busy_ns"].sum()), "from": "host",
                                     "kernels": len(kernels), "source_units": None}
    assert clock_label(out) == "measured CUDA kernel clock (NVIDIA H100 80GB HBM3)"
    o = out.ops.sort_values(["recorded_start_ns", "op_id"])
    first = int(kernels["start_ns"].min())
    has = o["kernel_start_ns"].notna().to_numpy()
    # ops with kernels span exactly their kernels (shifted to start at 0); the others last 0 ns
    assert (o["start_ns"].to_numpy()[has] == o["kernel_start_ns"].to_numpy(np.int64, na_value=0)[has] - first).all()
    assert (o["end_ns"].to_numpy()[has] == o["kernel_end_ns"].to_numpy(np.int64, na_value=0)[has] - first).all()
    assert (o["device_ns"].to_numpy()[~has] == 0).all()
    assert (np.diff(o["start_ns"].to_numpy()) >= 0).all()
    # accesses inside their op and their block's lifetime
    acc = out.accesses.merge(out.ops[["op_id", "start_ns", "end_ns"]], on="op_id")
    assert (acc["t_ns"] == np.where(acc["is_write"], acc["end_ns"], acc["start_ns"])).all()
    life = out.accesses.merge(out.blocks[["block_id", "alloc_ns", "free_ns"]], on="block_id")
    assert ((life["alloc_ns"].isna() | (life["t_ns"] >= life["alloc_ns"].fillna(0))) &
            (life["free_ns"].isna() | (life["t_ns"] <= life["free_ns"].fillna(0)))).all()
    assert out.peak_live_bytes() == cpu_trace.peak_live_bytes()


def test_no_kernel_times_is_bad_input(cpu_trace):
    with pytest.raises(InputError, match="kernel times"):
        onto_kernel_clock(cpu_trace)


def test_recorder_moves_a_cuda_recording_onto_the_kernel_clock(monkeypatch):
    """The recorder's CUDA path, with the profiler's kernel activity replaced by stand-in kernels made from
    the recorded ops' own host times (a CPU build has no CUDA activity)."""
    from memlens.recording import pipeline
    real_events = pipeline.with_session_events

    def events_with_kernels(session, allocator, clock):
        from memlens.recording.build import build_ops
        allocator = real_events(session, allocator, clock)
        ops = build_ops(session)[0].to_frame()
        wall0, perf0 = clock
        to_trace_ns = perf0 - wall0 - session.t_start
        k = _fake_kernels(ops)
        allocator.kernels = pd.DataFrame({"name": k["name"], "category": k["category"],
                                          "launch_unix_ns": k["launch_ns"] - to_trace_ns,
                                          "start_unix_ns": k["start_ns"] - to_trace_ns,
                                          "end_unix_ns": k["end_ns"] - to_trace_ns, "correlation": 0})
        return allocator

    monkeypatch.setattr(pipeline, "with_session_events", events_with_kernels)
    x = torch.randn(8, 16)
    w = torch.randn(16, 4)
    with memlens.record() as rec:
        (x @ w).relu().sum()
    trace = rec.trace
    assert trace.metadata["clock"]["kind"] == "cuda"
    ops = trace.ops
    moved = ops[ops["kernels"].fillna(0) > 0]
    assert len(moved) >= 3 and (moved["device_ns"] == moved["kernel_busy_ns"]).all()
    assert (ops["recorded_end_ns"] >= ops["recorded_start_ns"]).all()
