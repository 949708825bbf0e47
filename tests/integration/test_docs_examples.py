"""Every ```python and ```bash example in the README and on the documentation pages (docs/*.md) runs, or says why
it does not.

An example marked by an HTML comment on the line just above its fence, ``<!-- not run: REASON -->``, is skipped
(the reason must say something). Every other example runs in a fresh process, in a temporary folder that holds
what the pages assume a reader has at hand: `sample_traces/` and `notebooks/` of this checkout, and `run.memlens`,
the reader's own recording (three steps of a small MLP with AdamW, recorded once per test session). Bash examples
find `memlens` on PATH and as `.venv/bin/memlens`, both this checkout's CLI.
Blocks of other languages (toml, the CLI synopsis) are not programs and are not run.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUN_LANGUAGES = ("python", "bash")
EXAMPLE_TIMEOUT_S = 240  # one example on a loaded 2-core machine: torch's import alone can take 10 s
# the reader's `run.memlens`: what the Record page's complete run records, saved as it is built
RECORD_RUN = """
import torch, memlens
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.AdamW(model.parameters())
with memlens.record(model, save_to="run.memlens"):
    for _ in range(3):
        torch.nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,))).backward()
        opt.step(); opt.zero_grad(set_to_none=True); memlens.step()
"""
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Example:
    page: str       # path from the repository root
    line: int       # 1-based line of the opening fence
    language: str
    code: str
    not_run: str | None  # the reason, when marked


def examples(text: str, page: str) -> list[Example]:
    """The fenced blocks of a Markdown page, in order, with the `not run` reason of the line just above each."""
    found = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence.group(1)), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a code fence is never closed")
        above = NOT_RUN.search(lines[i - 1]) if i > 0 else None
        found.append(Example(page, i + 1, fence.group(2), "\n".join(lines[i + 1:end]) + "\n",
                             above.group(1) if above else None))
        i = end + 1
    return found


def all_examples() -> list[Example]:
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    return [e for page in pages for e in examples(page.read_text(), str(page.relative_to(ROOT)))]


def test_examples_parser_on_a_hand_written_page():
    page = ("text\n<!-- not run: needs a GPU -->\n```python\nimport torch\n```\n\n```bash\necho hi\n```\n"
            "````toml\n[[rule]]\n```\n````\n")
    got = examples(page, "p.md")
    assert [(e.line, e.language, e.code, e.not_run) for e in got] == [
        (3, "python", "import torch\n", "needs a GPU"),
        (7, "bash", "echo hi\n", None),
        (10, "toml", "[[rule]]\n```\n", None),
    ]
    with pytest.raises(ValueError, match="p.md:1: a code fence is never closed"):
        examples("```python\nx = 1\n", "p.md")


def test_every_example_runs_or_says_why_not():
    everything = all_examples()
    marked = [e for e in everything if e.not_run is not None]
    assert all(len(e.not_run) >= 10 for e in marked), [f"{e.page}:{e.line}" for e in marked if len(e.not_run) < 10]
    run = [e for e in everything if e.language in RUN_LANGUAGES and e.not_run is None]
    # the pages teach by examples that run: at least one on each of these pages
    for page in ("README.md", "docs/record.md", "docs/time.md", "docs/predict.md", "docs/import.md",
                 "docs/analyse.md", "docs/simulate.md", "docs/report.md", "docs/cli.md", "docs/trace-format.md"):
        assert any(e.page == page for e in run), f"{page} has no example that runs"


@pytest.fixture(scope="module")
def reader_folder(tmp_path_factory) -> Path:
    """The folder the examples run in (see the module docstring)."""
    folder = tmp_path_factory.mktemp("docs-examples")
    (folder / "sample_traces").symlink_to(ROOT / "sample_traces")
    (folder / "notebooks").symlink_to(ROOT / "notebooks")
    out = subprocess.run([sys.executable, "-c", RECORD_RUN], cwd=folder, env=_env(folder), capture_output=True,
                         text=True, timeout=EXAMPLE_TIMEOUT_S)
    assert out.returncode == 0 and (folder / "run.memlens" / "manifest.json").exists(), out.stderr[-3000:]
    bin_dir = folder / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    cli = bin_dir / "memlens"
    cli.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m memlens.cli "$@"\n')
    cli.chmod(0o755)
    return folder


def _env(folder: Path) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                PATH=os.pathsep.join([str(folder / ".venv" / "bin"), os.environ.get("PATH", "")]), MPLBACKEND="Agg")


def _run_in(folder: Path, example: Example) -> subprocess.CompletedProcess:
    work = folder / f"{Path(example.page).stem}-{example.line}"
    work.mkdir()
    for name in ("sample_traces", "notebooks", ".venv"):
        (work / name).symlink_to(folder / name)
    shutil.copytree(folder / "run.memlens", work / "run.memlens")
    command = ([sys.executable, "-c", example.code] if example.language == "python"
               else ["bash", "-euo", "pipefail", "-c", example.code])
    return subprocess.run(command, cwd=work, env=_env(folder), capture_output=True, text=True,
                          timeout=EXAMPLE_TIMEOUT_S)


RUNNABLE = [e for e in all_examples() if e.language in RUN_LANGUAGES and e.not_run is None]


@pytest.mark.parametrize("example", RUNNABLE, ids=[f"{e.page}:{e.line}" for e in RUNNABLE])
def test_docs_example_runs(example: Example, reader_folder: Path):
    out = _run_in(reader_folder, example)
    assert out.returncode == 0, (f"{example.page}:{example.line} failed:\n{out.stdout[-3000:]}\n"
                                 f"{out.stderr[-3000:]}")
