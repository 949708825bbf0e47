"""Simulated vs recorded allocator behaviour on the real snapshots in ../shared/traces.

The truth comes straight from the raw pickles (plain ``pickle.load`` on the shared files): the recorded
``segment_alloc`` / ``segment_free`` entries, the final ``segments`` and their blocks, and every ``alloc``
entry's address. The simulator sees the trace only through the snapshot importer.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import memlens
from memlens.simulate import simulate

SNAPSHOTS = ["decomfl_memory", "cs336_wedsonlin_medium_128_training", "cs336_wedsonlin_medium_128_inference",
             "flexgen_opt1.3b_2023format", "verl_segments_only"]
WARM = ["cs336_wedsonlin_medium_128_training", "cs336_wedsonlin_medium_128_inference"]
_STATE = {"active_allocated": "allocated", "active_pending_free": "pending_free",
          "active_awaiting_free": "pending_free", "inactive": "inactive"}


def _raw(shared, name):
    with open(shared(f"snapshots/{name}.pickle"), "rb") as f:
        return pickle.load(f)


def _truth(raw) -> dict:
    """Reserved bytes from the file alone: final segments minus the net of the segment events."""
    entries = raw["device_traces"][0] if raw.get("device_traces") else []
    final = sum(s["total_size"] for s in raw["segments"])
    deltas = [e["size"] if e["action"] in ("segment_alloc", "segment_map") else
              -e["size"] if e["action"] in ("segment_free", "segment_unmap") else 0 for e in entries]
    running = np.cumsum(deltas) if deltas else np.zeros(1, dtype=np.int64)
    initial = final - int(running[-1])
    return {"initial": initial, "peak": initial + max(0, int(running.max())), "final": final,
            "segment_allocs": [e["size"] for e in entries if e["action"] == "segment_alloc"],
            "alloc_addrs": [e["addr"] for e in entries if e["action"] == "alloc"]}


@pytest.fixture(scope="module")
def runs():
    """name -> (raw pickle, simulated DeviceResult of cuda:0), computed once per module."""
    from conftest import shared_trace
    out = {}
    for name in SNAPSHOTS:
        path = shared_trace(f"snapshots/{name}.pickle")
        with open(path, "rb") as f:
            raw = pickle.load(f)
        out[name] = (raw, simulate(memlens.load(path)).devices["cuda:0"])
    return out


def test_decomfl_from_an_empty_allocator_matches_exactly(runs):
    raw, sim = runs["decomfl_memory"]
    truth = _truth(raw)
    assert truth["initial"] == 0  # the recording starts from an empty allocator
    assert len(truth["segment_allocs"]) == 61
    assert sim.segment_allocs == truth["segment_allocs"]
    assert sim.peak_reserved == truth["peak"] == 1_897_922_560
    assert sim.final_reserved == truth["final"]


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_peak_reserved_within_one_percent_and_segment_sequence(runs, name):
    raw, sim = runs[name]
    truth = _truth(raw)
    assert sim.initial_reserved == truth["initial"]
    assert abs(sim.peak_reserved - truth["peak"]) <= 0.01 * truth["peak"]
    # measured: every snapshot here is reproduced exactly, not just within 1 %
    assert sim.peak_reserved == truth["peak"]
    assert sim.segment_allocs == truth["segment_allocs"]


@pytest.mark.parametrize("name", ["decomfl_memory"] + WARM)
def test_every_allocation_lands_at_its_recorded_address(runs, name):
    raw, sim = runs[name]
    truth = _truth(raw)
    simulated = sim.timeline.loc[sim.timeline["addr"] >= 0, "addr"].tolist()
    assert len(simulated) == len(truth["alloc_addrs"])
    assert simulated == truth["alloc_addrs"]


@pytest.mark.parametrize("name", ["decomfl_memory"] + WARM)
def test_final_allocator_state_matches_the_snapshot_block_by_block(runs, name):
    raw, sim = runs[name]
    recorded = sorted((b["address"], b["size"], _STATE[b["state"]]) for s in raw["segments"] for b in s["blocks"])
    fb = sim.final_blocks
    simulated = sorted(zip(fb["addr"].tolist(), fb["size"].tolist(), fb["state"].tolist()))
    assert simulated == recorded


@pytest.mark.parametrize("name", WARM)
def test_warm_start_rebuilds_reserved_segments_and_live_blocks(runs, name):
    raw, sim = runs[name]
    truth = _truth(raw)
    assert sim.initial_state == "warm"
    assert truth["initial"] == truth["final"] > 1_000_000_000  # no segment events: warm from the start
    assert sim.timeline["reserved"].iloc[0] == truth["initial"]
    # blocks live before recording count as allocated from the start
    assert sim.timeline["allocated"].iloc[0] > 0


def test_empty_start_on_a_warm_recording_is_a_different_question(runs, shared):
    """Documented difference: replaying cs336 training from an EMPTY allocator (blocks live before
    recording requested first, in address order) reserves 16 MiB less than the real run did. The real
    allocator's segments were shaped by allocations that happened before the recording window, which an
    empty start cannot know; the warm start (default) reproduces the recording exactly."""
    raw, warm = runs["cs336_wedsonlin_medium_128_training"]
    empty = simulate(memlens.load(shared("snapshots/cs336_wedsonlin_medium_128_training.pickle")),
                     initial_state="empty").devices["cuda:0"]
    truth = _truth(raw)
    assert warm.peak_reserved == truth["peak"]
    assert empty.initial_state == "empty"
    assert empty.peak_reserved != truth["peak"]
    assert abs(empty.peak_reserved - truth["peak"]) <= 0.01 * truth["peak"]


def test_warm_start_needed_estimated_block_sizes(shared):
    """Documented approximation: blocks freed without an alloc in the trace carry only their requested
    size; the replay rounds it and absorbs a following gap of <= 1 MiB (a large-pool block keeps such a
    remainder). On cs336 training 438 blocks needed this estimate and the replay still matches."""
    trace = memlens.load(shared("snapshots/cs336_wedsonlin_medium_128_training.pickle"))
    b = trace.blocks
    estimated = b[b["free_without_alloc"] & b["block_size"].isna()]
    assert len(estimated) == 438


def test_a_saved_and_reloaded_trace_replays_identically(runs, shared, tmp_path):
    _, sim = runs["cs336_wedsonlin_medium_128_training"]
    trace = memlens.load(shared("snapshots/cs336_wedsonlin_medium_128_training.pickle"))
    again = simulate(memlens.load(trace.save(tmp_path / "t.memlens"))).devices["cuda:0"]
    assert again.peak_reserved == sim.peak_reserved
    assert again.timeline["addr"].tolist() == sim.timeline["addr"].tolist()


def test_block_lifetimes_drive_the_replay_when_events_lack_block_ids(runs, shared):
    _, sim = runs["decomfl_memory"]
    trace = memlens.load(shared("snapshots/decomfl_memory.pickle"))
    trace.events = trace.events.drop(columns=["block_id"])
    again = simulate(trace).devices["cuda:0"]
    assert again.segment_allocs == sim.segment_allocs
    assert again.peak_reserved == sim.peak_reserved
