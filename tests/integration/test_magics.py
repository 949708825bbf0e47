"""The IPython extension: %%memlens records a cell, %memlens VERB wraps the Python API and the CLI."""
from __future__ import annotations

import pytest

IPython = pytest.importorskip("IPython")
torch = pytest.importorskip("torch")

import memlens  # noqa: E402
from memlens.trace import Trace  # noqa: E402

SAMPLE = "sample_traces/transformer_train_adamw.memlens"


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "memlens")
    return ip


@pytest.fixture
def shown(monkeypatch):
    """What the magics display (instead of rendering widgets)."""
    import memlens.magics
    out = []
    monkeypatch.setattr(memlens.magics, "display", out.append)
    return out


def _run(shell, source):
    result = shell.run_cell(source)
    return result


def test_cell_magic_records_the_cell_into_the_named_variable(shell, shown):
    res = _run(shell, "%%memlens -o rec1 --no-show\n"
                      "import torch\n"
                      "x = torch.ones(1024, 16)\n"
                      "y = (x @ torch.ones(16, 8)).sum()\n")
    assert res.error_in_exec is None and res.error_before_exec is None
    trace = shell.user_ns["rec1"]
    assert isinstance(trace, Trace)
    sizes = trace.blocks["size"].tolist()
    # torch.ones(1024, 16) float32 = 65536 bytes and the product 1024x8 float32 = 32768 bytes
    assert 1024 * 16 * 4 in sizes and 1024 * 8 * 4 in sizes
    assert (trace.ops["name"] == "aten::mm").any()
    assert shown == []   # --no-show


def test_cell_magic_shows_the_explorer_and_the_last_value(shell, shown):
    from memlens.widgets.explorer import Explorer
    res = _run(shell, "%%memlens\nimport torch\nz = torch.zeros(256)\n6 * 7\n")
    assert res.error_in_exec is None
    assert isinstance(shell.user_ns["memlens_trace"], Trace)
    assert shown[0] == 42
    assert isinstance(shown[1], Explorer) and shown[1].trace is shell.user_ns["memlens_trace"]
    shown.clear()
    _run(shell, "%%memlens --no-show\n6 * 7;\n")
    assert shown == []   # a trailing semicolon hides the value, as in IPython


def test_errors_propagate_and_the_partial_trace_is_kept(shell, shown):
    res = _run(shell, "%%memlens -o partial --no-show\n"
                      "import torch\n"
                      "kept = torch.empty(3000, dtype=torch.float64)\n"
                      "raise ValueError('boom in the cell')\n")
    assert isinstance(res.error_in_exec, ValueError) and "boom" in str(res.error_in_exec)
    partial = shell.user_ns["partial"]
    assert isinstance(partial, Trace)
    assert 3000 * 8 in partial.blocks["size"].tolist()
    assert "ValueError" in str(partial.metadata.get("exception"))


def test_model_option_and_save(shell, shown, tmp_path):
    shell.user_ns["net"] = torch.nn.Linear(32, 8)
    out = tmp_path / "cell.memlens"
    res = _run(shell, f"%%memlens -o rec2 -m net --save {out} --no-show\n"
                      "import torch\nnet(torch.randn(4, 32)).sum().backward()\n")
    assert res.error_in_exec is None
    trace = shell.user_ns["rec2"]
    params = trace.blocks[trace.blocks["category"] == "parameter"]
    assert sorted(params["size"].tolist()) == [8 * 4, 32 * 8 * 4]
    again = memlens.load(out)
    assert len(again.blocks) == len(trace.blocks)


def test_stacks_option_records_python_frames(shell, shown):
    res = _run(shell, "%%memlens -o rec3 --stacks --no-show\n"
                      "import torch\n"
                      "def make_buffer_here():\n"
                      "    return torch.full((777,), 2.0)\n"
                      "buf = make_buffer_here()\n")
    assert res.error_in_exec is None
    trace = shell.user_ns["rec3"]
    block = trace.blocks[trace.blocks["size"] == 777 * 4]
    assert len(block) == 1 and not block["stack_id"].isna().any()
    frames = trace.stacks[trace.stacks["stack_id"] == int(block["stack_id"].iloc[0])]
    assert "make_buffer_here" in set(frames["name"])


def test_bad_cell_options_are_usage_errors(shell, shown):
    res = _run(shell, "%%memlens -o 'not a name'\nx = 1\n")
    assert res.error_in_exec is not None and "variable name" in str(res.error_in_exec)
    res = _run(shell, "%%memlens -m no_such_model\nx = 1\n")
    assert "no_such_model" in str(res.error_in_exec)


def test_load_info_save_and_cli_verbs(shell, shown, tmp_path, capsys):
    res = _run(shell, f"%memlens load {SAMPLE} -o loaded")
    assert res.error_in_exec is None
    loaded = shell.user_ns["loaded"]
    expected = memlens.load(SAMPLE)
    assert len(loaded.blocks) == len(expected.blocks)
    assert loaded.peak_live_bytes() == expected.peak_live_bytes()
    # a CLI verb on a notebook variable: the trace is handed over through a temporary copy
    capsys.readouterr()
    res = _run(shell, "%memlens info loaded --json")
    assert res.error_in_exec is None
    import json
    printed = json.loads(capsys.readouterr().out)
    assert printed["blocks"] == len(expected.blocks)
    assert printed["peak_live_bytes"] == {k: int(v) for k, v in expected.peak_live_bytes().items()}
    # what it prints names the variable, never the deleted temporary copy
    res = _run(shell, "%memlens info loaded")
    assert res.error_in_exec is None
    text = capsys.readouterr().out
    assert "memlens-magic-" not in text and "loaded (a Trace variable)" in text
    res = _run(shell, "%memlens simulate loaded --json")
    assert res.error_in_exec is None
    simulated = json.loads(capsys.readouterr().out)
    # the caching allocator reserves whole segments: at least the live bytes, in multiples of 2 MiB
    assert simulated["cpu"]["peak_reserved"] >= expected.peak_live_bytes()["cpu"]
    assert simulated["cpu"]["peak_reserved"] % (2 << 20) == 0
    target = tmp_path / "copy.memlens"
    res = _run(shell, f"%memlens save loaded {target}")
    assert res.error_in_exec is None and memlens.load(target).summary()["blocks"] == len(expected.blocks)


def test_line_magic_errors_are_one_line_usage_errors(shell, shown, tmp_path):
    from IPython.core.error import UsageError
    res = _run(shell, f"%memlens load {tmp_path / 'missing.memlens'}")
    assert isinstance(res.error_in_exec, UsageError)
    res = _run(shell, "%memlens info no_such_variable_or_file")
    assert isinstance(res.error_in_exec, UsageError) and "exit 2" in str(res.error_in_exec)
    res = _run(shell, "%memlens no-such-verb")
    assert isinstance(res.error_in_exec, UsageError)


def test_explore_line_magic_and_trace_display(shell, shown):
    from memlens.widgets.explorer import Explorer
    shell.user_ns["small"] = memlens.load(SAMPLE)
    res = _run(shell, "%memlens explore small")
    assert isinstance(res.result, Explorer)
    # after %load_ext, a Trace displays as the explorer
    printer = shell.display_formatter.ipython_display_formatter.lookup(shell.user_ns["small"])
    assert printer.__name__ == "_display_trace"
