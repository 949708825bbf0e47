"""The stack diff of `memlens.diff`: call stacks that appear, vanish, grow or shrink between A's peak and B's,
checked against hand-computed bytes and, on two real snapshots, against a plain-Python grouping."""
from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

import memlens
from _diff_refs import CS336, blocks_live_at_peak
from memlens import Trace
from memlens.cli import main


def _stacks(frames_by_id: dict[int, list[tuple[str, str, int]]]) -> pd.DataFrame:
    rows = [{"stack_id": sid, "depth": d, "name": n, "filename": f, "line": ln}
            for sid, frames in frames_by_id.items() for d, (n, f, ln) in enumerate(frames)]
    return pd.DataFrame(rows)


ATTN = [("attn", "/a/proj/pkg/model.py", 10), ("forward", "/a/proj/pkg/model.py", 50)]
MLP = [("mlp", "/a/proj/pkg/model.py", 20), ("forward", "/a/proj/pkg/model.py", 50)]
LOSS = [("loss", "/a/proj/pkg/train.py", 7)]
FLASH = [("flash", "/a/proj/pkg/model.py", 12), ("forward", "/a/proj/pkg/model.py", 50)]


def _block(i, size, alloc, free, stack, op=""):
    return {"block_id": i, "device": "cuda:0", "size": size, "alloc_ns": alloc, "free_ns": free,
            "stack_id": stack, "op": op}


def two_runs():
    """A peaks at t=10 with attn 1000 + mlp 2000 + loss 500 = 3500 B (a later attn block of 700 B is not live
    then). B numbers its stacks differently and adds a C++ frame under attn: attn 1000 (same), mlp 3000 (grew
    by 1000), flash 4000 (appeared), an aten::mm block without a stack 300 (appeared), no loss (vanished)."""
    a = Trace.from_tables(pd.DataFrame([_block(1, 1000, 0, 100, 0), _block(2, 2000, 5, 100, 1),
                                        _block(3, 500, 10, 90, 2), _block(4, 700, 200, 210, 0)]),
                          metadata={"source_kind": "synthetic"}, stacks=_stacks({0: ATTN, 1: MLP, 2: LOSS}))
    b = Trace.from_tables(pd.DataFrame([_block(1, 1000, 0, 100, 7), _block(2, 3000, 5, 100, 5),
                                        _block(3, 4000, 8, 100, 9), _block(4, 300, 10, 100, None, "aten::mm")]),
                          metadata={"source_kind": "synthetic"},
                          stacks=_stacks({5: MLP, 7: [("c10::cuda::alloc", "", 0)] + ATTN, 9: FLASH}))
    return a, b


EXPECTED = [  # (change, site, bytes_a, bytes_b, delta), largest change first
    ("appeared", "model.py:12 flash", 0, 4000, 4000),
    ("grew", "model.py:20 mlp", 2000, 3000, 1000),
    ("vanished", "train.py:7 loss", 500, 0, -500),
    ("appeared", "aten::mm (no Python frame)", 0, 300, 300),
]


def test_stack_diff_by_hand():
    a, b = two_runs()
    d = memlens.diff(a, b)
    assert [(r.change, r.site, r.bytes_a, r.bytes_b, r.delta) for r in d.stacks.itertuples()] == EXPECTED
    # files by the last three parts of their paths
    assert list(d.stacks["stack"])[:3] == ["flash (proj/pkg/model.py:12) < forward (proj/pkg/model.py:50)",
                                           "mlp (proj/pkg/model.py:20) < forward (proj/pkg/model.py:50)",
                                           "loss (proj/pkg/train.py:7)"]
    assert [(r.blocks_a, r.blocks_b) for r in d.stacks.itertuples()] == [(0, 1), (1, 1), (1, 0), (0, 1)]
    summary = " ".join(d.summary())
    assert "2 appeared (4.2 KiB), 1 vanished (500 B), 1 grew (1000 B)" in summary


def test_the_same_code_from_two_checkouts_matches():
    """B ran from another checkout (/home/b/proj/... instead of /a/proj/...): the frames match by the last
    three parts of their paths, so only the real changes are listed."""
    a, b = two_runs()
    st = b.stacks.copy()
    st["filename"] = st["filename"].astype(str).str.replace("/a/", "/home/b/", regex=False)
    assert (st["filename"].str.startswith("/home/b/proj/") | (st["filename"] == "")).all()
    b = Trace.from_tables(b.blocks, metadata=dict(b.metadata), stacks=st)
    d = memlens.diff(a, b)
    assert [(r.change, r.site, r.bytes_a, r.bytes_b, r.delta) for r in d.stacks.itertuples()] == EXPECTED


def test_stack_diff_in_the_cli_json_and_page(tmp_path, capsys):
    a, b = two_runs()
    pa, pb = a.save(tmp_path / "a.memlens"), b.save(tmp_path / "b.memlens")
    assert main(["diff", str(pa), str(pb), "--json", "-o", str(tmp_path / "d.html")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["change"], r["site"], r["bytes_a"], r["bytes_b"]) for r in out["stacks"]] == [e[:4] for e in EXPECTED]
    assert {s["key"]: s["status"] for s in out["html_sections"]}["stacks"] == "ok"
    page = (tmp_path / "d.html").read_text()
    assert "flash (proj/pkg/model.py:12) &lt; forward (proj/pkg/model.py:50)" in page
    assert main(["diff", str(pa), str(pb)]) == 0
    text = capsys.readouterr().out.splitlines()
    i = next(k for k, line in enumerate(text) if line.startswith("Stacks at the peak"))
    assert text[i + 1].split() == ["appeared", "+3.9", "KiB", "(0", "B", "->", "3.9", "KiB)", "model.py:12", "flash"]
    assert text[i + 2].strip() == "flash (proj/pkg/model.py:12) < forward (proj/pkg/model.py:50)"


def _key_of(trace) -> dict[int, str]:
    """stack_id -> Python frames innermost first (files by their path's last three parts), in plain Python."""
    frames: dict[int, list] = {}
    for r in trace.stacks.itertuples():
        frames.setdefault(int(r.stack_id), []).append((int(r.depth), r.name, r.filename, int(r.line)))
    return {sid: " < ".join(f"{n} ({'/'.join(str(f).split('/')[-3:])}:{ln})" for _, n, f, ln in sorted(fs)
                            if str(f).endswith(".py"))
            for sid, fs in frames.items()}


def _peak_by_stack(trace, device) -> dict[str, int]:
    keys = _key_of(trace)
    out = Counter()
    for row in blocks_live_at_peak(trace, device)[1]:
        key = "" if pd.isna(row.stack_id) else keys.get(int(row.stack_id), "")
        out[key or "(site)"] += row.size
    return dict(out)


@pytest.mark.shared
def test_stack_diff_on_two_real_snapshots(shared):
    """The same model's forward-only and training snapshots: per stack, A's and B's bytes at the peaks match
    a plain-Python sweep; the training step's stacks appear."""
    a = memlens.load(shared(CS336.format("inference")))
    b = memlens.load(shared(CS336.format("training")))
    d = memlens.diff(a, b)
    st = d.stacks
    assert len(st) > 0
    want_a, want_b = _peak_by_stack(a, "cuda:0"), _peak_by_stack(b, "cuda:0")
    real = st[~st["stack"].str.startswith("(") & st["stack"].str.contains(".py:", regex=False)]
    assert len(real) > 0
    for r in real.itertuples():
        assert (r.bytes_a, r.bytes_b) == (want_a.get(r.stack, 0), want_b.get(r.stack, 0)), r.stack
    # every stack with a Python frame whose bytes differ is listed
    changed = {k for k in want_a.keys() | want_b.keys() if k != "(site)" and want_a.get(k, 0) != want_b.get(k, 0)}
    assert changed == set(real["stack"])
    assert set(st["change"]) >= {"appeared"}
    assert int(st["delta"].sum()) == int(d.peak["delta"].iloc[0])
