"""The caching-allocator policy, rule by rule, on small constructed request sequences.

Each test is built so that it fails if its rule is removed from the simulator (the alternative outcome is
named in the test). Sizes are computed by hand from the rules of c10/cuda/CUDACachingAllocator.cpp.
"""
from __future__ import annotations

import pytest

from memlens.simulate.caching import CachingAllocator
from memlens.simulate.config import allocation_size, parse_conf

MiB = 1 << 20


def make(conf: str = "", capacity: int | None = None) -> CachingAllocator:
    return CachingAllocator(parse_conf(conf), capacity)


def reservations(alloc: CachingAllocator) -> list[tuple[str, int]]:
    return [(action, size) for _, _, action, _, size in alloc.segment_events]


# ---- rounding -----------------------------------------------------------------------------------
def test_requests_round_to_512_bytes_with_a_512_byte_minimum():
    a = make()
    assert a.malloc(1, 1, 0).size == 512
    assert a.malloc(2, 1000, 0).size == 1024
    assert a.malloc(3, 1024, 0).size == 1024
    assert a.allocated == 512 + 1024 + 1024


def test_roundup_power2_divisions_rounds_to_the_next_division():
    # 5 MiB + 1 lies between 4 and 8 MiB; 4 divisions -> steps of 1 MiB -> 6 MiB
    assert make("roundup_power2_divisions:4").malloc(1, 5 * MiB + 1, 0).size == 6 * MiB
    assert make().malloc(1, 5 * MiB + 1, 0).size == 5 * MiB + 512
    # below 512 x divisions the plain 512-byte rounding applies
    assert make("roundup_power2_divisions:4").malloc(1, 1000, 0).size == 1024


def test_roundup_power2_divisions_per_interval_list():
    conf = "roundup_power2_divisions:[1:1,4:4,>:8]"
    # [2, 4) MiB was not named and lies above the first entry: plain rounding
    assert make(conf).malloc(1, 3 * MiB + 1, 0).size == 3 * MiB + 512
    # [4, 8) MiB: 4 divisions of 1 MiB
    assert make(conf).malloc(1, 5 * MiB + 1, 0).size == 6 * MiB
    # [8, 16) MiB: '>' gives the intervals above the last one named 8 divisions of 1 MiB
    assert make(conf).malloc(1, 9 * MiB + 1, 0).size == 10 * MiB
    assert make(conf).malloc(1, 17 * MiB + 1, 0).size == 18 * MiB


# ---- pools and segment sizes --------------------------------------------------------------------
def test_small_and_large_pools_get_2mib_and_20mib_segments():
    a = make()
    a.malloc(1, MiB, 0)  # exactly 1 MiB: small pool
    a.malloc(2, MiB + 1, 0)  # rounds to 1 MiB + 512: large pool, 1-10 MiB -> 20 MiB segment
    assert reservations(a) == [("segment_alloc", 2 * MiB), ("segment_alloc", 20 * MiB)]


def test_pools_do_not_share_cached_blocks():
    a = make()
    a.malloc(1, 512 * 1024, 0)
    a.free(1)  # a free 2 MiB small segment is cached
    a.malloc(2, MiB + 512, 0)  # a large request cannot use it
    assert [s for _, s in reservations(a)] == [2 * MiB, 20 * MiB]


@pytest.mark.parametrize("size, expected", [
    (512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),
    (10 * MiB, 10 * MiB), (10 * MiB + 512, 12 * MiB), (101 * MiB, 102 * MiB),
])
def test_segment_size_rule(size, expected):
    assert allocation_size(size) == expected


# ---- best fit ------------------------------------------------------------------------------------
def test_best_fit_takes_the_smallest_cached_block_that_fits():
    a = make()
    for bid, size in ((1, 30 * MiB), (2, 24 * MiB), (3, 40 * MiB)):
        a.malloc(bid, size, 0)
    addr_24 = a.live[2].addr
    for bid in (1, 2, 3):
        a.free(bid)
    block = a.malloc(4, 23 * MiB, 0)
    assert block.addr == addr_24  # not the 30 or 40 MiB one
    assert len(a.segment_events) == 3  # no new segment


def test_best_fit_breaks_size_ties_by_lowest_address():
    a = make()
    a.malloc(1, 30 * MiB, 0)
    a.malloc(2, 30 * MiB, 0)
    low = min(a.live[1].addr, a.live[2].addr)
    a.free(2)
    a.free(1)
    assert a.malloc(3, 30 * MiB, 0).addr == low


def test_cached_blocks_serve_only_their_own_stream():
    a = make()
    a.malloc(1, 30 * MiB, 0)
    a.free(1)
    a.malloc(2, 30 * MiB, 7)  # another stream: a new segment
    assert len(reservations(a)) == 2
    a.malloc(3, 30 * MiB, 0)  # the original stream reuses its block
    assert len(reservations(a)) == 2


# ---- splitting and merging -----------------------------------------------------------------------
def test_large_block_split_takes_low_addresses_and_caches_the_remainder():
    a = make()
    block = a.malloc(1, 2 * MiB, 0)
    seg_addr = a.segment_events[0][3]
    assert block.addr == seg_addr and block.size == 2 * MiB
    assert a.inactive_split == 18 * MiB  # the remainder is a cached split block
    b2 = a.malloc(2, 2 * MiB, 0)  # served from the remainder, no new segment
    assert b2.addr == seg_addr + 2 * MiB and len(a.segment_events) == 1


def test_large_remainder_of_1mib_or_less_is_not_split():
    a = make()
    a.malloc(1, 20 * MiB, 0)
    a.free(1)
    block = a.malloc(2, 19 * MiB + 512 * 1024, 0)  # remainder 0.5 MiB <= 1 MiB: keep the whole block
    assert block.size == 20 * MiB
    assert a.inactive_split == 0


def test_small_pool_splits_any_remainder_of_512_bytes_or_more():
    a = make()
    block = a.malloc(1, 512, 0)
    assert block.size == 512
    assert a.inactive_split == 2 * MiB - 512


def test_freed_neighbours_merge_back_into_a_whole_segment():
    a = make()
    for bid in (1, 2, 3):
        a.malloc(bid, 4 * MiB, 0)  # three blocks carved from one 20 MiB segment
    a.free(1)
    a.free(3)
    a.free(2)  # merges with both neighbours (and the cached tail)
    assert a.inactive_split == 0
    a.empty_cache()  # only an unsplit segment can be released: this needs the merge
    assert a.reserved == 0
    assert reservations(a) == [("segment_alloc", 20 * MiB), ("segment_free", 20 * MiB)]


# ---- max_split_size and max_non_split_rounding_size ----------------------------------------------
def test_max_split_size_keeps_small_requests_off_oversize_blocks():
    for conf, expected_segments in (("", 1), ("max_split_size_mb:40", 2)):
        a = make(conf)
        a.malloc(1, 60 * MiB, 0)
        a.free(1)
        a.malloc(2, 30 * MiB, 0)  # default: splits the cached 60 MiB block; with the limit: new segment
        assert len(reservations(a)) == expected_segments, conf


def test_blocks_at_or_above_max_split_size_are_not_split():
    a = make("max_split_size_mb:40")
    a.malloc(1, 60 * MiB, 0)
    a.free(1)
    block = a.malloc(2, 50 * MiB, 0)  # 60 < 50 + 20: the oversize block is handed out whole
    assert block.size == 60 * MiB
    assert len(reservations(a)) == 1


def test_max_non_split_rounding_size_bounds_oversize_reuse():
    for conf, reuses in (("max_split_size_mb:40", False),
                         ("max_split_size_mb:40,max_non_split_rounding_mb:64", True)):
        a = make(conf)
        a.malloc(1, 100 * MiB, 0)
        a.free(1)
        a.malloc(2, 50 * MiB, 0)  # 100 >= 50 + 20 refused by default; 100 < 50 + 64 allowed
        assert (len(reservations(a)) == 1) is reuses, conf


# ---- the OOM path ----------------------------------------------------------------------------------
def test_full_device_frees_cached_segments_and_retries():
    a = make(capacity=60 * MiB)
    a.malloc(1, 24 * MiB, 0)
    a.free(1)
    block = a.malloc(2, 40 * MiB, 0)  # 24 + 40 > 60: release the cached 24 MiB, then it fits
    assert block is not None and not a.ooms
    assert reservations(a) == [("segment_alloc", 24 * MiB), ("segment_free", 24 * MiB),
                               ("segment_alloc", 40 * MiB)]
    assert a.reserved == 40 * MiB


def test_oom_when_nothing_can_be_released():
    a = make(capacity=60 * MiB)
    a.malloc(1, 40 * MiB, 0)
    assert a.malloc(2, 30 * MiB, 0) is None
    assert len(a.ooms) == 1 and a.ooms[0]["requested"] == 30 * MiB and a.ooms[0]["reserved"] == 40 * MiB
    assert a.allocated == 40 * MiB


def test_oom_path_releases_only_oversize_blocks_first_with_max_split_size():
    a = make("max_split_size_mb:40", capacity=100 * MiB)
    a.malloc(1, 50 * MiB, 0)
    a.malloc(2, 24 * MiB, 0)
    a.free(1)
    a.free(2)
    # 30 MiB: the 50 MiB block is oversize for it, 24 MiB too small -> new segment; 74 + 30 > 100 ->
    # release oversize cached blocks (the 50 MiB one) and retry; the 24 MiB block stays cached
    a.malloc(3, 30 * MiB, 0)
    assert [s for act, s in reservations(a) if act == "segment_free"] == [50 * MiB]
    assert a.reserved == 54 * MiB


# ---- garbage collection -----------------------------------------------------------------------------
def test_garbage_collection_frees_old_cached_segments_above_the_threshold():
    a = make("garbage_collection_threshold:0.5", capacity=100 * MiB)
    a.malloc(1, 24 * MiB, 0)
    a.free(1)  # cached at get_free_block call 1
    a.malloc(2, 30 * MiB, 0)
    a.free(2)  # cached at call 2; reserved 54 MiB > 50 MiB threshold
    a.malloc(3, 40 * MiB, 0)  # call 3: ages 2 and 1, mean 1.5 -> only the 24 MiB block is freed
    assert [s for act, s in reservations(a) if act == "segment_free"] == [24 * MiB]
    assert a.reserved == 70 * MiB


def test_garbage_collection_needs_a_capacity():
    a = make("garbage_collection_threshold:0.5")
    a.malloc(1, 24 * MiB, 0)
    a.free(1)
    a.malloc(2, 30 * MiB, 0)
    a.free(2)
    a.malloc(3, 40 * MiB, 0)
    assert not [act for act, _ in reservations(a) if act == "segment_free"]


# ---- empty_cache ----------------------------------------------------------------------------------------
def test_empty_cache_releases_unsplit_cached_segments_only():
    a = make()
    a.malloc(1, 512, 0)
    a.malloc(2, 512, 0)  # both in one 2 MiB small segment
    a.malloc(3, 30 * MiB, 0)
    a.free(3)
    a.free(1)
    a.empty_cache()
    assert a.reserved == 2 * MiB  # the small segment still holds block 2
    assert reservations(a)[-1] == ("segment_free", 30 * MiB)


# ---- record_stream deferred frees ----------------------------------------------------------------------------
def test_deferred_free_keeps_the_block_until_completed():
    a = make()
    a.malloc(1, 30 * MiB, 0)
    a.free_requested(1)  # record_stream: other streams may still use it
    assert a.allocated == 0
    a.malloc(2, 30 * MiB, 0)  # cannot reuse block 1 yet: a second segment
    assert len(reservations(a)) == 2
    a.free_completed(1)
    a.malloc(3, 30 * MiB, 0)  # now it can
    assert len(reservations(a)) == 2


def test_oom_path_waits_for_deferred_frees_before_releasing():
    a = make(capacity=50 * MiB)
    a.malloc(1, 30 * MiB, 0)
    a.free_requested(1)
    assert a.malloc(2, 40 * MiB, 0) is not None  # synchronize, return block 1, release it, retry
    assert a.reserved == 40 * MiB and not a.pending


# ---- expandable segments ------------------------------------------------------------------------------------
def test_expandable_segment_grows_by_20mib_pages_instead_of_new_segments():
    a = make("expandable_segments:True")
    b1 = a.malloc(1, 5 * MiB, 0)
    b2 = a.malloc(2, 30 * MiB, 0)
    assert b2.addr == b1.addr + 5 * MiB  # one growing virtual range
    assert reservations(a) == [("segment_map", 20 * MiB), ("segment_map", 20 * MiB)]
    assert a.reserved == 40 * MiB
    plain = make()
    plain.malloc(1, 5 * MiB, 0)
    plain.malloc(2, 30 * MiB, 0)
    assert plain.reserved == 50 * MiB


def test_expandable_small_pool_maps_2mib_pages():
    a = make("expandable_segments:True")
    a.malloc(1, MiB, 0)
    a.malloc(2, MiB, 0)
    a.malloc(3, 512, 0)
    assert [s for _, s in reservations(a)] == [2 * MiB, 2 * MiB]


def test_expandable_segments_split_any_remainder():
    a = make("expandable_segments:True")
    block = a.malloc(1, 19 * MiB + 512 * 1024, 0)  # the 0.5 MiB remainder is split off, unlike above
    assert block.size == 19 * MiB + 512 * 1024


def test_expandable_release_unmaps_free_pages():
    a = make("expandable_segments:True")
    a.malloc(1, 30 * MiB, 0)
    a.malloc(2, 5 * MiB, 0)
    a.free(1)
    a.empty_cache()  # pages wholly inside the free 30 MiB are unmapped; block 2's page stays
    assert a.reserved == 20 * MiB
    a.free(2)
    a.empty_cache()
    assert a.reserved == 0
    assert [act for act, _ in reservations(a)].count("segment_unmap") == 2


def test_expandable_best_fit_counts_the_room_a_block_can_grow_into():
    a = make("expandable_segments:True")
    first_addr = a.malloc(1, 10 * MiB, 0).addr
    a.malloc(2, 2 * MiB, 0)  # the first 20 MiB page now ends in a free 8 MiB block before unmapped space
    a.free(1)  # a free 10 MiB block with an allocated neighbour
    # best fit by size alone would take the 8 MiB tail; torch ranks it by the size it can grow to
    # (8 MiB + the unmapped range) and prefers the 10 MiB block
    assert a.malloc(3, 7 * MiB, 0).addr == first_addr


# ---- boundary values (each of these survived a mutation spot-check) -------------------------
# The expected outcomes follow PyTorch's caching allocator (CUDACachingAllocator.cpp): "GC frees blocks whose
# age >= the mean age", "a request below max_split_size never takes a block >= it", "a request >= it takes a
# block only if block < size + 20 MiB", "large pool splits if size < max_split_size and remainder > 1 MiB",
# "small pool splits if the remainder >= 512 B"; the oversize blocks released on the OOM path are those
# >= max_split_size.
def test_garbage_collection_frees_a_block_of_exactly_the_mean_age():
    a = make("garbage_collection_threshold:0.5", capacity=100 * MiB)
    a.malloc(1, 24 * MiB, 0)
    a.malloc(2, 30 * MiB, 0)
    a.free(1)
    a.free(2)  # both cached at the same get_free_block count: equal ages, each exactly the mean age
    a.malloc(3, 40 * MiB, 0)  # reserved 54 MiB > 50 MiB threshold: age >= mean frees both
    assert [s for act, s in reservations(a) if act == "segment_free"] == [24 * MiB, 30 * MiB]
    assert a.reserved == 40 * MiB


def test_a_block_of_exactly_max_split_size_is_oversize_for_a_smaller_request():
    a = make("max_split_size_mb:40")
    a.malloc(1, 40 * MiB, 0)
    a.free(1)  # a cached block of exactly max_split_size
    block = a.malloc(2, 30 * MiB, 0)  # below max_split_size: must not take (and split) the 40 MiB block
    assert reservations(a) == [("segment_alloc", 40 * MiB), ("segment_alloc", 30 * MiB)]
    assert block.size == 30 * MiB and a.inactive_split == 0


def test_a_request_of_exactly_max_split_size_is_not_split_and_rounds_up_by_less_than_20mib():
    a = make("max_split_size_mb:40")
    a.malloc(1, 50 * MiB, 0)
    a.free(1)
    block = a.malloc(2, 40 * MiB, 0)  # size == max_split_size: 50 < 40 + 20, taken whole, never split
    assert block.size == 50 * MiB and a.inactive_split == 0
    assert len(reservations(a)) == 1
    b = make("max_split_size_mb:40")
    b.malloc(1, 60 * MiB, 0)
    b.free(1)
    block = b.malloc(2, 40 * MiB, 0)  # 60 is not < 40 + 20: a new segment instead
    assert block.size == 40 * MiB
    assert reservations(b) == [("segment_alloc", 60 * MiB), ("segment_alloc", 40 * MiB)]


def test_oom_path_releases_blocks_of_exactly_max_split_size_first():
    a = make("max_split_size_mb:40", capacity=100 * MiB)
    for bid, size in ((1, 40 * MiB), (2, 40 * MiB), (3, 12 * MiB)):
        a.malloc(bid, size, 0)
    for bid in (1, 2, 3):
        a.free(bid)  # cached: two oversize blocks of exactly 40 MiB and one 12 MiB block
    # 60 MiB: no cached block fits; 92 + 60 > 100. Releasing the oversize blocks (>= 40 MiB) frees 80 MiB
    # >= 60 MiB, so the 12 MiB block stays cached (releasing everything would drop it too)
    a.malloc(4, 60 * MiB, 0)
    assert [s for act, s in reservations(a) if act == "segment_free"] == [40 * MiB, 40 * MiB]
    assert a.reserved == 12 * MiB + 60 * MiB and not a.ooms


@pytest.mark.parametrize("request_size, split", [(19 * MiB, False), (19 * MiB - 512, True)])
def test_large_remainder_of_exactly_1mib_is_not_split(request_size, split):
    a = make()
    a.malloc(1, 20 * MiB, 0)
    a.free(1)
    block = a.malloc(2, request_size, 0)  # remainder exactly 1 MiB: kept; 1 MiB + 512 B: split off
    assert block.size == (request_size if split else 20 * MiB)
    assert a.inactive_split == (20 * MiB - request_size if split else 0)


@pytest.mark.parametrize("request_size, split", [(2 * MiB - 512, True), (2 * MiB - 511, False)])
def test_small_remainder_of_exactly_512_bytes_is_split(request_size, split):
    # a 2 MiB small segment is reserved only for requests <= 1 MiB; carve it first, then reuse the rest
    a = make()
    a.malloc(1, MiB, 0)
    a.malloc(2, MiB, 0)
    a.free(1)
    a.free(2)  # one free 2 MiB small block again (merged)
    a.malloc(3, MiB, 0)
    # the 1 MiB left is served to a request of 1 MiB - 512 (remainder 512: split) or 1 MiB - 511
    # (rounds to 1 MiB: remainder 0)
    block = a.malloc(4, request_size - MiB, 0)
    assert block.size == -(-(request_size - MiB) // 512) * 512
    assert a.inactive_split == (512 if split else 0)
