"""Any Kineto/Chrome trace loads, with or without [memory] events; one meaning of device time on every clock;
GPU work launched outside every op (a CUDA/HIP graph replayed from Python) belongs to its launch call.

Answers are computed by hand here (hand-made JSON, times in us as the profiler writes them) or from the raw
JSON of the shared profiles with their memory events stripped into tmp; the builders are in
tests/_kineto_cases.py."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest

import memlens
from _kineto_cases import _gpu, _launch, _memory, _op, by_name, hand_made
from memlens.clock import device_time_columns, inclusive_ns, op_parents, self_ns_of
from memlens.io.kineto.importer import NO_MEMORY_NOTE, import_kineto, kineto_to_trace

SMALL = ["kineto/tracelens_h100_bert_small.json.gz", "kineto/tracelens_mi300_bert_small.json.gz",
         "kineto/tracelens_h100_qwen_0.5b_chat.json.gz"]
LARGE = ["kineto/hta_df_index_resolver.json.gz", "kineto/kineto_resnet50_2021format.pt.trace.json.gz",
         "kineto/tracelens_h100_timesformer_base.json.gz", "kineto/tracelens_mi300_timesformer_base.json.gz",
         "kineto/tracelens_mi300_qwen_0.5b_chat.json.gz"]


def _strip_memory(src, dst):
    with gzip.open(src) as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"]
    dst.write_text(json.dumps(doc))
    return doc


# ---- 1. any trace loads -------------------------------------------------------------------------------
@pytest.mark.parametrize("rel", SMALL + [pytest.param(r, marks=pytest.mark.slow) for r in LARGE])
def test_a_shared_profile_without_memory_events_loads_the_same_ops_and_kernels(shared, tmp_path, rel):
    path = shared(rel)
    stripped = tmp_path / "stripped.json"
    doc = _strip_memory(path, stripped)
    full, bare = memlens.load(path), memlens.load(stripped)
    assert len(bare.blocks) == 0 and bare.events is None and bare.metadata["memory_events"] == 0
    assert NO_MEMORY_NOTE in bare.metadata["notes"]
    # the ops are the file's cpu_op events (plus one per launch made outside every op: none here)
    n_cpu_ops = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "Operator"))
    assert len(bare.ops) == n_cpu_ops
    cols = ["name", "flops", "bytes_read", "bytes_written", "kernels", "kernel_busy_ns", "parent_op_id"]
    pd.testing.assert_frame_equal(full.ops[cols], bare.ops[cols])
    assert full.metadata["gpu_activity"] == bare.metadata["gpu_activity"]
    a, b = memlens.onto_kernel_clock(full), memlens.onto_kernel_clock(bare)
    assert a.metadata["clock"]["device_busy_ns"] == b.metadata["clock"]["device_busy_ns"] > 0


def test_hand_made_trace_without_memory_has_ops_kernels_facts_and_clocks():
    doc = hand_made()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"]
    trace = kineto_to_trace(doc)
    ops = by_name(trace)
    assert len(trace.blocks) == 0 and list(ops.index) == ["aten::linear", "aten::t", "aten::transpose",
                                                          "aten::addmm", "aten::add", "aten::relu_"]
    assert ops.loc["aten::addmm", "flops"] == 2 * 64 * 128 * 256          # 2 M N K from the logged dims
    assert ops.loc["aten::add", "kernel_busy_ns"] == 4_000 + 6_000 + 2_000
    # t = 0 is the first op now (10 us), as with the memory events (whose first instant is later)
    assert ops.loc["aten::linear", "start_ns"] == 0 and ops.loc["aten::add", "start_ns"] == 190_000
    assert memlens.onto_kernel_clock(trace).metadata["clock"]["device_busy_ns"] == 42_000
    assert memlens.retime(trace, gpu="H100").metadata["clock"]["device_busy_ns"] > 0


def test_analyses_that_need_memory_say_the_file_has_none(tmp_path, capsys):
    from memlens.cli import main
    doc = hand_made()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"]
    path = tmp_path / "no_memory.json"
    path.write_text(json.dumps(doc))
    assert main(["info", str(path)]) == 0
    assert "no [memory] events" in capsys.readouterr().out
    assert main(["plan", str(path)]) == 2
    assert "no [memory] events" in capsys.readouterr().err


def test_a_trace_with_nothing_to_show_is_refused():
    with pytest.raises(memlens.InputError, match="no ops, no \\[memory\\] events and no GPU work"):
        kineto_to_trace({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}}]})


@pytest.mark.parametrize("text", ['{"model": "x", "weights": [' + "0, " * 9 + '0]}', '[1, 2, 3]',
                                  '{"a": "' + "x" * (17 << 20) + '"}'])
def test_a_file_that_is_not_a_trace_is_refused_before_it_is_parsed(tmp_path, monkeypatch, text):
    path = tmp_path / "not_a_trace.json"
    path.write_text(text)

    def never(*a, **k):
        raise AssertionError("parsed the whole file")
    monkeypatch.setattr("memlens.io.kineto.importer.load_json", never)
    with pytest.raises(memlens.InputError, match="not a Kineto/Chrome trace"):
        import_kineto(path)
    from memlens.io.kineto.stream import import_kineto_streamed
    monkeypatch.setattr("memlens.io.kineto.stream._read_document", never)
    with pytest.raises(memlens.InputError, match="not a Kineto/Chrome trace"):
        import_kineto_streamed(path)


def test_a_trace_whose_metadata_comes_first_still_loads(tmp_path):
    doc = hand_made()
    path = tmp_path / "late_events.json"
    # the trace's keys after 64 KiB of metadata: found by the deeper (bounded) look
    path.write_text(json.dumps({"metadata": {"pad": "x" * (64 << 10)}, "traceEvents": doc["traceEvents"]}))
    assert len(import_kineto(path).ops) == 6


# ---- 2. one meaning of device time --------------------------------------------------------------------
def _nested(parent_ids):
    return pd.DataFrame({"op_id": np.arange(len(parent_ids)),
                         "parent_op_id": pd.array([p if p >= 0 else pd.NA for p in parent_ids], dtype="Int64")})


def test_inclusive_and_own_times_by_hand():
    # op 0 (10 ns own) > op 1 (5 ns own) > op 2 (2 ns own); op 3 top level (7 ns); op 4 in op 0 (1 ns)
    ops = _nested([-1, 0, 1, -1, 0])
    parent = op_parents(ops)
    assert parent.tolist() == [-1, 0, 1, -1, 0]
    own = np.array([10, 5, 2, 7, 1])
    assert inclusive_ns(own, parent).tolist() == [18, 7, 2, 7, 1]
    assert self_ns_of([18, 7, 2, 7, 1], parent).tolist() == own.tolist()
    cols, busy = device_time_columns(ops, self_ns=own)
    assert busy == 18 + 7 == own.sum()
    cols2, busy2 = device_time_columns(ops, inclusive=[18, 7, 2, 7, 1])
    assert busy2 == busy and cols2["device_self_ns"].tolist() == own.tolist()
    # a table without nesting: every op is top level, own = inclusive
    flat = pd.DataFrame({"op_id": [0, 1]})
    assert device_time_columns(flat, self_ns=[3, 4])[1] == 7


def _parent_and_child(child_dur_us=0.005, parent_dur_us=0.010):
    """parent (cpu_op, 0..100 us) launches a kernel of `parent_dur_us`; child (20..40 us, inside it) launches
    one of `child_dur_us`; a second top-level op launches nothing."""
    f32 = "float"
    ev = [_op("aten::parent_op", 0, 100, 1, [[4]], [f32]), _op("aten::child_op", 20, 20, 2, [[4]], [f32]),
          _op("aten::other", 200, 10, 3, [[4]], [f32]),
          _launch(10, 11, 1), _launch(25, 12, 2),
          _gpu("kernel", "parent_kernel", 50, parent_dur_us, 11), _gpu("kernel", "child_kernel", 60, child_dur_us, 12)]
    return {"traceEvents": ev}


def test_measured_clock_parent_10ns_own_child_5ns_parent_inclusive_15():
    clocked = memlens.onto_kernel_clock(kineto_to_trace(_parent_and_child()))
    ops = by_name(clocked)
    assert ops.loc["aten::parent_op", "device_self_ns"] == 10 and ops.loc["aten::child_op", "device_self_ns"] == 5
    assert ops.loc["aten::parent_op", "device_ns"] == 15 and ops.loc["aten::child_op", "device_ns"] == 5
    assert ops.loc["aten::other", "device_ns"] == 0
    assert clocked.metadata["clock"]["device_busy_ns"] == 15


@pytest.mark.parametrize("calibrated", [False, True])
def test_modeled_and_calibrated_clocks_nest_and_sum_to_the_busy_time(calibrated):
    trace = kineto_to_trace(hand_made())
    gpu = memlens.calibrate(trace, base="H100") if calibrated else "H100"
    r = memlens.retime(trace, gpu=gpu)
    ops = by_name(r)
    own = ops["device_self_ns"]
    # hand: linear's inclusive = its own (0: composite) + t's (0) + addmm's; t's = its own + transpose's
    assert ops.loc["aten::linear", "device_ns"] == own["aten::linear"] + own["aten::t"] + own["aten::transpose"] \
        + own["aten::addmm"]
    assert ops.loc["aten::addmm", "device_ns"] == own["aten::addmm"] > 0
    top = ops["parent_op_id"].isna()
    busy = r.metadata["clock"]["device_busy_ns"]
    assert ops.loc[top, "device_ns"].sum() == busy == own.sum()
    # the parent spans its children: addmm runs inside linear on the modeled clock
    assert ops.loc["aten::linear", "start_ns"] <= ops.loc["aten::addmm", "start_ns"]
    assert ops.loc["aten::addmm", "end_ns"] <= ops.loc["aten::linear", "end_ns"]
    assert (ops["end_ns"] - ops["start_ns"] == ops["device_ns"]).all()


@pytest.mark.parametrize("rel", SMALL[:2])
def test_real_profile_top_level_ops_sum_to_the_busy_time_on_every_clock(shared, rel):
    trace = memlens.load(shared(rel))
    gpu = "MI300X" if "mi300" in rel else "H100"
    for clocked in (memlens.onto_kernel_clock(trace), memlens.retime(trace, gpu=gpu),
                    memlens.retime(trace, gpu=memlens.calibrate(trace, base=gpu))):
        ops = clocked.ops
        busy = clocked.metadata["clock"]["device_busy_ns"]
        assert busy > 0
        assert ops.loc[ops["parent_op_id"].isna(), "device_ns"].sum() == pytest.approx(busy, rel=0.01)
        assert ops["device_self_ns"].sum() == pytest.approx(busy, rel=0.01)
        assert (ops["device_self_ns"] >= 0).all()


# ---- 3. graph replays and launches outside every op ---------------------------------------------------
def _graph_replay(launch_name="cudaGraphLaunch", inside_op=False):
    """An op (0..50 us) that launches one kernel (3 us); then a graph launch at 100 us (correlation 50, the
    External id of a user annotation, not of an op) whose replay runs three kernels of 2, 4 and 6 us; when
    `inside_op`, a cpu_op (90..120 us) is around the graph launch."""
    ev = [_op("aten::mm", 0, 50, 1, [[4, 4], [4, 4]], ["float", "float"]),
          {"ph": "X", "cat": "user_annotation", "name": "execute_model", "pid": 1, "tid": 1, "ts": 80, "dur": 100,
           "args": {"External id": 7}},
          _launch(10, 11, 1), _launch(100, 50, 7, name=launch_name),
          _gpu("kernel", "mm_kernel", 20, 3, 11),
          _gpu("kernel", "graph_k1", 110, 2, 50), _gpu("kernel", "graph_k2", 113, 4, 50),
          _gpu("kernel", "graph_k3", 118, 6, 50), _memory(5, 64, 4096)]
    if inside_op:
        ev.append(_op("vllm::replay", 90, 30, 8, [], []))
    return {"traceEvents": ev}


@pytest.mark.parametrize("launch_name", ["cudaGraphLaunch", "hipGraphLaunch"])
def test_graph_replay_outside_every_op_belongs_to_its_launch(launch_name):
    trace = kineto_to_trace(_graph_replay(launch_name))
    ops = by_name(trace)
    assert ops.loc[launch_name, "kernels"] == 3 and ops.loc[launch_name, "kernel_busy_ns"] == 12_000
    assert ops.loc[launch_name, "parent_op_id"] is pd.NA
    # the launch op spans the runtime call on the host clock: 100 us from t0 = 0 us, 1 us long
    assert ops.loc[launch_name, "start_ns"] == 100_000 and ops.loc[launch_name, "end_ns"] == 101_000
    act = trace.metadata["gpu_activity"]
    assert act["attributed"] == 4 and act["launched_outside_ops"] == 3 and act["launched_before_profiling"] == 0
    clocked = memlens.onto_kernel_clock(trace)
    # measured clock = every kernel: 3 + 2 + 4 + 6 us
    assert clocked.metadata["clock"]["device_busy_ns"] == 15_000 and clocked.metadata["clock"]["kernels"] == 4
    out = by_name(clocked)
    assert out.loc[launch_name, "start_ns"] == (110 - 20) * 1000 and out.loc[launch_name, "end_ns"] == 104_000


def test_graph_replay_inside_an_op_belongs_to_that_op():
    trace = kineto_to_trace(_graph_replay(inside_op=True))
    ops = by_name(trace)
    assert "cudaGraphLaunch" not in ops.index
    assert ops.loc["vllm::replay", "kernels"] == 3 and ops.loc["vllm::replay", "kernel_busy_ns"] == 12_000
    assert trace.metadata["gpu_activity"]["launched_outside_ops"] == 0
    assert memlens.onto_kernel_clock(trace).metadata["clock"]["device_busy_ns"] == 15_000


def test_the_streamed_reader_makes_the_same_launch_ops(tmp_path):
    from memlens.io.kineto.stream import import_kineto_streamed
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(_graph_replay()))
    whole, streamed = import_kineto(path), import_kineto_streamed(path)
    pd.testing.assert_frame_equal(whole.ops, streamed.ops)
    assert whole.metadata["gpu_activity"] == streamed.metadata["gpu_activity"]


# ---- 4. collectives priced by the link model ----------------------------------------------------------
def _collectives(group_size=8, distributed=None):
    """c10d::allreduce_ (0..50 us) around record_param_comms (all-reduce of 2^20 fp32 over `group_size` ranks,
    None: not logged), then c10d::_allgather_base_ around record_param_comms (2^18 bf16 in, 2^21 out)."""
    def comms(ts, name, n_in, n_out, dtype):
        args = {"External id": ts, "Collective name": name, "In msg nelems": n_in, "Out msg nelems": n_out,
                "dtype": dtype}
        if group_size is not None:
            args["Group size"] = group_size
        return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": ts, "dur": 20,
                "args": args}
    ev = [_op("c10d::allreduce_", 0, 50, 1, [[1 << 20]], ["float"]), comms(10, "allreduce", 1 << 20, 1 << 20, "Float"),
          _op("c10d::_allgather_base_", 100, 50, 2, [[1 << 21], [1 << 18]], ["c10::BFloat16"] * 2),
          comms(110, "_allgather_base", 1 << 18, 1 << 21, "BFloat16")]
    doc = {"traceEvents": ev}
    if distributed:
        doc["distributedInfo"] = distributed
    return doc


def _ring_or_tree(kind, nbytes, n, bw, step_ns=1000.0):
    """The collective model's formulas, written out by hand (0.8 of the link's bandwidth)."""
    f = 2 if kind == "all_reduce" else 1
    ring = f * (n - 1) / n * nbytes / (0.8 * bw) * 1e9 + f * (n - 1) * step_ns
    tree = 2 * nbytes / (0.8 * bw) * 1e9 + 2 * int(np.ceil(np.log2(n))) * step_ns
    return min(ring, tree) if kind == "all_reduce" and n > 2 else ring


def test_record_param_comms_carries_the_collective():
    ops = by_name(kineto_to_trace(_collectives()))
    assert ops.loc["c10d::allreduce_", "collective"] == "" and ops.loc["c10d::_allgather_base_", "collective"] == ""
    rows = ops.loc["record_param_comms"]
    assert rows["collective"].tolist() == ["all_reduce", "all_gather"]
    # all-reduce: the tensor (2^20 x 4 B); all-gather: the gathered output (2^21 x 2 B)
    assert rows["collective_bytes"].tolist() == [4 << 20, 4 << 20] and rows["group_size"].tolist() == [8, 8]
    # no group size logged: the trace's world size
    no_group = by_name(kineto_to_trace(_collectives(None, {"world_size": 4, "rank": 0})))
    assert no_group.loc["record_param_comms", "group_size"].tolist() == [4, 4]


def test_collectives_are_priced_once_by_the_link_model():
    from memlens.devicetime.gpus import gpu
    h100 = gpu("H100")
    r = memlens.retime(kineto_to_trace(_collectives()), gpu="H100")
    ops = by_name(r)
    comms = ops.loc["record_param_comms"]
    expected = [_ring_or_tree("all_reduce", 4 << 20, 8, h100.nvlink_bw), _ring_or_tree("all_gather", 4 << 20, 8,
                                                                                         h100.nvlink_bw)]
    assert comms["op_class"].tolist() == ["communication"] * 2
    assert comms["device_self_ns"].tolist() == [round(x) for x in expected]
    # the c10d op launches nothing of its own; its inclusive time is its collective's
    assert ops.loc["c10d::allreduce_", "device_self_ns"] == 0
    assert ops.loc["c10d::allreduce_", "device_ns"] == round(expected[0])
    assert r.metadata["clock"]["device_busy_ns"] == sum(round(x) for x in expected)


def test_the_streamed_reader_keeps_the_collective_arguments(tmp_path):
    from memlens.io.kineto.stream import import_kineto_streamed
    path = tmp_path / "comms.json"
    path.write_text(json.dumps(_collectives()))
    pd.testing.assert_frame_equal(import_kineto(path).ops, import_kineto_streamed(path).ops)
