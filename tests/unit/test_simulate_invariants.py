"""Randomised request sequences under every setting: the allocator's books must always balance.

After every step, recomputed independently from the blocks themselves: reserved bytes equal the sum of
mapped blocks; allocated bytes equal the sum of allocated blocks; blocks of a segment tile it without
gaps or overlaps; no two free neighbours are left unmerged; every cached block sits in the right pool;
the capacity is never exceeded; inactive-split bytes equal the free bytes of split ordinary segments.
"""
from __future__ import annotations

import random
import zlib

import pytest

from memlens.simulate.caching import CachingAllocator
from memlens.simulate.config import parse_conf

MiB = 1 << 20
CONFS = ["", "expandable_segments:True", "max_split_size_mb:40", "max_split_size_mb:40,max_non_split_rounding_mb:30",
         "roundup_power2_divisions:[1:4,64:8]", "garbage_collection_threshold:0.5"]


def _all_blocks(a: CachingAllocator):
    seen = {}
    for b in a.live.values():
        seen[id(b)] = b
    for pool in a.pools.values():
        for b in pool.blocks.values():
            seen[id(b)] = b
    for pool in a.unmapped.values():
        for b in pool.blocks.values():
            seen[id(b)] = b
    return list(seen.values())


def check(a: CachingAllocator) -> None:
    blocks = _all_blocks(a)
    assert a.reserved == sum(b.size for b in blocks if b.mapped)
    assert a.allocated == sum(b.size for b in blocks if b.allocated)
    if a.capacity is not None:
        assert a.reserved <= a.capacity
    inactive_split = 0
    for b in blocks:
        if b.next is not None:
            assert b.next.prev is b and b.next.addr == b.addr + b.size  # tiles without gaps
        if b.prev is not None:
            assert b.prev.next is b
        free = not b.allocated and not b.pending
        if free and b.next is not None and not b.next.allocated and not b.next.pending:
            assert b.mapped != b.next.mapped, "free neighbours left unmerged"
        if free and b.mapped:
            key = (b.size << 64) | b.addr
            assert a.pools[(b.is_small, b.stream)].blocks.get(key) is b
            if b.expandable is None and b.is_split:
                inactive_split += b.size
        if not b.mapped:
            assert a.unmapped[(b.is_small, b.stream)].blocks.get(b.addr) is b
    assert a.inactive_split == inactive_split
    assert sum(len(p.keys) for p in a.pools.values()) == sum(1 for b in blocks if b.mapped and not b.allocated
                                                              and not b.pending)


@pytest.mark.parametrize("conf", CONFS)
@pytest.mark.parametrize("capacity", [None, 400 * MiB])
def test_books_balance_on_random_requests(conf, capacity):
    rng = random.Random(zlib.crc32(f"{conf}/{capacity}".encode()))  # stable across processes
    a = CachingAllocator(parse_conf(conf), capacity)
    live, pending = [], []
    next_id = 0
    for step in range(1500):
        a.seq = step
        r = rng.random()
        if r < 0.5 or not live:
            size = int(2 ** rng.uniform(6, 27))  # 64 B .. 128 MiB, log-uniform
            if a.malloc(next_id, size, rng.choice([0, 0, 0, 1])) is not None:
                live.append(next_id)
            next_id += 1
        elif r < 0.85:
            a.free(live.pop(rng.randrange(len(live))))
        elif r < 0.93:
            bid = live.pop(rng.randrange(len(live)))
            a.free_requested(bid)
            pending.append(bid)
        elif r < 0.98 and pending:
            a.free_completed(pending.pop(0))
        else:
            a.empty_cache()
            pending.clear()  # empty_cache waits for every deferred free
        check(a)
    for bid in live:
        a.free(bid)
    for bid in pending:
        a.free_completed(bid)
    a.empty_cache()
    check(a)
    assert a.allocated == 0 and a.reserved == 0 and a.inactive_split == 0
