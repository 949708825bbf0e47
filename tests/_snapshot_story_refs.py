"""Shared by the snapshot story tests (tests/integration/test_snapshot_story*.py): the real CUDA snapshot most of them
read, a cs336 training step recorded with its phases annotated (under the shared traces' folder)."""
from __future__ import annotations

TRAINING = "snapshots/cs336_wedsonlin_medium_128_training.pickle"
