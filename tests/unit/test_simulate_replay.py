"""From a trace to the request stream: recorded releases, record_stream, warm starts, requests from blocks.

Snapshots are built by hand as the dicts torch's ``_snapshot()`` returns and read by the real importer;
the expected allocator behaviour is worked out by hand in each test.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memlens.errors import InputError
from memlens.io.snapshot.importer import snapshot_to_trace
from memlens.simulate import simulate
from memlens.simulate.replay import EMPTY_CACHE, FREE, FREE_COMPLETED, FREE_REQUESTED, RELEASE_BEFORE_RESERVE
from memlens.simulate.replay import device_requests
from memlens.simulate.config import AllocatorConfig
from memlens.trace import Trace

MiB = 1 << 20
S_SMALL, S_LARGE, S_NEW = 0x7F0000000000, 0x7F0010000000, 0x7F0020000000


def entry(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1_000_000 + t, "frames": []}


def seg(addr, total, blocks, small=False):
    """A final-state segment; blocks: (offset, size, requested, state)."""
    return {"device": 0, "address": addr, "total_size": total, "stream": 0,
            "segment_type": "small" if small else "large", "is_expandable": False,
            "allocated_size": sum(b[1] for b in blocks if b[3] == "active_allocated"),
            "active_size": sum(b[1] for b in blocks if b[3] != "inactive"),
            "requested_size": sum(b[2] for b in blocks if b[3] != "inactive"),
            "blocks": [{"address": addr + off, "size": size, "requested_size": req, "state": state, "frames": []}
                       for off, size, req, state in blocks]}


def trace_of(entries, segments, expandable=False):
    for t, e in enumerate(entries):
        e["time_us"] = 1_000_000 + t
    return snapshot_to_trace({"segments": segments, "device_traces": [entries],
                              "allocator_settings": {"expandable_segments": expandable}})


def _release_scenario(release_then_reserve: bool):
    """c (512 B, small segment) stays live; a (5 MiB) is freed; its 20 MiB segment goes back."""
    entries = [
        entry("segment_alloc", S_SMALL, 2 * MiB, 0), entry("alloc", S_SMALL, 512, 0),
        entry("segment_alloc", S_LARGE, 20 * MiB, 0), entry("alloc", S_LARGE, 5 * MiB, 0),
        entry("free_requested", S_LARGE, 5 * MiB, 0), entry("free_completed", S_LARGE, 5 * MiB, 0),
        entry("segment_free", S_LARGE, 20 * MiB, 0),
    ]
    small_blocks = [(0, 512, 512, "active_allocated")]
    if not release_then_reserve:  # the next request is served from cache: an unambiguous empty_cache
        entries.append(entry("alloc", S_SMALL + 512, 512, 0))
        small_blocks.append((512, 512, 512, "active_allocated"))
    used = sum(b[1] for b in small_blocks)
    small_blocks.append((used, 2 * MiB - used, 0, "inactive"))
    # 25 MiB: too big for the cached 20 MiB segment, so the allocator reserves 26 MiB either way
    entries += [entry("segment_alloc", S_NEW, 26 * MiB, 0), entry("alloc", S_NEW, 25 * MiB, 0)]
    segments = [seg(S_SMALL, 2 * MiB, small_blocks, small=True),
                seg(S_NEW, 26 * MiB, [(0, 26 * MiB, 25 * MiB, "active_allocated")])]
    return trace_of(entries, segments)


def test_empty_cache_in_the_recording_is_replayed_at_the_same_point():
    trace = _release_scenario(release_then_reserve=False)
    req = device_requests(trace, "cuda:0", AllocatorConfig())
    assert (req.kind == EMPTY_CACHE).sum() == 1
    dev = simulate(trace).devices["cuda:0"]
    # without the release the 20 MiB segment would stay reserved next to the new 26 MiB one (48 MiB)
    assert dev.segment_allocs == [2 * MiB, 20 * MiB, 26 * MiB]
    assert dev.segment_frees == [20 * MiB]
    assert dev.peak_reserved == 28 * MiB and dev.final_reserved == 28 * MiB
    assert dev.recorded["peak_reserved"] == 28 * MiB


def test_release_before_a_reservation_is_applied_only_without_a_capacity():
    trace = _release_scenario(release_then_reserve=True)
    req = device_requests(trace, "cuda:0", AllocatorConfig())
    assert (req.kind == RELEASE_BEFORE_RESERVE).sum() == 1 and (req.kind == EMPTY_CACHE).sum() == 0
    replayed = simulate(trace).devices["cuda:0"]
    assert replayed.segment_frees == [20 * MiB] and replayed.peak_reserved == 28 * MiB
    # with a roomy capacity the device is not full: nothing is released
    roomy = simulate(trace, capacity=100 * MiB).devices["cuda:0"]
    assert roomy.segment_allocs == [2 * MiB, 20 * MiB, 26 * MiB] and roomy.segment_frees == []
    assert roomy.peak_reserved == 48 * MiB
    # with a tight one (22 + 26 > 30 MiB) the simulated OOM path makes the same release itself
    tight = simulate(trace, capacity=30 * MiB).devices["cuda:0"]
    assert tight.segment_allocs == [2 * MiB, 20 * MiB, 26 * MiB] and tight.segment_frees == [20 * MiB]
    assert tight.ooms == [] and tight.peak_reserved == 28 * MiB


def test_record_stream_deferred_free_replays_from_free_requested_to_free_completed():
    entries = [
        entry("segment_alloc", S_LARGE, 20 * MiB, 0), entry("alloc", S_LARGE, 5 * MiB, 0),
        entry("free_requested", S_LARGE, 5 * MiB, 0),  # used on another stream: not reusable yet
        entry("alloc", S_LARGE + 5 * MiB, 5 * MiB, 0),
        entry("free_completed", S_LARGE, 5 * MiB, 0),
        entry("alloc", S_LARGE, 5 * MiB, 0),
    ]
    segments = [seg(S_LARGE, 20 * MiB, [(0, 5 * MiB, 5 * MiB, "active_allocated"),
                                        (5 * MiB, 5 * MiB, 5 * MiB, "active_allocated"),
                                        (10 * MiB, 10 * MiB, 0, "inactive")])]
    trace = trace_of(entries, segments)
    req = device_requests(trace, "cuda:0", AllocatorConfig())
    assert req.kind.tolist().count(FREE_REQUESTED) == 1 and req.kind.tolist().count(FREE_COMPLETED) == 1
    dev = simulate(trace).devices["cuda:0"]
    addrs = dev.timeline.loc[dev.timeline["addr"] >= 0, "addr"].tolist()
    assert addrs == [S_LARGE, S_LARGE + 5 * MiB, S_LARGE]
    alloc_after_request = dev.timeline["allocated"].tolist()
    assert alloc_after_request[2] == 0  # allocated bytes drop at the request, the block stays busy


def test_immediate_free_pairs_become_one_step():
    trace = _release_scenario(release_then_reserve=False)
    req = device_requests(trace, "cuda:0", AllocatorConfig())
    assert req.kind.tolist().count(FREE) == 1
    assert FREE_REQUESTED not in req.kind.tolist()


def test_warm_start_rebuilds_segments_and_live_blocks_from_a_ring_buffer_trace():
    # recording began with a 20 MiB segment holding X (4 MiB, live before) and Y (8 MiB, freed without alloc)
    entries = [
        entry("free_requested", S_LARGE + 4 * MiB, 8 * MiB, 0), entry("free_completed", S_LARGE + 4 * MiB, 8 * MiB, 0),
        entry("alloc", S_LARGE + 4 * MiB, 10 * MiB, 0),  # fits in the freed 8 MiB + 8 MiB tail: no new segment
    ]
    segments = [seg(S_LARGE, 20 * MiB, [(0, 4 * MiB, 4 * MiB, "active_allocated"),
                                        (4 * MiB, 10 * MiB, 10 * MiB, "active_allocated"),
                                        (14 * MiB, 6 * MiB, 0, "inactive")])]
    trace = trace_of(entries, segments)
    dev = simulate(trace).devices["cuda:0"]
    assert dev.initial_state == "warm"
    assert dev.initial_reserved == 20 * MiB and dev.peak_reserved == 20 * MiB and dev.segment_allocs == []
    assert dev.timeline["allocated"].iloc[0] == 12 * MiB  # X and Y live at the start
    fb = dev.final_blocks
    assert list(zip(fb["addr"], fb["size"], fb["state"])) == [
        (S_LARGE, 4 * MiB, "allocated"), (S_LARGE + 4 * MiB, 10 * MiB, "allocated"),
        (S_LARGE + 14 * MiB, 6 * MiB, "inactive")]
    # an empty start requests X and Y first (a 20 MiB segment, before the first recorded event)
    empty = simulate(trace, initial_state="empty").devices["cuda:0"]
    assert empty.initial_state == "empty"
    assert empty.segment_allocs == [20 * MiB] and empty.segment_alloc_seqs == [-1]


def test_warm_start_absorbs_an_unsplit_remainder_of_at_most_1mib():
    # Y was freed without alloc; its request was 8 MiB but the allocator gave it 8.5 MiB (0.5 MiB not split)
    entries = [entry("free_requested", S_LARGE, 8 * MiB, 0), entry("free_completed", S_LARGE, 8 * MiB, 0)]
    segments = [seg(S_LARGE, 20 * MiB, [(0, 8 * MiB + MiB // 2, 0, "inactive"),
                                        (8 * MiB + MiB // 2, 11 * MiB + MiB // 2, 11 * MiB, "active_allocated")])]
    dev = simulate(trace_of(entries, segments)).devices["cuda:0"]
    assert dev.timeline["allocated"].iloc[0] == 20 * MiB
    assert dev.final_blocks["size"].tolist() == [8 * MiB + MiB // 2, 11 * MiB + MiB // 2]


def test_requests_from_blocks_without_events():
    blocks = pd.DataFrame({"block_id": [0, 1, 2], "device": "cuda:1", "size": [30 * MiB, 30 * MiB, 30 * MiB],
                           "alloc_ns": [0, 10, 30], "free_ns": [20, 40, 50], "stream": [0, 0, 0]})
    result = simulate(Trace.from_tables(blocks))
    dev = result.devices["cuda:1"]
    assert dev.initial_state == "empty"
    # block 2 is allocated after block 0 was freed and reuses its segment; block 1 overlapped block 0
    assert dev.segment_allocs == [30 * MiB, 30 * MiB]
    assert dev.peak_allocated == 60 * MiB and dev.peak_reserved == 60 * MiB
    assert dev.timeline["t_ns"].tolist()[1:] == [0, 10, 20, 30, 40, 50]


def test_bad_arguments_raise_input_error():
    blocks = pd.DataFrame({"block_id": [0], "device": "cuda:0", "size": [10], "alloc_ns": [0], "free_ns": [1]})
    trace = Trace.from_tables(blocks)
    with pytest.raises(InputError, match="unknown allocator"):
        simulate(trace, allocator="tcmalloc")
    with pytest.raises(InputError, match="device 'cuda:3'"):
        simulate(trace, device="cuda:3")
    with pytest.raises(InputError, match="initial_state"):
        simulate(trace, initial_state="hot")
    with pytest.raises(InputError, match="max_split_size_mb"):
        simulate(trace, conf="max_split_size_mb:4")
    with pytest.raises(InputError, match="size"):
        simulate(trace, capacity="lots")
    assert np.isfinite(simulate(trace, capacity="1GB").devices["cuda:0"].peak_reserved)


def _oom_recording():
    """Default settings, device capacity 80 MiB. A 45 MiB block gets a 46 MiB segment; once freed, a 5 MiB
    request splits it and pins it; a 60 MiB request then needs a new segment: 46 + 60 > 80, nothing
    cached is unsplit, so the allocator gives up (an ``oom`` entry with the device's 34 MiB free)."""
    entries = [
        entry("segment_alloc", S_LARGE, 46 * MiB, 0), entry("alloc", S_LARGE, 45 * MiB, 0),
        entry("free_requested", S_LARGE, 45 * MiB, 0), entry("free_completed", S_LARGE, 45 * MiB, 0),
        entry("alloc", S_LARGE, 5 * MiB, 0),
        {"action": "oom", "device_free": 34 * MiB, "size": 60 * MiB, "stream": 0, "frames": []},
    ]
    segments = [seg(S_LARGE, 46 * MiB, [(0, 5 * MiB, 5 * MiB, "active_allocated"),
                                        (5 * MiB, 41 * MiB, 0, "inactive")])]
    return trace_of(entries, segments)


def test_recorded_oom_is_reproduced_under_the_inferred_capacity():
    dev = simulate(_oom_recording()).devices["cuda:0"]
    assert dev.capacity == 80 * MiB  # 46 MiB reserved + 34 MiB free on the device
    assert len(dev.ooms) == 1 and dev.ooms[0]["requested"] == 60 * MiB
    assert dev.segment_allocs == [46 * MiB] and dev.peak_reserved == 46 * MiB
    assert any("inferred from the recorded OOM" in n for n in dev.notes)


def test_what_if_expandable_segments_avoids_the_recorded_oom():
    # expandable: the 45 MiB block maps three 20 MiB pages; freed, the 5 MiB request splits the 60 MiB free
    # range; the 60 MiB request grows the tail by one page: 80 MiB reserved, within the capacity
    dev = simulate(_oom_recording(), conf="expandable_segments:True").devices["cuda:0"]
    assert dev.ooms == []
    assert dev.peak_reserved == 80 * MiB
    assert dev.segment_allocs == [60 * MiB, 20 * MiB]


def test_unlimited_capacity_turns_the_inference_off():
    dev = simulate(_oom_recording(), capacity="unlimited").devices["cuda:0"]
    assert dev.capacity is None and dev.ooms == []
    assert dev.segment_allocs == [46 * MiB, 60 * MiB]


def test_blocks_alive_before_recording_start_the_replay_once():
    blocks = pd.DataFrame({"block_id": [0, 1], "device": "cuda:0", "size": [30 * MiB, 4 * MiB],
                           "alloc_ns": pd.array([None, 5], dtype="Int64"), "free_ns": [10, 20],
                           "allocated_before": [True, False]})
    dev = simulate(Trace.from_tables(blocks)).devices["cuda:0"]
    assert dev.timeline["allocated"].iloc[0] == 30 * MiB  # requested before the first event
    assert dev.timeline["allocated"].tolist()[1:] == [34 * MiB, 4 * MiB, 0]
    assert dev.segment_allocs == [30 * MiB, 20 * MiB]


def test_warm_start_rebuilds_mapped_pages_of_expandable_segments():
    # expandable_segments:True; recording began with two 20 MiB pages mapped and X (8 MiB) live at the base
    entries = [
        entry("free_requested", S_LARGE, 8 * MiB, 0), entry("free_completed", S_LARGE, 8 * MiB, 0),
        entry("alloc", S_LARGE, 30 * MiB, 0),  # fits in the 40 MiB already mapped
        entry("segment_map", S_LARGE + 40 * MiB, 20 * MiB, 0),  # 15 MiB needs one more page
        entry("alloc", S_LARGE + 30 * MiB, 15 * MiB, 0),
    ]
    final = seg(S_LARGE, 60 * MiB, [(0, 30 * MiB, 30 * MiB, "active_allocated"),
                                    (30 * MiB, 15 * MiB, 15 * MiB, "active_allocated"),
                                    (45 * MiB, 15 * MiB, 0, "inactive")])
    final["is_expandable"] = True
    trace = trace_of(entries, [final], expandable=True)
    dev = simulate(trace).devices["cuda:0"]
    assert dev.initial_state == "warm"
    assert dev.recorded["initial_reserved"] == 40 * MiB and dev.recorded["peak_reserved"] == 60 * MiB
    assert dev.initial_reserved == 40 * MiB and dev.timeline["allocated"].iloc[0] == 8 * MiB
    assert dev.segment_allocs == [20 * MiB] and dev.peak_reserved == 60 * MiB
    assert dev.timeline.loc[dev.timeline["addr"] >= 0, "addr"].tolist() == [S_LARGE, S_LARGE + 30 * MiB]
    fb = dev.final_blocks[dev.final_blocks["state"] != "unmapped"]
    assert list(zip(fb["addr"], fb["size"], fb["state"])) == [
        (S_LARGE, 30 * MiB, "allocated"), (S_LARGE + 30 * MiB, 15 * MiB, "allocated"),
        (S_LARGE + 45 * MiB, 15 * MiB, "inactive")]


@pytest.mark.parametrize("gap, absorbed", [(MiB, True), (MiB + 512, False)])
def test_warm_start_gap_of_exactly_1mib_is_the_blocks_unsplit_remainder(gap, absorbed):
    """the caching allocator's split rule: a large-pool block splits only when the remainder is > 1 MiB, so a gap
    of exactly 1 MiB after a block live at the start was its unsplit remainder (the block held 9 MiB); a
    gap of 1 MiB + 512 B would have been split off (the block held its rounded 8 MiB request)."""
    entries = [entry("free_requested", S_LARGE, 8 * MiB, 0), entry("free_completed", S_LARGE, 8 * MiB, 0)]
    live = 20 * MiB - 8 * MiB - gap
    segments = [seg(S_LARGE, 20 * MiB, [(0, 8 * MiB + gap, 0, "inactive"),
                                        (8 * MiB + gap, live, live, "active_allocated")])]
    dev = simulate(trace_of(entries, segments)).devices["cuda:0"]
    y_size = 8 * MiB + gap if absorbed else 8 * MiB
    assert dev.timeline["allocated"].iloc[0] == y_size + live
