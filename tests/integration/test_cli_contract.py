"""The CLI contract, for every verb: listed in `memlens --help`, has --help, and bad input exits 2
with a one-line error (no traceback); a missing verb fails the test."""
from __future__ import annotations

import subprocess
import sys

import pytest

from memlens.cli import main

VERBS = ("record", "import", "info", "ati", "outliers", "simulate", "plan", "swap", "report", "diff", "demo")

# per verb: arguments that are bad input (a missing file, or a value out of range)
BAD_INPUT = {
    "record": ["-o", "{tmp}/r.memlens", "--", "python", "/no/such/script.py"],
    "import": ["/no/such/snapshot.pickle", "-o", "{tmp}/i.memlens"],
    "info": ["/no/such/trace.memlens"],
    "ati": ["/no/such/trace.memlens"],
    "outliers": ["/no/such/trace.memlens"],
    "simulate": ["/no/such/trace.memlens"],
    "plan": ["/no/such/trace.memlens"],
    "swap": ["/no/such/trace.memlens"],
    "report": ["/no/such/trace.memlens", "-o", "{tmp}/r.html"],
    "diff": ["/no/such/a.memlens", "/no/such/b.memlens"],
    "demo": ["--steps", "0", "-o", "{tmp}/demo"],
}


@pytest.fixture(scope="module")
def top_help() -> str:
    """`memlens --help` as the installed module prints it."""
    res = subprocess.run([sys.executable, "-m", "memlens", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _registered() -> set[str]:
    import argparse

    from memlens.cli import build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_is_listed(top_help, verb):
    assert verb in _registered(), f"`memlens {verb}` does not exist"
    # listed in the help as "    VERB   description"
    assert any(line.split()[:1] == [verb] and line.startswith("    " + verb) for line in top_help.splitlines()), \
        f"`memlens {verb}` is missing from `memlens --help`"


def test_every_other_verb_has_help_too():
    for verb in _registered() - set(VERBS):
        # any extra verb must at least have --help
        with pytest.raises(SystemExit) as exc:
            main([verb, "--help"])
        assert exc.value.code == 0


@pytest.mark.parametrize("verb", VERBS)
def test_verb_help(verb, capsys):
    with pytest.raises(SystemExit) as exc:
        main([verb, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: memlens {verb}")
    assert len(out.splitlines()) >= 3


@pytest.mark.parametrize("verb", VERBS)
def test_bad_input_exits_2_with_one_line(verb, tmp_path, capsys):
    args = [a.format(tmp=tmp_path) for a in BAD_INPUT[verb]]
    code = main([verb, *args])
    captured = capsys.readouterr()
    assert code == 2, (verb, captured.err)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memlens: error:"), captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("verb", VERBS)
def test_unknown_option_exits_2(verb, capsys):
    with pytest.raises(SystemExit) as exc:
        main([verb, "--no-such-option-xyz"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("memlens: error:")


def test_no_verb_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_internal_error_exits_1_with_one_line(monkeypatch, tmp_path, capsys):
    import memlens.commands.info as info

    def crash(args):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(info, "run", crash)
    code = main(["info", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and err.strip().splitlines() == [
        "memlens: internal error: RuntimeError: simulated bug (rerun with --debug for details)"]


JSON_VERBS = ("import", "info", "ati", "outliers", "simulate", "plan", "swap", "report", "diff")


@pytest.mark.parametrize("verb", JSON_VERBS)
def test_verbs_that_print_results_offer_json(verb, capsys):
    with pytest.raises(SystemExit):
        main([verb, "--help"])
    assert "--json" in capsys.readouterr().out


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    from report_support import constructed_trace
    return constructed_trace().save(tmp_path_factory.mktemp("cli") / "small.memlens")


SUCCESS = {
    "info": ["{trace}"],
    "ati": ["{trace}"],
    "outliers": ["{trace}"],
    "simulate": ["{trace}"],
    "plan": ["{trace}", "--time-limit", "0.2"],
    "swap": ["{trace}"],
    "report": ["{trace}", "-o", "{tmp}/r.html", "--no-whatif"],
    "diff": ["{trace}", "{trace}"],
    "import": ["{csv}", "-o", "{tmp}/imported.memlens"],
}


@pytest.mark.parametrize("verb", sorted(SUCCESS))
def test_success_path_prints_one_json_document(verb, small_trace, tmp_path, capsys):
    import json

    csv = tmp_path / "buffers.csv"
    csv.write_text("id,lower,upper,size\n0,0,10,100\n1,5,20,200\n2,12,30,50\n")
    args = [a.format(trace=small_trace, tmp=tmp_path, csv=csv) for a in SUCCESS[verb]]
    code = main([verb, *args, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads(captured.out)  # exactly one JSON document on stdout
    assert isinstance(doc, (dict, list)) and len(doc) > 0
