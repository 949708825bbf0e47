"""Shared fixtures: paths to the real traces in ../shared/traces (skipped when absent)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = Path(os.environ.get("MEMLENS_SHARED_TRACES", ROOT.parent / "shared" / "traces"))
SAMPLE_TRACES = ROOT / "sample_traces"
ARTIFACTS = Path(os.environ.get("MEMLENS_TEST_ARTIFACTS", ROOT / "test-artifacts"))


def shared_trace(relpath: str) -> Path:
    """Path of a file under ../shared/traces, or skip the test with the reason."""
    path = SHARED_TRACES / relpath
    if not path.exists():
        pytest.skip(f"needs the shared real traces ({path} is absent; they exist only in the developers' "
                    "workspace, not in a user's clone)")
    return path


@pytest.fixture
def shared():
    """Callable fixture: shared('snapshots/decomfl_memory.pickle') -> Path (or skip)."""
    return shared_trace


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Directory for test artifacts (screenshots, reports) kept after the run."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


# .ci/run sets MEMLENS_REQUIRE (e.g. "shared,browser") when ../shared/traces and chromium are present:
# there, a test skipped for want of them would hide a regression, so it fails instead. A user's clone
# (no variable) still skips them.
REQUIRED = {w.strip() for w in os.environ.get("MEMLENS_REQUIRE", "").split(",") if w.strip()}
_BROWSER_WORDS = ("chromium", "playwright", "browser", "jupyterlab", "jupyter launcher")


def skip_kind(nodeid: str, reason: str) -> str | None:
    """"shared" / "browser" when a skip is for want of the shared traces / a browser, else None."""
    text = reason.lower()
    if "shared real traces" in text or "shared/traces" in text:
        return "shared"
    if "browser" in nodeid.lower() or any(w in text for w in _BROWSER_WORDS):
        return "browser"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not REQUIRED or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    kind = skip_kind(item.nodeid, str(reason))
    if kind in REQUIRED:
        report.outcome = "failed"
        report.longrepr = (f"skipped, but MEMLENS_REQUIRE={','.join(sorted(REQUIRED))} (set by .ci/run because "
                           f"the {kind} prerequisites are present) makes that a failure: {reason}")
