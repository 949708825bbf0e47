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
