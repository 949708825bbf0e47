"""Issue 26: the fuzz target of the native snapshot-pickle parser (tests/fuzz_walker.py), run briefly: a
few seconds of mutated seeds (a valid snapshot and the hostile files of tests/hostile_pickles.py), in a child
process so that a hang fails the test instead of stalling the suite. ``MEMLENS_FUZZ_SECONDS`` runs it
longer."""
from __future__ import annotations

import os
from pathlib import Path

from hostile import run_python

SECONDS = float(os.environ.get("MEMLENS_FUZZ_SECONDS", "5"))


def test_fuzz_the_compiled_walker_against_the_python_one(tmp_path):
    from memlens.io import native
    if not native.available():
        import pytest
        pytest.skip("no C++ compiler here")
    script = Path(__file__).resolve().parents[1] / "fuzz_walker.py"
    out = run_python([script, "--seconds", SECONDS, "--seed", 26, "--out", tmp_path],
                     timeout=max(60.0, 4 * SECONDS + 30))
    assert out.code == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 failures" in out.stdout, out.stdout[-3000:]
