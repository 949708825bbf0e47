"""Issue 18, item 19: under .ci/run (MEMLENS_REQUIRE set) a test skipped for want of the shared traces or a
browser fails; in a user's clone (variable unset) it still skips."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT, skip_kind


def _pytest(env_extra: dict, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MEMLENS_REQUIRE"}
    env.update(env_extra, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_shared_skip_is_a_failure_only_when_required(tmp_path):
    target = ["tests/integration/test_import_badfiles.py", "-k", "fuzzed"]
    absent = {"MEMLENS_SHARED_TRACES": str(tmp_path / "no_traces")}
    user = _pytest(absent, *target)
    assert user.returncode == 0 and "skipped" in user.stdout and "failed" not in user.stdout, user.stdout
    ci = _pytest({**absent, "MEMLENS_REQUIRE": "shared,browser"}, *target)
    assert ci.returncode == 1 and "failed" in ci.stdout, ci.stdout
    assert "MEMLENS_REQUIRE" in ci.stdout
    only_browser = _pytest({**absent, "MEMLENS_REQUIRE": "browser"}, *target)
    assert only_browser.returncode == 0, only_browser.stdout


def test_skip_kinds():
    assert skip_kind("tests/test_x.py::t", "needs the shared real traces (/x is absent; ...)") == "shared"
    assert skip_kind("tests/browser/test_report_browser.py::t", "sample trace missing") == "browser"
    assert skip_kind("tests/report_support.py::t", "needs Debian's chromium (/usr/bin/chromium)") == "browser"
    assert skip_kind("tests/test_store.py::t", "running as root: permissions are not enforced") is None
