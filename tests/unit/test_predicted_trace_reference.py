"""`memlens.prediction.predicted_trace` by hand: the allocator's sizes (c10's rounding worked out in the
comments), each op's thread, and the reset marks moved onto a GPU clock (a stand-in `retime` whose new op
starts are known, so that only this module's bookkeeping is under test)."""
from __future__ import annotations

import pandas as pd
import pytest

from memlens.prediction.predicted_trace import allocator_sized, onto_gpu_clock
from memlens.simulate.config import AllocatorConfig
from memlens.trace import Trace

MiB = 1 << 20


def _trace(ops: pd.DataFrame | None = None) -> Trace:
    blocks = pd.DataFrame({"block_id": [0, 1, 2, 3, 4, 5], "size": [1, 512, 513, MiB + 1, 700, 1],
                           "device": ["cuda:0", "cuda:0", "cuda:0", "cuda:0", "cuda:1", "cpu"],
                           "addr": [4096, 8192, 12288, 16384, 20480, 24576],
                           "alloc_ns": [0, 1, 2, 3, 4, 5], "free_ns": [None] * 6})
    return Trace.from_tables(blocks, ops=ops)


def test_allocator_sized_rounds_cuda_blocks_only():
    trace = _trace()
    original = trace.blocks
    out = allocator_sized(trace, [], AllocatorConfig())
    assert out is trace
    # c10 round_size: below 512 -> 512; else up to a multiple of 512 (1 MiB + 1 -> 1 MiB + 512); cpu untouched
    assert out.blocks["size"].tolist() == [512, 512, 1024, MiB + 512, 1024, 1]
    assert out.blocks["requested_size"].tolist() == [1, 512, 513, MiB + 1, 700, 1]
    # fake tensors have no addresses on the device; the cpu block keeps its own
    assert out.blocks["addr"].isna().tolist() == [True] * 5 + [False]
    assert int(out.blocks["addr"].iloc[5]) == 24576
    # the table the caller held is not rewritten
    assert original["size"].tolist() == [1, 512, 513, MiB + 1, 700, 1] and original["addr"].notna().all()
    assert "requested_size" not in original.columns


def test_allocator_sized_uses_the_given_configuration():
    # 4 divisions of [1 MiB, 2 MiB): steps of 256 KiB, so 1 MiB + 1 -> 1.25 MiB; [512, 1 MiB) has 4 too but a
    # request at most 512 * 4 bytes is rounded to 512s; 513 -> 1024
    config = AllocatorConfig(roundup_power2_divisions=(4,) + (0,) * 15)
    out = allocator_sized(_trace(), [], config)
    assert out.blocks["size"].tolist() == [512, 512, 1024, MiB + MiB // 4, 1024, 1]


def _ops(op_ids, starts):
    return pd.DataFrame({"op_id": op_ids, "name": [f"aten::op{i}" for i in op_ids], "start_ns": starts,
                         "end_ns": [s + 5 for s in starts]})


def test_allocator_sized_threads_per_op():
    # op_threads is indexed by op id: ops 2, 0, 1 run on threads 12, 10, 11
    out = allocator_sized(_trace(_ops([2, 0, 1], [0, 10, 20])), [10, 11, 12], AllocatorConfig())
    assert out.ops["thread"].tolist() == [12, 10, 11]
    assert str(out.ops["thread"].dtype) == "int64"
    # more threads than ops (ids up to 3 seen by the session): still by id
    out = allocator_sized(_trace(_ops([2, 0, 1], [0, 10, 20])), [10, 11, 12, 13], AllocatorConfig())
    assert out.ops["thread"].tolist() == [12, 10, 11]
    # the session missed ops (fewer threads than ops): no thread column rather than a wrong one
    out = allocator_sized(_trace(_ops([2, 0, 1], [0, 10, 20])), [10, 11], AllocatorConfig())
    assert "thread" not in out.ops.columns
    # no ops: nothing to give a thread
    out = allocator_sized(_trace(), [10], AllocatorConfig())
    assert "thread" not in out.ops.columns


def _fake_retime(new_starts: dict[int, int], calls: list):
    def retime(trace, gpu):
        calls.append(gpu)
        out = Trace.from_tables(trace.blocks, ops=trace.ops.assign(start_ns=trace.ops["op_id"].map(new_starts)),
                                metadata={"prediction": {"gpu": gpu}})
        return out
    return retime


def test_onto_gpu_clock_moves_each_reset_mark_before_the_op_after_it(monkeypatch):
    # ops 5, 3, 9, 7 start at 100, 100, 300, 200: in time order (ties by id) 3, 5, 7, 9 at 100, 100, 200, 300
    trace = _trace(_ops([5, 3, 9, 7], [100, 100, 300, 200]))
    calls = []
    monkeypatch.setattr("memlens.devicetime.retiming.retime",
                        _fake_retime({3: 1000, 5: 1010, 7: 1020, 9: 1030}, calls))
    # the first op at or after each mark: 50 -> op 3, 100 -> op 3, 150 -> op 7, 300 -> op 9, 301 -> none
    # (dropped); on the new clock each mark sits 1 ns before its op: 999, 999, 1019, 1029
    out, marks = onto_gpu_clock(trace, "H100", [50, 100, 150, 300, 301])
    assert calls == ["H100"]
    assert marks == [999, 999, 1019, 1029]
    assert out.metadata["prediction"] == {"gpu": "H100", "reset_peak_ns": [999, 999, 1019, 1029]}
    assert out.ops.set_index("op_id")["start_ns"].to_dict() == {5: 1010, 3: 1000, 9: 1030, 7: 1020}
    assert out is not trace
    out, marks = onto_gpu_clock(_trace(_ops([5, 3, 9, 7], [100, 100, 300, 200])), "A100", [])
    assert marks == [] and out.metadata["prediction"]["reset_peak_ns"] == [] and calls[-1] == "A100"


def test_onto_gpu_clock_keeps_the_host_clock_when_retiming_fails(monkeypatch):
    def failing(trace, gpu):
        raise ValueError(f"no cost model for {gpu}")
    monkeypatch.setattr("memlens.devicetime.retiming.retime", failing)
    trace = _trace(_ops([1, 2], [10, 20]))
    marks = [15, 40]
    out, kept = onto_gpu_clock(trace, "Z9", marks)
    assert out is trace and kept is marks and kept == [15, 40]
    assert trace.metadata["notes"] == ["predict: not retimed onto a GPU clock (ValueError: no cost model for Z9); "
                                       "times are host times of fake execution"]
    # a trace whose metadata has no notes yet gets the list
    del trace.metadata["notes"]
    onto_gpu_clock(trace, "Z9", marks)
    assert len(trace.metadata["notes"]) == 1


def test_onto_gpu_clock_with_the_real_retime_and_no_cost_facts():
    # the real cost model needs the ops' cost facts: a trace without them stays on the host clock
    trace = _trace(_ops([1, 2], [10, 20]))
    out, kept = onto_gpu_clock(trace, "H100", [15])
    assert out is trace and kept == [15]
    assert trace.metadata["notes"][-1].startswith("predict: not retimed onto a GPU clock (InputError: ")


@pytest.mark.parametrize("threads", [[], [7]])
def test_allocator_sized_on_an_empty_trace(threads):
    trace = Trace.from_tables(pd.DataFrame({"block_id": [], "device": [], "size": []}))
    out = allocator_sized(trace, threads, AllocatorConfig())
    assert len(out.blocks) == 0 and "requested_size" in out.blocks.columns
