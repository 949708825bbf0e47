"""Step time on the modeled clock with collectives (memlens.prediction.distributed.steptime), values by hand."""
import pandas as pd
import pytest

from _predict_cases import FSDP_MLP, FSDP_SCRIPT_STEP, ROOT, run_child
from memlens.devicetime.gpus import gpu
from memlens.prediction.distributed.steptime import collective_ns, schedule, step_time

H100 = gpu("H100")
S = 48_000_000          # bytes gathered


def tiny(middle_ns, name="c10d::_allgather_base_"):
    """copy-in 10 us; the collective (writes block 7); an independent compute op of `middle_ns` (reads block 1);
    the consumer (5 us, reads block 7). Durations are the ops' modeled times (end - start)."""
    ops = pd.DataFrame({"op_id": [0, 1, 2, 3], "name": ["fsdp::all_gather_copy_in", name, "aten::mm", "aten::relu"],
                        "start_ns": [0, 10_000, 11_000, 11_000 + middle_ns],
                        "end_ns": [10_000, 11_000, 11_000 + middle_ns, 16_000 + middle_ns],
                        # as the recorder counts an all-gather: reads shard + gathered output, writes the output
                        "bytes_read": [S // 4, S + S // 4, 0, 0], "bytes_written": [S, S, 0, 0]})
    acc = pd.DataFrame({"block_id": [7, 7, 1, 7], "t_ns": [0, 0, 0, 0], "op_id": [0, 1, 2, 3],
                        "is_write": [True, True, False, False]})
    return ops, acc


class FakeTrace:
    def __init__(self, ops, acc):
        self.ops, self.accesses = ops, acc


def test_ring_all_gather_duration_by_hand_intra_and_inter_node():
    # N=4 in one node: NVLink 450 GB/s x 0.8 = 360 GB/s; 3/4 x 48 MB / 360 GB/s = 100 us, + 3 steps x 1 us
    assert collective_ns("all_gather", S, 4, H100) == pytest.approx(103_000)
    # N=16 over 2 nodes, hierarchical: all-gather of S/8 across the 2 nodes over each GPU's NIC (NDR 50 GB/s x
    # 0.8 = 40 GB/s): 1/2 x 6 MB / 40 GB/s = 75 us + 1 x 5 us; then the node's all-gather of S over NVLink:
    # 7/8 x 48 MB / 360 GB/s = 116.667 us + 7 x 1 us
    assert collective_ns("all_gather", S, 16, H100) == pytest.approx(80_000 + 123_666.667)
    # all-reduce: twice the ring (reduce-scatter then all-gather)
    assert collective_ns("all_reduce", S, 4, H100) == pytest.approx(206_000)
    assert collective_ns("all_gather", S, 1, H100) == 0


def test_compute_hides_the_all_gather_fully():
    t = step_time(FakeTrace(*tiny(200_000)), 4, H100)
    # copy-in 0..10_000 on FSDP2's copy-in stream; AG 10_000..113_000; mm 0..200_000 on the compute stream
    # (it waits for neither); relu 200_000..205_000 with no wait
    assert (t["step_ns"], t["compute_ns"], t["comm_ns"], t["exposed_comm_ns"]) == (205_000, 205_000, 103_000, 0)
    assert t["copy_in_ns"] == 10_000
    sched = t["schedule"].set_index("op_id")
    assert (sched.loc[1, "start_ns"], sched.loc[1, "end_ns"], sched.loc[1, "stream"]) == (10_000, 113_000,
                                                                                         "all_gather")
    assert (sched.loc[0, "start_ns"], sched.loc[0, "end_ns"], sched.loc[0, "stream"]) == (0, 10_000,
                                                                                         "all_gather_copy_in")


def test_consumer_waits_for_the_all_gather_when_compute_is_short():
    t = step_time(FakeTrace(*tiny(50_000)), 4, H100)
    # mm 0..50_000; relu waits for the AG (ends 113_000): step 118_000, compute 55_000, exposed 63_000
    assert (t["step_ns"], t["compute_ns"], t["exposed_comm_ns"]) == (118_000, 55_000, 63_000)
    assert t["schedule"].set_index("op_id").loc[3, "wait_ns"] == 63_000
    t16 = step_time(FakeTrace(*tiny(50_000)), 16, H100)
    # inter-node (hierarchical, 203_666.67 ns): AG 10_000..213_667; mm ends 50_000; relu 213_667..218_667
    assert (t16["step_ns"], t16["exposed_comm_ns"], t16["link"]) == (218_667, 163_667, "NVLink + network")


def test_collectives_on_one_stream_queue_behind_each_other():
    ops, acc = tiny(1_000)
    ops2 = pd.concat([ops.iloc[:2], ops.iloc[1:2].assign(op_id=9)], ignore_index=True)
    acc2 = acc[acc.op_id < 2]
    sched = schedule(ops2, acc2, 4, H100).set_index("op_id")
    # the first starts when its copy-in ends (10_000); the second (fed by no copy-in: issued at the compute
    # stream's time, 0) queues behind it on the all-gather stream
    assert (sched.loc[9, "start_ns"], sched.loc[9, "end_ns"]) == (113_000, 216_000)


def test_an_all_to_all_op_is_timed_on_its_own_stream():
    from memlens.prediction.distributed.steptime import collective_kind
    # torch's names for it: c10d's ops and the functional collective
    for name in ("c10d::alltoall_", "c10d::alltoall_base_", "_c10d_functional::all_to_all_single"):
        assert collective_kind(name) == ("all_to_all", 1)
    # its message is the send buffer (read = input + output, written = output, all S): 7/8 x S / 360 GB/s + 7 us
    t = step_time(FakeTrace(*tiny(1_000, name="c10d::alltoall_base_")), 8, H100)
    sched = t["schedule"].set_index("op_id")
    assert sched.loc[1, "stream"] == "all_to_all"
    assert sched.loc[1, "end_ns"] - sched.loc[1, "start_ns"] == pytest.approx(7 / 8 * S / (0.8 * 450e9) * 1e9
                                                                              + 7_000, abs=1)   # whole ns


def test_gpu_without_network_bandwidth_is_a_clear_error():
    from memlens.errors import InputError
    custom = gpu("H100").__class__(name="x", flops={"bf16": 1e15}, mem_bw=1e12)
    with pytest.raises(InputError, match="network_bw"):
        collective_ns("all_gather", S, 16, custom)


def test_fsdp2_predicted_rank_gets_collective_times_and_a_step_clock():
    r = run_child(FSDP_MLP + """
from memlens.prediction.distributed.steptime import collective_ns
def step():
    fsdp_mlp_step()
d = memlens.predict(step, gpu="H100", world_size=4)
st = d.step_time()[0]
tt = d.timed_trace(0)
o = d.predictions[0].trace.ops
coll = o[o.name.str.startswith("c10d::")]
result = {
    "names": sorted(coll.name.unique().tolist()),
    "comm_ns": st["comm_ns"], "step_ns": st["step_ns"], "compute_ns": st["compute_ns"],
    "exposed": st["exposed_comm_ns"], "n": st["collectives"],
    "compute_by_hand": int((o.end_ns - o.start_ns)[~o.name.str.startswith("c10d::")
                                                   & (o.name != "fsdp::all_gather_copy_in")].sum()),
    "copy_in_by_hand": int((o.end_ns - o.start_ns)[o.name == "fsdp::all_gather_copy_in"].sum()),
    "copy_in_ns": st["copy_in_ns"],
    "clock": tt.metadata["clock"], "tt_end": int(tt.ops.end_ns.max()),
    "tt_streams": sorted(tt.ops.stream.unique().tolist())}
""")
    # FSDP2 on 2 Linear groups + root: 4 all-gathers (forward, backward re-gather) and 2 reduce-scatters
    assert r["names"] == ["c10d::_allgather_base_", "c10d::_reduce_scatter_base_"] and r["n"] == 6
    # gathered / unreduced sizes: Linear(1000, 510) with bias padded to 4 x 128 rows x 1001 fp32, Linear(510, 7)
    # to 4 x 2 x 511; each gathered twice (forward, backward) and reduce-scattered once
    big, small = 4 * 128 * 1001 * 4, 4 * 2 * 511 * 4
    # by hand: 3/4 x S / (450 GB/s x 0.8) + 3 steps x 1 us per collective (rings: trees are for all-reduce)
    by_hand = sum(3 * round(0.75 * s / 360e9 * 1e9 + 3_000) for s in (big, small))
    assert abs(r["comm_ns"] - by_hand) <= 6
    assert r["compute_ns"] == r["compute_by_hand"] and r["copy_in_ns"] == r["copy_in_by_hand"] > 0
    assert r["step_ns"] == r["compute_ns"] + r["exposed"] and r["exposed"] >= 0
    assert r["clock"]["kind"] == "modeled" and r["clock"]["gpu"] == "H100 SXM" and "ring" in r["clock"]["model"]
    assert r["tt_end"] == r["step_ns"]
    assert r["tt_streams"] == ["all_gather", "all_gather_copy_in", "compute", "reduce_scatter"]


def test_cli_world_size_prints_the_modeled_step_time(tmp_path):
    import json
    import os
    import subprocess
    import sys
    import textwrap
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch.distributed.fsdp import fully_shard
        torch.distributed.init_process_group("nccl")
    """) + FSDP_SCRIPT_STEP)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "memlens", "predict", "--gpu", "H100", *args, "--", "python",
                               str(script)], capture_output=True, text=True, cwd=ROOT, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    js = cli("--world-size", "4", "--ranks", "first", "--json")
    assert js.returncode == 0, js.stderr[-2000:]
    t = json.loads(js.stdout[js.stdout.index("{"):])["step_time"]["0"]
    # gathered sizes: 4 shards of 128 x (256 + bias) and of 64 x (512 + bias) fp32; each gathered in forward and
    # backward and reduce-scattered once; ring over NVLink 450 GB/s x 0.8, 3 steps x 1 us
    by_hand = sum(3 * round(0.75 * s / 360e9 * 1e9 + 3_000) for s in (4 * 128 * 257 * 4, 4 * 64 * 513 * 4))
    assert t["collectives"] == 6 and t["link"] == "NVLink" and abs(t["comm_ns"] - by_hand) <= 6
    assert t["step_ns"] == t["compute_ns"] + t["exposed_comm_ns"]
    text = cli("--world-size", "4", "--ranks", "first")
    assert "step time:  rank 0" in text.stdout and "modeled, not measured" in text.stdout, text.stdout


def test_a_trace_without_collectives_says_communication_is_not_timed():
    ops, acc = tiny(1_000)
    keep = ops["op_id"] != 1
    ops = ops.assign(name=ops["name"].replace("fsdp::all_gather_copy_in", "aten::copy_"))   # no FSDP2 copy-in
    t = step_time(FakeTrace(ops[keep].reset_index(drop=True), acc[acc.op_id != 1]), 8, H100)
    # compute only: 10_000 + 1_000 + 5_000 back to back, nothing waits
    assert (t["step_ns"], t["comm_ns"], t["exposed_comm_ns"], t["collectives"]) == (16_000, 0, 0, 0)
    assert "not timed" in t["note"] and t["ddp_all_reduces"] == []
    assert step_time(FakeTrace(*tiny(1_000)), 8, H100)["note"] == ""
