"""memlens.diff / `memlens diff`: values checked against independent computations."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import memlens
from memlens import Trace
from memlens.analysis.diff import TraceDiff
from _diff_refs import CS336, blocks_live_at_peak
from report_support import brute_force_live, constructed_trace

ROOT = Path(__file__).resolve().parents[2]


def _live_at_peak_by(trace, device, key):
    """{label: bytes} of the blocks live right after the event that first reaches the peak."""
    best, rows = blocks_live_at_peak(trace, device)
    out = Counter()
    for row in rows:
        label = str(getattr(row, key)) or "(unknown)"
        out[label] += row.size
    return best, dict(out)


def _signature_counts(trace, device, fields):
    c = Counter()
    for row in trace.blocks[trace.blocks["device"] == device].itertuples():
        c[tuple(str(getattr(row, f)) if f != "size" else int(row.size) for f in fields)] += 1
    return c


def _two_runs():
    """A, and B = A with a bigger activation in every iteration and one extra 7000-byte buffer."""
    a = constructed_trace(n_iter=4)
    blocks = a.blocks.copy()
    act = blocks["category"] == "activation"
    blocks.loc[act, "size"] = 2000
    extra = blocks.iloc[[0]].copy()
    extra["block_id"], extra["size"], extra["category"], extra["op"] = 999, 7000, "buffer", "aten::empty"
    extra["alloc_ns"], extra["free_ns"] = pd.array([300], dtype="Int64"), pd.array([315], dtype="Int64")
    extra["allocated_before"] = False
    blocks = pd.concat([blocks, extra], ignore_index=True)
    drop = ["alloc_seq", "free_seq"]
    b = Trace.from_tables(blocks.drop(columns=drop), a.accesses, a.ops, dict(a.metadata), stacks=a.stacks)
    return a, b


def test_diff_of_constructed_runs_matches_hand_computation():
    a, b = _two_runs()
    d = memlens.diff(a, b, name_a="before", name_b="after")
    assert isinstance(d, TraceDiff)
    peak = d.peak.set_index("device_a")
    # A: 4000 + 1000 + 300; B: the 7000 buffer at t=300 over the 4000 parameter and the 2000 activation
    assert peak.loc["cuda:0", "peak_a"] == 5300 and peak.loc["cuda:0", "peak_b"] == 13000
    assert peak.loc["cuda:0", "delta"] == 7700 and peak.loc["cpu", "delta"] == 0
    cat = d.at_peak["category"].set_index(["device", "category"])["delta"]
    assert cat[("cuda:0", "buffer")] == 7000 and cat[("cuda:0", "activation")] == 1000
    assert cat[("cuda:0", "temporary")] == -300
    # every activation changed size (4 disappear, 4 appear) plus the new buffer
    assert d.blocks["signature"] == ["op", "module", "size"]
    assert (d.blocks["appeared"], d.blocks["disappeared"]) == (5, 4)
    assert d.blocks["appeared_bytes"] == 4 * 2000 + 7000 and d.blocks["disappeared_bytes"] == 4 * 1000
    assert d.appeared.iloc[0]["block_id"] == 999
    assert d.blocks["matched"] == len(a.blocks) - 4
    # the untouched buffer adds a lifetime edge (alloc -> free), not an ATI
    assert d.ati is not None and d.ati["delta"]["count"] == 0
    assert d.iterations["count_a"] == d.iterations["count_b"] == 4
    assert (d.op_counts["delta"] == 0).all() and d.op_counts["count_a"].sum() == len(a.ops)
    json.dumps(d.to_dict())  # JSON-ready
    text = " ".join(d.summary())
    assert "from 5.2 KiB to 12.7 KiB" in text and "5 only in B" in text


def test_ati_change_against_python_intervals():
    a = constructed_trace(n_iter=3)
    acc = a.accesses.copy()
    acc.loc[acc["t_ns"] % 100 == 50, "t_ns"] -= 25  # B reads the activation 25 ns earlier
    b = Trace.from_tables(a.blocks, acc, a.ops, dict(a.metadata))

    def intervals(t):
        """The ATIs: from the end of the op of one access to the start of the op of the next (an op's
        edges widened to its access's stamp where the stamp lies outside them)."""
        ops = t.ops.set_index("op_id")
        out = []
        for row in t.blocks.itertuples():
            mine = t.accesses[t.accesses["block_id"] == row.block_id]
            events = sorted({(min(int(ops["start_ns"].get(o, s)), s), max(int(ops["end_ns"].get(o, s)), s), o)
                             for s, o in zip(mine["t_ns"].tolist(), mine["op_id"].tolist())})
            out += [max(nxt[0] - prev[1], 0) for prev, nxt in zip(events, events[1:])]
        return np.array(out, dtype=float)

    d = memlens.diff(a, b)
    ia, ib = intervals(a), intervals(b)
    assert d.ati["a"]["count"] == len(ia) and d.ati["b"]["count"] == len(ib)
    assert d.ati["a"]["p50_ns"] == pytest.approx(np.median(ia))
    assert d.ati["delta"]["mean_ns"] == pytest.approx(ib.mean() - ia.mean())
    by_cat = d.ati["by_category"].set_index("category")
    assert by_cat["count_a"].sum() == len(ia) and by_cat["count_b"].sum() == len(ib)


@pytest.mark.shared
def test_cs336_training_vs_inference(shared):
    a = memlens.load(shared(CS336.format("training")))
    b = memlens.load(shared(CS336.format("inference")))
    d = memlens.diff(a, b)
    assert d.device_pairs == [("cuda:0", "cuda:0")]
    peak_a, by_op_a = _live_at_peak_by(a, "cuda:0", "op")
    peak_b, by_op_b = _live_at_peak_by(b, "cuda:0", "op")
    assert peak_a == brute_force_live(a, "cuda:0")[0]
    row = d.peak.iloc[0]
    assert (row["peak_a"], row["peak_b"], row["delta"]) == (peak_a, peak_b, peak_b - peak_a)
    assert peak_b < peak_a  # a forward pass holds far less than a training step
    ops = d.at_peak["op"].set_index("op")
    for label in set(by_op_a) | set(by_op_b):
        assert ops.loc[label, "bytes_a"] == by_op_a.get(label, 0), label
        assert ops.loc[label, "bytes_b"] == by_op_b.get(label, 0), label
    # snapshots name ops the same way but have no modules: match on (op, size, order)
    assert d.blocks["signature"] == ["op", "size"]
    ca = _signature_counts(a, "cuda:0", ["op", "size"])
    cb = _signature_counts(b, "cuda:0", ["op", "size"])
    assert d.blocks["matched"] == sum(min(ca[k], cb[k]) for k in ca.keys() | cb.keys())
    assert d.blocks["appeared"] == sum(max(cb[k] - ca[k], 0) for k in cb)
    assert d.blocks["disappeared"] == sum(max(ca[k] - cb[k], 0) for k in ca)
    assert d.blocks["disappeared_bytes"] == sum(k[1] * max(ca[k] - cb[k], 0) for k in ca)
    not_compared = " ".join(d.cannot_compare)
    assert "access time intervals" in not_compared and "modules" in not_compared
    assert d.op_counts is None and "ops executed: B records no ops" in not_compared
    assert d.ati is None
    from memlens.viz.diff import diff_figure
    fig = diff_figure(d)
    assert len([t for t in fig.data if t.mode == "lines"]) == 2
    assert fig.layout.yaxis.title.text == "live memory (GiB)"
    assert max(max(t.y) for t in fig.data) * 2**30 == pytest.approx(peak_a)
    # the two peak labels sit on opposite sides of their markers, so they never print over each other
    marks = [t for t in fig.data if t.mode == "markers+text"]
    assert [t.text[0].split(" ")[:2] for t in marks] == [["A", "peak"], ["B", "peak"]]
    assert [t.textposition for t in marks] == ["top left", "top right"]


@pytest.mark.shared
def test_recorded_trace_vs_imported_snapshot_says_what_it_cannot_compare(shared):
    a = memlens.load(ROOT / "sample_traces" / "transformer_train_adamw.memlens")
    b = memlens.load(shared(CS336.format("inference")))
    d = memlens.diff(a, b)
    assert d.device_pairs == [("cpu", "cuda:0")]
    assert any("cpu" in n and "cuda:0" in n for n in d.notes)
    assert d.blocks["signature"] == ["size"]
    ca, cb = _signature_counts(a, "cpu", ["size"]), _signature_counts(b, "cuda:0", ["size"])
    assert d.blocks["matched"] == sum(min(ca[k], cb[k]) for k in ca.keys() | cb.keys())
    text = " ".join(d.cannot_compare)
    for what in ("allocating ops", "modules", "B records no accesses", "by op"):
        assert what in text, what
    # the snapshot's blocks get categories from their stacks, so live memory at the peak compares by category
    assert "by category" not in text
    cats = set(d.at_peak["category"]["category"])
    assert {"parameter", "temporary"} <= cats


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "memlens", "diff", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_diff_json_and_html(tmp_path, capsys):
    a, b = _two_runs()
    pa, pb = a.save(tmp_path / "a.memlens"), b.save(tmp_path / "b.memlens")
    res = _cli(str(pa), str(pb), "--json", "-o", str(tmp_path / "d.html"))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {r["device_a"]: r["delta"] for r in out["peak"]} == {"cpu": 0, "cuda:0": 7700}
    assert out["blocks"]["appeared"] == 5
    assert (tmp_path / "d.html").stat().st_size > 3_000_000
    assert all(s["status"] == "ok" for s in out["html_sections"])
    from memlens.cli import main
    assert main(["diff", str(pa), str(pb)]) == 0
    assert "goes from 5.2 KiB to 12.7 KiB" in capsys.readouterr().out


@pytest.mark.parametrize("args", [("{a}", "/no/such.memlens"), ("{a}", "{a}", "--top", "0"), ("{a}",)])
def test_cli_diff_bad_input_exits_2_with_one_line(tmp_path, args):
    pa = constructed_trace().save(tmp_path / "a.memlens")
    res = _cli(*[x.format(a=pa) for x in args])
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("memlens: error:")
    if len(args) > 1:
        assert len(res.stderr.strip().splitlines()) == 1
