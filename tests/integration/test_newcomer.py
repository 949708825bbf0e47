"""A newcomer's trip: the README's spellings work after a bare `import memlens`, a swap plan that
finds nothing under the default floor says what a lower one would find, and the demo's closing hint is a
command that runs from the shell it was printed in."""
from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd

from memlens.cli import main
from memlens.trace import Trace


def test_subpackages_reachable_after_import_memlens():
    """The public subpackages load on first use after a bare `import memlens`; a module inside one is imported
    as in any package."""
    code = ("import memlens\n"
            "print(callable(memlens.widgets.explore), callable(memlens.swap.plan_swaps),"
            " callable(memlens.viz.timeline))\n"
            "import memlens.analysis.ati\n"
            "print(callable(memlens.analysis.ati.access_intervals))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True", "True"]


def _small_blocks_trace() -> Trace:
    """Three 4 KiB blocks read by ops [0, 10] and [10_000, 10_010] (idle 9,990 ns each) and a 64 KiB block
    alive over [3_000, 6_000]: the peak, 76 KiB, is there, and swapping the small ones lowers it to 64 KiB.
    Every block is under the 1 MiB default floor."""
    ops = pd.DataFrame({"op_id": [1, 2], "name": "op", "start_ns": [0, 10_000], "end_ns": [10, 10_010]})
    blocks = pd.DataFrame({"block_id": [1, 2, 3, 4], "device": "cuda:0", "size": [4096] * 3 + [65536],
                           "alloc_ns": [0] * 3 + [3_000], "free_ns": [20_000] * 3 + [6_000]})
    acc = pd.DataFrame({"block_id": [1, 2, 3, 1, 2, 3], "t_ns": [0, 0, 0, 10_000, 10_000, 10_000],
                        "op_id": [1, 1, 1, 2, 2, 2], "is_write": False})
    return Trace.from_tables(blocks, acc, ops)


def test_no_swap_under_the_floor_hints_at_min_size(tmp_path, capsys):
    from memlens.analysis.bandwidth import BandwidthModel
    from memlens.swap import plan_swaps
    trace = _small_blocks_trace()
    link = BandwidthModel(h2d_bytes_per_s=100e9, d2h_bytes_per_s=100e9, latency_ns=0)
    # 4 KiB at 100 GB/s: 41 ns each way, well inside 9,990 ns idle: three candidates, all under 1 MiB
    plan = plan_swaps(trace, bandwidth=link)
    assert len(plan.swaps) == 0 and plan.smaller_candidates == 3 and plan.summary()["smaller_candidates"] == 3
    low = plan_swaps(trace, bandwidth=link, min_size=0)
    assert len(low.swaps) == 3 and low.smaller_candidates == 0
    assert (low.peak_before, low.peak_after) == (3 * 4096 + 65536, 65536)
    path = tmp_path / "small.memlens"
    trace.save(path)
    assert main(["swap", str(path), "--bandwidth", "100GB/s", "--latency-us", "0"]) == 0
    out = capsys.readouterr().out
    assert "3 idle intervals of smaller blocks could: try --min-size 0" in out
    assert main(["swap", str(path), "--bandwidth", "100GB/s", "--latency-us", "0", "--min-size", "0"]) == 0
    out = capsys.readouterr().out
    assert "hint:" not in out and "with 3 swaps" in out


def test_demo_hint_names_a_runnable_cli(tmp_path, monkeypatch):
    from memlens.commands.demo import cli_command
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a shell whose venv is not activated
    cmd = cli_command()
    assert cmd != "memlens"
    exe = cmd.split()[0]
    assert os.path.exists(exe) or exe == sys.executable
    out = subprocess.run(cmd.split() + ["--help"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "usage" in out.stdout.lower()
