"""The faces of device time: `memlens gpus`, `memlens retime`, --gpu on the analysis verbs, the report's
clock statements and its recorded-vs-modeled tables, and the %%memlens --gpu magic."""
from __future__ import annotations

import json

import pytest
import torch

import memlens
from memlens.cli import main


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A small training run recorded by memlens (with cost facts), saved."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    with memlens.record(model) as rec:
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            memlens.step()
    return rec.trace.save(tmp_path_factory.mktemp("faces") / "run.memlens")


def test_gpus_lists_the_table(capsys):
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    for name in ("H100 SXM", "H200", "A100 SXM 80GB", "L4", "V100 SXM2 32GB", "MI300X"):
        assert name in out
    assert main(["gpus", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"H100 SXM", "MI300X"} and all(r["source"] for r in rows)


def test_retime_writes_a_trace_on_the_modeled_clock(recorded, tmp_path, capsys):
    out = tmp_path / "h100.memlens"
    assert main(["retime", str(recorded), "-o", str(out), "--gpu", "H100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["clock"]["kind"] == "modeled" and doc["clock"]["gpu"] == "H100 SXM"
    assert doc["recorded_clock"]["kind"] == "host" and doc["recorded_clock"]["gpu"] is None
    assert doc["duration_ns"] < doc["recorded_duration_ns"]
    back = memlens.load(out)
    assert back.metadata["clock"]["gpu"] == "H100 SXM"
    assert (back.ops["end_ns"] - back.ops["start_ns"] == back.ops["device_ns"]).all()
    assert main(["retime", str(recorded), "-o", str(out), "--gpu", "H100"]) == 2      # exists: no overwrite
    assert "already exists" in capsys.readouterr().err


def test_retime_bad_input_is_one_line(recorded, tmp_path, capsys):
    assert main(["retime", str(recorded), "-o", str(tmp_path / "x.memlens"), "--gpu", "H900"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown GPU 'H900'" in err[0]
    csv = tmp_path / "b.csv"
    csv.write_text("id,lower,upper,size\n0,0,10,100\n")
    assert main(["retime", str(csv), "-o", str(tmp_path / "y.memlens")]) == 2
    assert "has no ops" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["ati", "outliers", "swap"])
def test_analysis_verbs_state_and_use_the_clock(verb, recorded, capsys):
    assert main([verb, str(recorded)]) == 0
    host = capsys.readouterr().out
    # swap aligns its labels in a column; ati and outliers print "clock: " plainly
    label = "clock:        host clock" if verb == "swap" else "clock: host clock"
    assert label in host
    assert main([verb, str(recorded), "--gpu", "H100"]) == 0
    out = capsys.readouterr().out
    assert "modeled H100 SXM clock" in out
    if verb != "ati":   # the GPU's own host link is the default link; --bandwidth still wins
        assert "H100 SXM PCIe 5.0 x16" in out
        assert main([verb, str(recorded), "--gpu", "H100", "--bandwidth", "pcie3"]) == 0
        assert "pcie3_x16" in capsys.readouterr().out


def test_ati_json_carries_the_clock_and_intervals_shrink(recorded, capsys):
    assert main(["ati", str(recorded), "--json"]) == 0
    host = json.loads(capsys.readouterr().out)
    assert main(["ati", str(recorded), "--json", "--gpu", "H100"]) == 0
    gpu = json.loads(capsys.readouterr().out)
    assert host["clock"]["kind"] == "host" and gpu["clock"]["kind"] == "modeled"
    assert gpu["intervals"] == host["intervals"]                 # the same accesses ...
    assert gpu["max_ns"] < host["max_ns"]                        # ... on a much faster clock


def test_simulate_states_the_clock(recorded, capsys):
    assert main(["simulate", str(recorded), "--gpu", "MI300X"]) == 0
    assert "modeled MI300X clock" in capsys.readouterr().out


def test_report_on_a_gpu_clock_shows_both_clocks(recorded, tmp_path):
    from memlens.reporting import build_report
    built = build_report(memlens.load(recorded), sections=["summary", "ati", "whatif"], gpu="H100",
                         whatif_time_limit_s=0.2)
    assert all(s.status == "ok" for s in built.sections), [s.to_dict() for s in built.sections]
    titles = {s.key: s.title for s in built.sections}
    assert titles["ati"].endswith("modeled H100 SXM clock") and titles["summary"] == "Summary"
    html = built.write(tmp_path / "r.html").read_text()
    assert "recorded clock vs modeled clock" in html and "swapping: recorded clock vs modeled clock" in html
    assert "host clock" in html and "on the modeled H100 SXM clock" in html
    code = main(["report", str(recorded), "-o", str(tmp_path / "c.html"), "--gpu", "H100", "--no-whatif",
                 "--sections", "ati", "--json"])
    assert code == 0


def test_cell_magic_records_onto_a_gpu_clock():
    IPython = pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "memlens")
    res = shell.run_cell("%%memlens -o rt --no-show --gpu A100\nimport torch\n(torch.ones(64, 64) @ torch.ones(64, 64)).sum()\n")
    assert res.error_in_exec is None and res.error_before_exec is None
    assert shell.user_ns["rt"].metadata["clock"]["gpu"] == "A100 SXM 80GB"
    assert shell.user_ns["rt_recorded"].metadata["clock"]["kind"] == "host"
    bad = shell.run_cell("%%memlens -o rt2 --no-show --gpu H900\nx = 1\n")
    from IPython.core.error import UsageError
    assert isinstance(bad.error_in_exec, UsageError) and "H900" in str(bad.error_in_exec)
    assert "rt2" not in shell.user_ns                      # refused before the cell ran
