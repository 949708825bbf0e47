"""Issue 18, item 18: tests that kill the mutants a mutation spot-check found surviving (each expectation
derived independently of the code under test). `scripts/mutation.sh --spot` applies those mutants one at
a time and checks that this file (and the suites named there) fail for each."""
from __future__ import annotations

import itertools
import json
import pickle
import re

import numpy as np
import pandas as pd
import pytest

from hostile import assert_refused, run_memlens
from memlens.errors import InputError
from memlens.io.safe_pickle import load_pickle


# ---------------------------------------------------------------- restricted unpickler

class _Eval:
    def __init__(self, code: str):
        self.code = code

    def __reduce__(self):
        import builtins
        return (builtins.eval, (self.code,))


@pytest.mark.parametrize("name", ["eval", "exec", "getattr", "__import__", "open", "compile", "breakpoint"])
def test_no_builtin_callable_is_admitted(tmp_path, name):
    marker = tmp_path / "ran"
    path = tmp_path / f"{name}.pickle"
    # a snapshot-shaped pickle whose segments call builtins.<name>
    payload = f"open({str(marker)!r}, 'w').write('x')"
    data = pickle.dumps({"segments": [_Eval(payload)], "device_traces": []}, protocol=4)
    path.write_bytes(data.replace(b"\x8c\x04eval", bytes([0x8c, len(name)]) + name.encode()))
    with pytest.raises(InputError, match=f"builtins.{re.escape(name)}"):
        load_pickle(path)
    outcome = run_memlens("info", path)
    assert_refused(outcome, f"builtins.{name}")
    assert not marker.exists()


def test_only_harmless_containers_are_admitted(tmp_path):
    path = tmp_path / "set.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "tags": {1, 2}}, protocol=2))
    assert load_pickle(path)["tags"] == {1, 2}


# ---------------------------------------------------------------- plan validator, against brute force

def _brute_force_overlaps(start, end, size, offsets) -> set[tuple[int, int]]:
    """Every pair alive at a common instant (half-open [start, end)) whose address ranges intersect."""
    pairs = set()
    for i, j in itertools.combinations(range(len(start)), 2):
        if size[i] == 0 or size[j] == 0:
            continue
        in_time = start[i] < end[j] and start[j] < end[i]
        in_space = offsets[i] < offsets[j] + size[j] and offsets[j] < offsets[i] + size[i]
        if in_time and in_space:
            pairs.add((i, j))
    return pairs


@pytest.mark.parametrize("seed", range(40))
def test_validator_agrees_with_brute_force(seed):
    from memlens.plan import as_problem, plan_violations
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    start = rng.integers(0, 12, n)
    end = start + rng.integers(1, 8, n)
    size = rng.integers(1, 5, n) * 4
    offsets = rng.integers(0, 5, n) * 4  # few distinct offsets: overlaps are common, but not certain
    problem = as_problem(pd.DataFrame({"id": range(n), "lower": start, "upper": end, "size": size}))
    expected = _brute_force_overlaps(start, end, size, offsets)
    found = plan_violations(problem, offsets, limit=100)
    assert bool(found) == bool(expected), (expected, found)
    for text in found:  # every reported pair is a real overlap
        a, b = (int(x) for x in re.findall(r"(?:buffers|and) (\d+) \[", text)[:2])
        assert (min(a, b), max(a, b)) in expected, text


def test_validator_catches_an_overlap_only_the_next_live_buffer_shows():
    from memlens.plan import as_problem, plan_violations
    # B lives at [8, 16) first; A arrives later at [4, 12): it overlaps its successor B (offset above),
    # not its predecessor (none)
    problem = as_problem(pd.DataFrame({"id": ["B", "A"], "lower": [0, 1], "upper": [10, 5], "size": [8, 8]}))
    assert plan_violations(problem, np.array([8, 4]))
    assert not plan_violations(problem, np.array([8, 0]))


def test_validator_checks_alignment():
    from memlens.plan import as_problem, plan_violations
    problem = as_problem(pd.DataFrame({"id": ["a", "b"], "lower": [0, 10], "upper": [5, 15], "size": [64, 64]}),
                         alignment=64)
    assert not plan_violations(problem, np.array([0, 64]))
    bad = plan_violations(problem, np.array([0, 32]))
    assert bad and "multiple of" in bad[0]


# ---------------------------------------------------------------- report

def test_script_json_cannot_end_the_element():
    from memlens.report.markup import script_json
    hostile = {"message": "</script><script>alert(1)</script><!--", "sep": "\u2028"}
    text = script_json(json.dumps(hostile))
    assert "</" not in text and "<!--" not in text and "\u2028" not in text
    assert json.loads(text) == hostile


def test_report_status_json_with_a_closing_script_tag(tmp_path):
    from memlens.report.page import document
    statuses = [{"key": "live", "status": "error", "message": "boom </script><script>alert(1)</script>"}]
    page = document("t", "s", [("live", "Live", "")], statuses)
    status = re.search(r'<script type="application/json" id="memlens-report-status">(.*?)</script>', page, re.S)
    assert status is not None
    assert json.loads(status.group(1))["sections"][0]["message"] == statuses[0]["message"]
    assert page.count("<script>alert(1)") == 0


def test_report_ati_percentiles_are_the_real_ones(tmp_path):
    """The ATI text must give p50 as the median and p90 as the 90th percentile of the intervals, computed
    here with numpy from the trace's accesses."""
    from memlens.report import build_report
    from memlens.trace import Trace
    from memlens.units import format_ns
    # one block accessed at t = 0, 10, 30, 60, 100, ..., gaps 10, 20, 30, ..., 100 ns
    times = np.cumsum([0] + [10 * k for k in range(1, 11)])
    blocks = pd.DataFrame({"block_id": [0], "device": "cuda:0", "size": [4096], "alloc_ns": [0],
                           "free_ns": [int(times[-1])]})
    accesses = pd.DataFrame({"block_id": 0, "t_ns": times, "op_id": np.arange(len(times)), "is_write": False})
    ops = pd.DataFrame({"op_id": np.arange(len(times)), "name": "aten::add", "start_ns": times, "end_ns": times})
    trace = Trace.from_tables(blocks, accesses=accesses, ops=ops)
    gaps = np.diff(times)
    html = build_report(trace, sections=["ati"], whatif=False).html()
    assert f"median {format_ns(np.percentile(gaps, 50))}" in html
    assert f"90th percentile {format_ns(np.percentile(gaps, 90))}" in html
