"""A replay of PyTorch's CUDACachingAllocator policy for one device (c10/cuda/CUDACachingAllocator.cpp).

Rules (PyTorch's CUDACachingAllocator): requests are rounded (`round_size`), served from the small pool (<= 1 MiB)
or the large pool, per stream; the smallest cached block that fits is taken (best fit by size, then
address), subject to ``max_split_size`` / ``max_non_split_rounding_size``; otherwise (after garbage
collection when a threshold and a capacity are set) a new segment is reserved, and when the device is full
the oversize cached blocks, then every unsplit cached segment, are released before giving up with an OOM.
Blocks are split when the remainder is worth keeping, the allocation taking the low addresses; freed
blocks merge with free neighbours; ``record_stream`` defers the return of a block to its pool
(``free_requested`` -> ``free_completed``). Expandable segments live in `memlens.simulate.expandable`.

All sizes are bytes. The caller stamps `seq` / `t_ns` before each call so that segment events and OOMs
carry the position of the request that caused them.
"""
from __future__ import annotations

from bisect import bisect_left, insort

from memlens.simulate import expandable
from memlens.simulate.blocks import (
    ADDR_BITS, SEGMENT_ALLOC, SEGMENT_FREE, AddressSpace, Block, FreePool, UnmappedPool,
)
from memlens.simulate.config import (
    K_MIN_BLOCK, K_SMALL_SIZE, UNLIMITED, AllocatorConfig, allocation_size, round_size,
)


class CachingAllocator:
    """State and policy of one device's caching allocator.

    `capacity` (bytes, optional) is the device memory the allocator may reserve: a segment (or, with
    expandable segments, a page mapping) past it fails the way cudaMalloc / cuMemCreate fail on a full
    device, which starts the OOM path. Garbage collection needs it, as torch needs a memory fraction.
    """

    def __init__(self, config: AllocatorConfig, capacity: int | None = None,
                 address_space: AddressSpace | None = None):
        self.config = config
        self.capacity = capacity
        self.space = address_space or AddressSpace()
        self.pools: dict[tuple[bool, int], FreePool] = {}
        self.unmapped: dict[tuple[bool, int], UnmappedPool] = {}
        self.live: dict[int, Block] = {}  # block id -> block (allocated or awaiting a deferred free)
        self.pending: dict[int, Block] = {}  # block id -> block whose free waits on record_stream uses
        self.free_block_calls = {True: 0, False: 0}  # per pool (is_small): get_free_block calls, GC's clock
        self.reserved = 0
        self.allocated = 0
        self.inactive_split = 0
        self.segment_events: list[tuple[int, int, str, int, int]] = []  # (seq, t_ns, action, addr, size)
        self.ooms: list[dict] = []
        self.seq = 0
        self.t_ns = 0
        self._max_split = config.max_split_size
        self._plain_rounding = not any(config.roundup_power2_divisions)
        self._gc_on = config.garbage_collection_threshold > 0 and capacity is not None

    # ---- requests ------------------------------------------------------------------------------
    def malloc(self, block_id: int, requested: int, stream: int) -> Block | None:
        """Serve a request of `requested` bytes on `stream`; returns the block, or None after an OOM."""
        if self._plain_rounding:
            size = K_MIN_BLOCK if requested < K_MIN_BLOCK else -(-requested // K_MIN_BLOCK) * K_MIN_BLOCK
        else:
            size = round_size(requested, self.config)
        is_small = size <= K_SMALL_SIZE
        block = self._get_free_block(size, is_small, stream)
        if block is None:
            if self._gc_on:
                self._garbage_collect()
            block = self._alloc_block(size, is_small, stream)
            if block is None and self._release_available_cached_blocks(size, is_small, stream):
                block = self._alloc_block(size, is_small, stream)
            if block is None:
                self.release_cached_blocks()
                block = self._alloc_block(size, is_small, stream)
            if block is None:
                self.ooms.append({"seq": self.seq, "t_ns": self.t_ns, "requested": requested, "size": size,
                                  "alloc_size": allocation_size(size), "stream": stream,
                                  "reserved": self.reserved, "allocated": self.allocated})
                return None
        return self._alloc_found_block(block, block_id, size, requested, stream, is_small)

    def free_requested(self, block_id: int) -> None:
        """The program dropped the block; with record_stream uses it stays active until completed."""
        block = self.live.get(block_id)
        if block is None or not block.allocated:
            return
        block.allocated = False
        block.pending = True
        self.allocated -= block.size
        self.pending[block_id] = block

    def free_completed(self, block_id: int) -> None:
        """The block's last stream use finished: it returns to its pool and merges with free neighbours."""
        block = self.live.pop(block_id, None)
        if block is None:
            return
        if block.allocated:  # completion seen without its request
            block.allocated = False
            self.allocated -= block.size
        self.pending.pop(block_id, None)
        block.pending = False
        self._free_block(block)

    def free(self, block_id: int) -> None:
        """An immediate free (no record_stream uses): request and completion at once."""
        block = self.live.pop(block_id, None)
        if block is None:
            return
        if block.allocated:
            block.allocated = False
            self.allocated -= block.size
        else:
            self.pending.pop(block_id, None)
            block.pending = False
        self._free_block(block)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: return every unsplit cached segment (and free pages) to the device."""
        self.release_cached_blocks()

    # ---- finding and carving blocks -------------------------------------------------------------
    def _pool(self, is_small: bool, stream: int) -> FreePool:
        pool = self.pools.get((is_small, stream))
        if pool is None:
            pool = self.pools[(is_small, stream)] = FreePool()
        return pool

    def cache_block(self, block: Block) -> None:
        """Put a block into its free pool, starting its GC age."""
        block.gc_base = self.free_block_calls[block.is_small]
        self._pool(block.is_small, block.stream).add(block)

    def _get_free_block(self, size: int, is_small: bool, stream: int) -> Block | None:
        if self._gc_on:
            self.free_block_calls[is_small] += 1
        pool = self.pools.get((is_small, stream))
        if not pool:
            return None
        keys = pool.keys
        n = len(keys)
        i = bisect_left(keys, size << ADDR_BITS)
        if i == n:
            return None
        block = pool.blocks[keys[i]]
        if block.expandable is not None:
            if self.config.expandable_segments:
                i, block = expandable.best_fit_by_expandable_size(pool, i, block)
            else:  # expandable segments turned off: only ordinary segments may serve the request
                while i < n and pool.at(i).expandable is not None:
                    i += 1
                if i == n:
                    return None
                block = pool.at(i)
        max_split = self._max_split
        if max_split != UNLIMITED:
            if size < max_split and block.size >= max_split:
                return None  # never hand out an oversize block for a request that could be split
            if size >= max_split and block.size >= size + self.config.max_non_split_rounding_size:
                return None  # an oversize block may be rounded up only by a bounded amount
        del pool.blocks[keys[i]]
        del keys[i]
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.is_small or self.config.expandable_segments:
            return remaining >= K_MIN_BLOCK
        return size < self._max_split and remaining > K_SMALL_SIZE

    def _alloc_found_block(self, block: Block, block_id: int, size: int, requested: int, stream: int,
                           is_small: bool) -> Block:
        already_split = block.is_split
        if self._should_split(block, size):
            remaining = block
            block = Block(remaining.addr, size, stream, is_small, remaining.expandable)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += size
            remaining.size -= size
            remaining.gc_base = self.free_block_calls[is_small]
            pool = self.pools.get((is_small, stream)) or self._pool(is_small, stream)
            key = (remaining.size << ADDR_BITS) | remaining.addr
            insort(pool.keys, key)
            pool.blocks[key] = remaining
            if remaining.expandable is None:
                self.inactive_split += -size if already_split else remaining.size
        elif already_split and block.expandable is None:
            self.inactive_split -= block.size
        block.allocated = True
        block.requested = requested
        self.allocated += block.size
        self.live[block_id] = block
        return block

    def _alloc_block(self, size: int, is_small: bool, stream: int) -> Block | None:
        """Reserve new device memory for a rounded request of `size` bytes (a segment, or pages)."""
        if self.config.expandable_segments:
            return expandable.try_allocate(self, size, is_small, stream)
        alloc_size = allocation_size(size)
        if self.capacity is not None and self.reserved + alloc_size > self.capacity:
            return None
        addr = self.space.reserve(alloc_size)
        self.reserved += alloc_size
        self.segment_events.append((self.seq, self.t_ns, SEGMENT_ALLOC, addr, alloc_size))
        return Block(addr, alloc_size, stream, is_small)

    # ---- returning blocks -----------------------------------------------------------------------
    def _free_block(self, block: Block) -> None:
        pool = self.pools.get((block.is_small, block.stream))
        if pool is None:
            pool = self._pool(block.is_small, block.stream)
        keys, blocks = pool.keys, pool.blocks
        net_size = 0
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated and not prev.pending and prev.mapped == block.mapped:
            if prev.mapped:  # inline of try_merge(block, prev) for the common case
                key = (prev.size << ADDR_BITS) | prev.addr
                del keys[bisect_left(keys, key)]
                del blocks[key]
                block.addr = prev.addr
                block.prev = prev.prev
                if block.prev is not None:
                    block.prev.next = block
                block.size += prev.size
                net_size -= prev.size
            else:
                net_size -= self.try_merge(block, prev)
        if nxt is not None and not nxt.allocated and not nxt.pending and nxt.mapped == block.mapped:
            if nxt.mapped:
                key = (nxt.size << ADDR_BITS) | nxt.addr
                del keys[bisect_left(keys, key)]
                del blocks[key]
                block.next = nxt.next
                if block.next is not None:
                    block.next.prev = block
                block.size += nxt.size
                net_size -= nxt.size
            else:
                net_size -= self.try_merge(block, nxt)
        block.gc_base = self.free_block_calls[block.is_small]
        key = (block.size << ADDR_BITS) | block.addr
        insort(keys, key)
        blocks[key] = block
        if block.prev is not None or block.next is not None:
            net_size += block.size
        if block.expandable is None:
            self.inactive_split += net_size

    def try_merge(self, dst: Block, src: Block | None) -> int:
        """Absorb free neighbour `src` into `dst`; returns the bytes absorbed (0 when not mergeable)."""
        if src is None or src.allocated or src.pending or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            self.pools[(src.is_small, src.stream)].remove(src)
        else:
            self.unmapped[(src.is_small, src.stream)].remove(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _release_block(self, block: Block) -> None:
        """cudaFree a whole cached segment."""
        self.pools[(block.is_small, block.stream)].remove(block)
        self.reserved -= block.size
        self.space.release(block.addr)
        self.segment_events.append((self.seq, self.t_ns, SEGMENT_FREE, block.addr, block.size))

    def _finish_pending_frees(self) -> None:
        """Wait for every record_stream use (torch synchronizes its events before releasing memory)."""
        for block_id, block in list(self.pending.items()):
            del self.live[block_id]
            block.pending = False
            self._free_block(block)
        self.pending.clear()

    def release_cached_blocks(self) -> None:
        """Release every unsplit cached segment of both pools (large first), and unmap free pages."""
        self._finish_pending_frees()
        for key in sorted(self.pools, key=lambda k: (k[0], k[1])):
            to_unmap = []
            for block in self.pools[key].all_blocks():
                if block.expandable is not None:
                    to_unmap.append(block)
                elif block.prev is None and block.next is None:
                    self._release_block(block)
            for block in to_unmap:
                expandable.unmap_block(self, block)

    def _release_available_cached_blocks(self, size: int, is_small: bool, stream: int) -> bool:
        """Release oversize cached blocks (>= max_split_size) until `size` bytes could fit."""
        max_split = self._max_split
        pool = self.pools.get((is_small, stream))
        if max_split == UNLIMITED or not pool:
            return False
        target = max(size, max_split)
        i = pool.index_at_least(target)
        if i < len(pool.keys):
            block = pool.at(i)
            if block.expandable is None and not block.is_split:
                self._release_block(block)
                return True
        # no single cached block is large enough: release oversize blocks, largest first
        released = 0
        i -= 1
        while released < target and i >= 0:
            block = pool.at(i)
            if block.size < max_split:
                break
            if not block.is_split and block.expandable is None:
                released += block.size
                self._release_block(block)
            i -= 1
        return released >= target

    def _garbage_collect(self) -> None:
        """Free unsplit large cached blocks older than the mean age until reserved <= threshold x capacity."""
        threshold = int(self.config.garbage_collection_threshold * self.capacity)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        clock = self.free_block_calls[False]
        large = [p for (small, _), p in sorted(self.pools.items()) if not small]
        candidates = [b for p in large for b in p.all_blocks() if not b.is_split and b.expandable is None]
        if not candidates:
            return
        total_age = sum(clock - b.gc_base for b in candidates)
        count = len(candidates)
        reclaimed = 0
        freed_any = True
        while reclaimed < target and freed_any and count > 0:
            mean_age = total_age / count
            freed_any = False
            for block in [b for p in large for b in p.all_blocks()]:
                if block.is_split or block.expandable is not None or clock - block.gc_base < mean_age:
                    continue
                freed_any = True
                reclaimed += block.size
                total_age -= clock - block.gc_base
                count -= 1
                self._release_block(block)
