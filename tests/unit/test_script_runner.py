"""The one script runner (`memlens.script_runner`): a user's script sees the argv and sys.path that
`python script.py ARGS` / `python -m module ARGS` give it, and both come back whatever the script does."""
import os
import sys

import pytest

from memlens.script_runner import as_main, run_script

SCRIPT = """
import sys
seen = {"argv": list(sys.argv), "path0": sys.path[0], "name": __name__}
if __name__ == "__main__":
    seen["main_block"] = True
    if sys.argv[1:] == ["--exit"]:
        sys.exit(3)
    if sys.argv[1:] == ["--raise"]:
        raise ValueError("from the script")
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "sub" / "train.py"
    path.parent.mkdir()
    path.write_text(SCRIPT)
    return path


def test_runs_as_python_would_and_restores(script):
    before_argv, before_path = list(sys.argv), list(sys.path)
    ns = run_script(str(script), ["--lr", 3])
    assert ns["seen"] == {"argv": [str(script), "--lr", "3"], "path0": str(script.parent), "name": "__main__",
                          "main_block": True}
    assert sys.argv == before_argv and sys.path == before_path


@pytest.mark.parametrize("arg, error", [("--exit", SystemExit), ("--raise", ValueError)])
def test_an_exit_or_an_error_propagates_and_still_restores(script, arg, error):
    before_argv, before_path = list(sys.argv), list(sys.path)
    with pytest.raises(error):
        run_script(str(script), [arg])
    assert sys.argv == before_argv and sys.path == before_path


def test_another_run_name_loads_without_the_main_block(script):
    ns = run_script(str(script), [], run_name="memlens_load")
    assert ns["seen"]["name"] == "memlens_load" and "main_block" not in ns["seen"]


def test_a_module_runs_with_the_working_directory_first(script, monkeypatch):
    monkeypatch.chdir(script.parent)
    monkeypatch.syspath_prepend(str(script.parent))   # where `python -m train` finds it from this directory
    ns = run_script("train", ["a"], module=True)
    assert ns["seen"]["argv"][1:] == ["a"] and ns["seen"]["path0"] == os.getcwd()


def test_as_main_restores_after_the_body_changes_them(tmp_path):
    before_argv, before_path = list(sys.argv), list(sys.path)
    with as_main(str(tmp_path / "x.py"), ["1"]):
        assert sys.argv == [str(tmp_path / "x.py"), "1"] and sys.path[0] == str(tmp_path)
        sys.argv.append("changed")
        sys.path.insert(0, "elsewhere")
    assert sys.argv == before_argv and sys.path == before_path
