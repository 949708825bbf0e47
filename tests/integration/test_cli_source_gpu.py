"""`--source-gpu NAME` on the verbs that retime with --gpu: the GPU a measured profile ran on reaches
`memlens.retime`, and the measured kernel times are scaled from it (hand-computed memory-rate ratios); an
unknown name, a missing --gpu or a trace without kernel times exit 2 with one line saying what is wrong."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import memlens
from memlens.cli import main
from memlens.devicetime.gpu_table import BUILTIN

MEASURED_NS = 1_000_000


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A saved trace on the measured kernel clock of a GPU the table does not know: one op of 1 ms own time
    without cost facts or kernels (so it scales by the memory-rate ratio alone, no floor), one block it writes
    and then reads."""
    from memlens.clock import device_time_columns
    ops = pd.DataFrame({"op_id": [0], "name": ["triton_fused"], "flops": [0], "bytes_read": [0],
                        "bytes_written": [0], "dtype": ["float32"], "kernels": [0],
                        "parent_op_id": pd.array([None], dtype="Int64")})
    cols, busy = device_time_columns(ops, self_ns=np.array([MEASURED_NS], dtype=np.int64))
    ops["start_ns"], ops["end_ns"] = [0], cols["device_ns"]
    ops["device_self_ns"], ops["device_ns"] = cols["device_self_ns"], cols["device_ns"]
    blocks = pd.DataFrame({"block_id": [0], "addr": [0], "size": [1 << 20], "alloc_ns": [0],
                           "free_ns": [MEASURED_NS], "device": ["cuda:0"]})
    clock = {"kind": "cuda", "gpu": "Some Accelerator 9000", "model": None, "from": "host", "device_busy_ns": busy,
             "kernels": 0, "source_units": None}
    accesses = pd.DataFrame({"block_id": [0, 0], "t_ns": [0, MEASURED_NS], "op_id": [0, 0], "is_write": [True, False]})
    trace = memlens.Trace.from_tables(blocks, accesses, ops, metadata={"clock": clock})
    return trace.save(tmp_path_factory.mktemp("measured") / "measured.memlens")


# memory-rate ratios (HBM bandwidth x 0.85 on both NVIDIA parts: the efficiency cancels), by hand:
# H100 SXM 3.35 TB/s -> H200 4.8 TB/s: 1 ms x 3.35 / 4.8 = 697,916.7 ns; L4 0.3 TB/s -> H200: 1 ms x 0.3 / 4.8
EXPECTED = {"H100": 697_917, "L4": 62_500}


@pytest.mark.parametrize("source", sorted(EXPECTED))
def test_retime_scales_the_measured_time_from_the_source_gpu(source, measured, tmp_path, capsys):
    code = main(["retime", str(measured), "-o", str(tmp_path / "out.memlens"), "--gpu", "H200",
                 "--source-gpu", source, "--json"])
    assert code == 0
    clock = json.loads(capsys.readouterr().out)["clock"]
    assert clock["measured_gpu"] == {"H100": "H100 SXM", "L4": "L4"}[source] and clock["gpu"] == "H200"
    assert clock["device_busy_ns"] == EXPECTED[source]
    assert memlens.load(tmp_path / "out.memlens").ops["device_self_ns"].tolist() == [EXPECTED[source]]


def test_without_source_gpu_an_unknown_device_is_refused_naming_the_option(measured, tmp_path, capsys):
    assert main(["retime", str(measured), "-o", str(tmp_path / "o.memlens"), "--gpu", "H200"]) == 2
    err = capsys.readouterr().err
    assert "Some Accelerator 9000" in err and "--source-gpu" in err and len(err.strip().splitlines()) == 1


SPY_VERBS = {"ati": [], "outliers": [], "simulate": [], "swap": [],
             "report": ["-o", "{tmp}/r.html", "--no-whatif"]}


@pytest.mark.parametrize("verb", sorted(SPY_VERBS))
def test_the_analysis_verbs_hand_the_source_gpu_to_retime(verb, measured, tmp_path, monkeypatch, capsys):
    import memlens.devicetime.retiming as retiming
    real, seen = retiming.retime, []

    def spy(trace, gpu="H100", **kw):
        seen.append((getattr(gpu, "name", gpu), getattr(kw.get("source_gpu"), "name", kw.get("source_gpu"))))
        out = real(trace, gpu=gpu, **kw)
        seen.append(out.metadata["clock"]["device_busy_ns"])
        return out

    monkeypatch.setattr(retiming, "retime", spy)
    extra = [a.format(tmp=tmp_path) for a in SPY_VERBS[verb]]
    code = main([verb, str(measured), *extra, "--gpu", "H200", "--source-gpu", "l4", "--json"])
    assert code == 0, capsys.readouterr().err
    assert seen == [("H200", "L4"), EXPECTED["L4"]]


@pytest.mark.parametrize("verb,extra", [("retime", ["-o", "{tmp}/o.memlens", "--gpu", "H200"]),
                                        ("swap", ["--gpu", "H200"]), ("report", ["-o", "{tmp}/r.html"])])
def test_an_unknown_source_gpu_exits_2_naming_the_known_gpus(verb, extra, measured, tmp_path, capsys):
    args = [verb, str(measured), *[a.format(tmp=tmp_path) for a in extra], "--source-gpu", "Z9000"]
    if verb == "report":
        args += ["--gpu", "H200"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown GPU 'Z9000'" in err
    assert all(g.name in err for g in BUILTIN)


@pytest.mark.parametrize("verb,extra", [("swap", []), ("ati", []), ("report", ["-o", "{tmp}/r.html"])])
def test_source_gpu_without_gpu_exits_2(verb, extra, measured, tmp_path, capsys):
    assert main([verb, str(measured), *[a.format(tmp=tmp_path) for a in extra], "--source-gpu", "H100"]) == 2
    err = capsys.readouterr().err
    assert "--source-gpu" in err and "--gpu" in err and len(err.strip().splitlines()) == 1


def test_a_trace_without_kernel_times_is_refused_with_its_file(measured, tmp_path, capsys):
    host = memlens.load(measured)
    host.metadata["clock"] = {"kind": "host"}                 # a recording on the host clock, no kernel times
    path = host.save(tmp_path / "host.memlens")
    assert main(["retime", str(path), "-o", str(tmp_path / "o.memlens"), "--gpu", "H200",
                 "--source-gpu", "H100"]) == 2
    err = capsys.readouterr().err
    assert "host.memlens" in err and "kernel times" in err and "--source-gpu" in err
