"""The source view: each allocation site's line of code beside its bytes at the peak (`--source-root`), per
line and per file, read safely (size limit, bad bytes replaced, no way out of the root)."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from memlens import Trace
from memlens.analysis.peak import live_at, peak_breakdown
from memlens.analysis.peak_cause import sites
from memlens.analysis.source import MAX_FILE_BYTES, SourceReader, add_source_lines, by_file
from memlens.cli import main

MODEL = ["import torch", "", "def attn(x):", "    w = torch.softmax(x @ x.T, -1)  # weights", "    return w",
         "", "def mlp(x):", "\tbig = torch.empty(1 << 20)", "    return big"]
TRAIN = ["from model import attn, mlp", "def step(x):", "    y = attn(x)", "    return mlp(y)"]


@pytest.fixture
def tree(tmp_path):
    """A checkout at tmp/src/proj/{model.py,train.py}, a secret beside it, a file with bad bytes, a huge one."""
    root = tmp_path / "src"
    (root / "proj").mkdir(parents=True)
    (root / "proj" / "model.py").write_text("\n".join(MODEL) + "\n")
    (root / "proj" / "train.py").write_text("\n".join(TRAIN) + "\n")
    (root / "proj" / "latin.py").write_bytes(b"x = 1\ns = '\xe9t\xe9'  # latin-1\n")
    (root / "proj" / "huge.py").write_bytes(b"a = 1\n" * (MAX_FILE_BYTES // 6 + 10))
    (tmp_path / "secret.py").write_text("TOKEN = 'do not show'\n")
    (root / "proj" / "link.py").symlink_to(tmp_path / "secret.py")
    return root


def _trace():
    """Recorded on another machine under /home/ci/work/proj. At the peak (t=30) live: attn's block 3000 B
    (model.py:4), mlp's 5000 B + 1000 B (model.py:8, two blocks), a block from train.py:3 (step, 700 B), a
    block with no stack 200 B. A block of 999 B from model.py:4 is freed before the peak."""
    far = "/home/ci/work/proj/"
    frames = {0: [("attn", far + "model.py", 4), ("step", far + "train.py", 3)],
              1: [("mlp", far + "model.py", 8), ("step", far + "train.py", 4)],
              2: [("step", far + "train.py", 3)],
              3: [("softmax", "/usr/lib/python3/site-packages/torch/functional.py", 77), ("attn", far + "model.py", 4)]}
    stacks = pd.DataFrame([{"stack_id": s, "depth": d, "name": n, "filename": f, "line": ln}
                           for s, fr in frames.items() for d, (n, f, ln) in enumerate(fr)])
    rows = [(1, 999, 0, 5, 0), (2, 3000, 10, 100, 3), (3, 5000, 12, 100, 1), (4, 1000, 14, 100, 1),
            (5, 700, 20, 100, 2), (6, 200, 30, 100, None)]
    blocks = pd.DataFrame([{"block_id": i, "device": "cuda:0", "size": s, "alloc_ns": a, "free_ns": f,
                            "stack_id": st} for i, s, a, f, st in rows])
    return Trace.from_tables(blocks, metadata={"source_kind": "synthetic"}, stacks=stacks)


def _live(trace):
    pb = peak_breakdown(trace, largest=0)["cuda:0"]
    return live_at(trace, "cuda:0", pb.peak_seq, pb.peak_ns)


def test_sites_with_source_lines(tree):
    trace = _trace()
    df = add_source_lines(trace, sites(trace, blocks=_live(trace)), tree)
    assert [(r.site, r.bytes, r.source) for r in df.itertuples()] == [
        ("model.py:8 mlp", 6000, "big = torch.empty(1 << 20)"),  # the tab before it is stripped
        ("model.py:4 attn", 3000, "w = torch.softmax(x @ x.T, -1)  # weights"),  # torch's frame skipped
        ("train.py:3 step", 700, "y = attn(x)"),
        ("(no stack)", 200, None)]
    files = by_file(trace, _live(trace), tree)
    assert files[["file", "bytes", "blocks", "lines"]].values.tolist() == [
        ["/home/ci/work/proj/model.py", 9000, 3, 2], ["/home/ci/work/proj/train.py", 700, 1, 1]]
    assert files["found"].tolist() == [str((tree / "proj" / "model.py").resolve()),
                                       str((tree / "proj" / "train.py").resolve())]


def test_reads_safely(tree, tmp_path):
    r = SourceReader(tree)
    # bad bytes replaced, not an error
    assert r.line("/x/proj/latin.py", 2) == "s = '\ufffdt\ufffd'  # latin-1"
    # past the size limit: not read
    assert r.line("/x/proj/huge.py", 1) is None
    # ways out of the root: "..", a symlink to a file outside, a non-Python file
    assert r.line("/x/proj/../../secret.py", 1) is None
    assert r.line("/x/proj/link.py", 1) is None
    assert r.line(str(tmp_path / "secret.py"), 1) is None  # the longest tail inside the root does not exist
    (tree / "proj" / "notes.txt").write_text("hello\n")
    assert r.line("/x/proj/notes.txt", 1) is None
    # no such line, nonsense line numbers
    assert r.line("/x/proj/model.py", 99) is None and r.line("/x/proj/model.py", 0) is None
    assert r.line("/x/proj/model.py", "x") is None
    # without a root, the frame's own absolute path is read when it exists (and only a .py file)
    assert SourceReader().line(str(tree / "proj" / "train.py"), 3) == "y = attn(x)"
    assert SourceReader().line("proj/train.py", 3) is None
    with pytest.raises(Exception, match="not a directory"):
        SourceReader(tmp_path / "missing")


def test_info_and_report_show_the_lines(tree, tmp_path, capsys):
    path = tmp_path / "t.memlens"
    _trace().save(path)
    assert main(["info", str(path), "--source-root", str(tree)]) == 0
    out = capsys.readouterr().out.splitlines()
    i = next(k for k, line in enumerate(out) if "model.py:8 mlp" in line)
    assert out[i].split() == ["site:", "5.9", "KiB", "model.py:8", "mlp"]
    assert out[i + 1].strip() == "| big = torch.empty(1 << 20)"
    assert main(["info", str(path), "--json", "--source-root", str(tree)]) == 0
    top = json.loads(capsys.readouterr().out)["peak"]["cuda:0"]["top_sites"]
    assert [(s["site"], s["bytes"], s.get("source")) for s in top] == [
        ("model.py:8 mlp", 6000, "big = torch.empty(1 << 20)"),
        ("model.py:4 attn", 3000, "w = torch.softmax(x @ x.T, -1)  # weights"),
        ("train.py:3 step", 700, "y = attn(x)"), ("(no stack)", 200, None)]
    # without the root the frames point at /home/ci/..., absent here: no source, same sites
    assert main(["info", str(path), "--json"]) == 0
    assert all("source" not in s for s in json.loads(capsys.readouterr().out)["peak"]["cuda:0"]["top_sites"])
    assert main(["info", str(path), "--source-root", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    html = tmp_path / "r.html"
    assert main(["report", str(path), "-o", str(html), "--sections", "peak", "--source-root", str(tree)]) == 0
    page = html.read_text()
    assert "<code>big = torch.empty(1 &lt;&lt; 20)</code>" in page
    assert "bytes live at the peak by source file" in page and "/home/ci/work/proj/model.py" in page
