"""`memlens demo`: records the built-in transformer, saves the trace and writes the report."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

import memlens  # noqa: E402
from memlens.cli import main  # noqa: E402

SAMPLE_TRACES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_demo_command_writes_trace_and_report(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "-o", str(out), "--steps", "2"]) == 0
    printed = capsys.readouterr().out
    trace = memlens.load(out / "demo.memlens")
    assert f"trace:  {out / 'demo.memlens'}" in printed
    assert trace.metadata["source_kind"] == "memlens_record"
    assert trace.metadata["iteration_source"] == "memlens.step"
    assert set(trace.ops["iteration"].dropna()) >= {0, 1}
    assert (trace.ops["module"].str.startswith("model.layers.0.attn")).any()
    assert {"parameter", "gradient", "optimizer_state", "activation"} <= set(trace.blocks["category"])
    try:
        from memlens.reporting import report  # noqa: F401
    except ImportError:
        assert "report: not written" in printed
    else:
        html = (out / "report.html").read_text()
        assert f"report: {out / 'report.html'}" in printed
        assert "<html" in html.lower() and len(html) > 10_000
        # the what-if acts on the demo's own model: its swap row moves blocks, above the floor that follows it
        from memlens.swap.planner import size_floor
        from memlens.units import format_bytes
        from memlens.whatif import compare
        table = compare(trace, time_limit_s=0.2)
        swap = table[table["stage"] == "swapping"].iloc[0]
        max_live = int(table[table["stage"] == "max-live"]["bytes"].iloc[0])
        plan = table.attrs["swap_plans"][swap["device"]]
        assert plan.min_size == min(1 << 20, max_live // 64) and len(plan.swaps) > 0
        assert int(swap["bytes"]) < max_live and (plan.swaps["size"] >= plan.min_size).all()
        assert f"{len(plan.swaps)} swaps" in swap["note"] and f">= {format_bytes(plan.min_size)}" in swap["note"]
        assert swap["note"] in html.replace("&gt;", ">")


def test_size_floor_follows_the_peak():
    from memlens.swap.planner import size_floor
    mib = 1 << 20
    assert size_floor(64 * mib) == mib and size_floor(10 * 64 * mib) == mib
    assert size_floor(64 * mib - 64) == mib - 1 and size_floor(64 * 100) == 100
    assert size_floor(0) == 1


def test_demo_rejects_bad_steps(tmp_path, capsys):
    assert main(["demo", "-o", str(tmp_path / "d"), "--steps", "0"]) == 2
    assert "--steps" in capsys.readouterr().err


def test_demo_unwritable_output_is_bad_input(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["demo", "-o", str(blocker / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot create the output directory" in err[0] and str(blocker) in err[0]


def test_sample_traces_load_and_hold_what_readme_says():
    expected = {"transformer_train_adamw": "memlens.step", "mlp_train_sgd_stacks": "optimizer.step",
                "cnn_inference": "memlens.step"}
    for name, iteration_source in expected.items():
        trace = memlens.load(SAMPLE_TRACES / f"{name}.memlens")
        assert trace.metadata["source_kind"] == "memlens_record"
        assert trace.metadata["iteration_source"] == iteration_source
        assert trace.has_accesses
    mlp = memlens.load(SAMPLE_TRACES / "mlp_train_sgd_stacks.memlens")
    assert mlp.stacks is not None and len(mlp.stacks) and mlp.ops["stack_id"].notna().all()
    cnn = memlens.load(SAMPLE_TRACES / "cnn_inference.memlens")
    assert not (cnn.blocks["category"] == "gradient").any()
    assert ((cnn.blocks["source"] == "profiler") & (cnn.blocks["category"] == "temporary")).any()
