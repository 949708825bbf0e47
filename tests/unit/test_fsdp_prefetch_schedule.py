"""FSDP2's all-gather prefetch on the step schedule (memlens.prediction.distributed.steptime), by hand on a
two-layer forward: each layer's copy-in (FSDP2's copy-in stream) waits for the previous layer's copy-out and
for the parameters it reads, its all-gather for the copy-in, so a layer's all-gather hides behind the
previous layer's compute: exposed = sum over layers of max(0, copy-in + all-gather - compute it overlaps)."""
import pandas as pd
import pytest

from memlens.devicetime.gpus import gpu
from memlens.prediction.distributed.steptime import collective_ns, step_time

H100 = gpu("H100")
S = 48_000_000                       # bytes gathered per layer
AG = 103_000                         # 3/4 x 48 MB / (450 GB/s x 0.8) + 3 x 1 us, 4 ranks (by hand)
COPY_IN, COPY_OUT = 10_000, 5_000


class FakeTrace:
    def __init__(self, ops, acc, blocks=None):
        self.ops, self.accesses = ops, acc
        if blocks is not None:
            self.blocks = blocks


def two_layers(compute_ns: int, optimizer_ns: int = 0, cast_ns: int = 0):
    """[optimizer write of both shards,] then per layer: [a cast of the shard into block 30 / 40, allocated
    on FSDP2's copy-in stream 1,] copy-in (reads the shard or its cast, writes the gathered buffer, stream 1),
    the all-gather (reads and writes it), the copy-out (reads it, writes the unsharded parameter), a matmul of
    `compute_ns` reading the parameter. Blocks: shards 1, 2; gathered 10, 20; parameters 11, 21."""
    rows, acc = [], []

    def op(name, ns, reads=(), writes=(), nbytes=(0, 0)):
        i = len(rows)
        rows.append({"op_id": i, "name": name, "dur": ns, "bytes_read": nbytes[0], "bytes_written": nbytes[1]})
        acc.extend({"block_id": b, "t_ns": 0, "op_id": i, "is_write": False} for b in reads)
        acc.extend({"block_id": b, "t_ns": 0, "op_id": i, "is_write": True} for b in writes)
    if optimizer_ns:
        op("aten::_foreach_add_", optimizer_ns, reads=(1, 2), writes=(1, 2))
    for shard, cast, gathered, param in ((1, 30, 10, 11), (2, 40, 20, 21)):
        if cast_ns:
            op("aten::_foreach_copy_", cast_ns, reads=(shard,), writes=(cast,))
        op("fsdp::all_gather_copy_in", COPY_IN, reads=(cast if cast_ns else shard,), writes=(gathered,))
        op("c10d::_allgather_base_", 1_000, reads=(gathered,), writes=(gathered,), nbytes=(S + S // 4, S))
        op("fsdp::split_with_sizes_copy", COPY_OUT, reads=(gathered,), writes=(param,))
        op("aten::mm", compute_ns, reads=(param,))
    t, ops = 0, pd.DataFrame(rows)
    starts = []
    for d in ops["dur"]:                 # host-order start/end with the given durations (as retime does)
        starts.append(t)
        t += d
    ops["start_ns"] = starts
    ops["end_ns"] = ops["start_ns"] + ops["dur"]
    blocks = pd.DataFrame({"block_id": [1, 2, 10, 20, 11, 21, 30, 40], "stream": [0, 0, 1, 1, 0, 0, 1, 1]})
    return FakeTrace(ops.drop(columns="dur"), pd.DataFrame(acc), blocks)


def test_ring_time_used_by_hand():
    assert collective_ns("all_gather", S, 4, H100) == pytest.approx(AG)


@pytest.mark.parametrize("compute_ns", [200_000, 50_000, 113_000])
def test_exposed_all_gather_is_what_the_previous_layers_compute_cannot_hide(compute_ns):
    t = step_time(two_layers(compute_ns), 4, H100)
    sched = t["schedule"].set_index("op_id")
    # layer 0: copy-in 0..10_000, AG 10_000..113_000, copy-out waits for it: 113_000..118_000, mm to 118_000 + C
    assert (sched.loc[0, "start_ns"], sched.loc[1, "start_ns"], sched.loc[1, "end_ns"]) == (0, COPY_IN, COPY_IN + AG)
    assert (sched.loc[2, "start_ns"], sched.loc[2, "wait_ns"]) == (COPY_IN + AG, COPY_IN + AG)
    # layer 1: its copy-in waits for layer 0's copy-out (ends 118_000), not for layer 0's matmul
    copy_out_0 = COPY_IN + AG + COPY_OUT
    assert (sched.loc[4, "start_ns"], sched.loc[4, "stream"]) == (copy_out_0, "all_gather_copy_in")
    assert (sched.loc[5, "start_ns"], sched.loc[5, "end_ns"]) == (copy_out_0 + COPY_IN, copy_out_0 + COPY_IN + AG)
    # layer 1's copy-out waits max(0, copy-in + AG - compute of layer 0)
    per_layer = [COPY_IN + AG, max(0, COPY_IN + AG - compute_ns)]
    assert sched.loc[6, "wait_ns"] == per_layer[1]
    compute = 2 * (COPY_OUT + compute_ns)
    assert t["compute_ns"] == compute and t["copy_in_ns"] == 2 * COPY_IN and t["comm_ns"] == 2 * AG
    assert t["exposed_comm_ns"] == sum(per_layer) and t["step_ns"] == compute + sum(per_layer)


def test_copy_in_waits_for_the_optimizer_that_wrote_the_shards():
    t = step_time(two_layers(200_000, optimizer_ns=30_000), 4, H100)
    sched = t["schedule"].set_index("op_id")
    # the optimizer 0..30_000 writes both shards: layer 0's copy-in 30_000..40_000, its AG 40_000..143_000
    assert (sched.loc[1, "start_ns"], sched.loc[2, "start_ns"], sched.loc[2, "end_ns"]) == (30_000, 40_000, 143_000)
    # nothing else changes: the first layer's copy-in and all-gather are exposed, the second's hidden
    assert t["exposed_comm_ns"] == COPY_IN + AG and t["step_ns"] == 30_000 + COPY_IN + AG + 2 * (COPY_OUT + 200_000)


def test_the_casts_into_the_copy_in_buffer_run_on_the_copy_in_stream():
    # per layer a 20 us cast (mixed precision) before the copy-in, both on stream 1: layer 0 cast 0..20_000,
    # copy-in 20_000..30_000, AG 30_000..133_000, copy-out 133_000..138_000, mm 138_000..338_000; layer 1's
    # cast waits for layer 0's copy-out only: 138_000..158_000, copy-in ..168_000, AG ..271_000 (hidden)
    t = step_time(two_layers(200_000, cast_ns=20_000), 4, H100)
    sched = t["schedule"].set_index("op_id")
    assert (sched.loc[5, "start_ns"], sched.loc[5, "stream"]) == (138_000, "all_gather_copy_in")
    assert (sched.loc[7, "start_ns"], sched.loc[7, "end_ns"]) == (168_000, 271_000)
    assert t["compute_ns"] == 2 * (COPY_OUT + 200_000) and t["copy_in_ns"] == 2 * (20_000 + COPY_IN)
    assert t["exposed_comm_ns"] == 20_000 + COPY_IN + AG and t["step_ns"] == 133_000 + 2 * (COPY_OUT + 200_000)
    # without the blocks' streams the cast is a compute op at its host position: layer 1's copy-in waits for it
    no_streams = two_layers(200_000, cast_ns=20_000)
    del no_streams.blocks
    t2 = step_time(no_streams, 4, H100)
    assert t2["compute_ns"] == t["compute_ns"] + 2 * 20_000
