"""Expandable segments (``expandable_segments:True``): one virtual range per (pool, stream), backed by
physical pages mapped on demand — 2 MiB pages for the small pool, 20 MiB for the large pool.

Reserved memory is the mapped pages. A request first looks for the lowest address where free mapped
bytes plus unmapped address space can hold it, maps just the pages needed there, and merges them with the
free block before; releasing (the allocator's cache release, also its OOM path) unmaps every whole page
of free blocks. Functions here operate on the caching allocator's state through `AllocatorState`, so this
module depends only on the block structures below it and the allocator imports it, not the reverse.
"""
from __future__ import annotations

from typing import Protocol

from memlens.simulate.blocks import SEGMENT_MAP, SEGMENT_UNMAP, AddressSpace, Block, FreePool, UnmappedPool
from memlens.simulate.config import K_LARGE_BUFFER, K_SMALL_BUFFER

# virtual range of one expandable segment when no capacity is given (torch reserves 1.125 x device memory)
DEFAULT_ADDRESS_SPACE = 1 << 40


class ExpandableSegment:
    """The virtual range: base address, page size and page count (bytes)."""

    __slots__ = ("base", "page", "pages")

    def __init__(self, base: int, page: int, pages: int):
        self.base = base
        self.page = page
        self.pages = pages


class AllocatorState(Protocol):
    """What expandable segments read and change of the caching allocator (sizes in bytes, times in ns)."""

    pools: dict[tuple[bool, int], FreePool]  # cached free blocks per (is_small, stream)
    unmapped: dict[tuple[bool, int], UnmappedPool]  # unmapped ranges per (is_small, stream)
    space: AddressSpace
    capacity: int | None  # device memory, bytes; None = unlimited
    reserved: int  # mapped bytes
    seq: int  # index of the request being served
    t_ns: int  # time of the request being served
    segment_events: list[tuple[int, int, str, int, int]]  # (seq, t_ns, action, address, bytes)

    def try_merge(self, dst: Block, src: Block | None) -> int: ...

    def cache_block(self, block: Block) -> None: ...


def _splice(block: Block, before: Block | None, after: Block | None) -> None:
    block.prev = before
    if before is not None:
        before.next = block
    block.next = after
    if after is not None:
        after.prev = block


def unmapped_pool(alloc: AllocatorState, is_small: bool, stream: int) -> UnmappedPool:
    pool = alloc.unmapped.get((is_small, stream))
    if pool is None:
        pool = alloc.unmapped[(is_small, stream)] = UnmappedPool()
    return pool


def best_fit_by_expandable_size(pool: FreePool, i: int, block: Block) -> tuple[int, Block]:
    """Among cached blocks from index `i` on, prefer by the size a block could grow to (its bytes plus an
    unmapped range right after it), as torch does for blocks of expandable segments."""

    def growable(b: Block) -> int:
        nxt = b.next
        return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

    n = len(pool.keys)
    while block.expandable is not None and i + 1 < n:
        candidate = pool.at(i + 1)
        if growable(candidate) >= growable(block):
            break
        i += 1
        block = candidate
    return i, block


def _has_room(block: Block | None, size: int) -> bool:
    """Free mapped plus unmapped bytes from `block` on reach `size`."""
    total = 0
    while total < size and block is not None and not block.allocated and not block.pending:
        total += block.size
        block = block.next
    return total >= size


def _find_expandable_block(alloc: AllocatorState, size: int, is_small: bool, stream: int) -> Block:
    """The lowest-address place with room for `size` bytes, creating a new virtual segment if needed."""
    unmapped = unmapped_pool(alloc, is_small, stream)
    for candidate in unmapped.in_address_order():
        prev = candidate.prev
        if prev is not None and not prev.allocated and not prev.pending:
            candidate = prev
        if _has_room(candidate, size):
            return candidate
    page = K_SMALL_BUFFER if is_small else K_LARGE_BUFFER
    span = alloc.capacity + alloc.capacity // 8 if alloc.capacity else DEFAULT_ADDRESS_SPACE
    pages = max(1, -(-span // page))
    base = alloc.space.reserve(pages * page, alignment=page)
    segment = ExpandableSegment(base, page, pages)
    block = Block(base, pages * page, stream, is_small, segment)
    block.mapped = False
    unmapped.add(block)
    return block


def _map_block(alloc: AllocatorState, to_map: Block, size: int) -> bool:
    """Map the pages covering the first `size` bytes of unmapped block `to_map`; False when memory is full."""
    segment = to_map.expandable
    page = segment.page
    begin = (to_map.addr - segment.base) // page
    end = -(-(to_map.addr + size - segment.base) // page)
    nbytes = (end - begin) * page
    if alloc.capacity is not None and alloc.reserved + nbytes > alloc.capacity:
        return False
    unmapped = alloc.unmapped[(to_map.is_small, to_map.stream)]
    unmapped.remove(to_map)
    to_map.mapped = True
    if nbytes < to_map.size:
        rest = Block(to_map.addr + nbytes, to_map.size - nbytes, to_map.stream, to_map.is_small, segment)
        rest.mapped = False
        _splice(rest, to_map, to_map.next)
        unmapped.add(rest)
        to_map.size = nbytes
    mapped_addr = to_map.addr
    alloc.try_merge(to_map, to_map.prev)
    alloc.try_merge(to_map, to_map.next)
    alloc.cache_block(to_map)
    alloc.reserved += nbytes
    alloc.segment_events.append((alloc.seq, alloc.t_ns, SEGMENT_MAP, mapped_addr, nbytes))
    return True


def try_allocate(alloc: AllocatorState, size: int, is_small: bool, stream: int) -> Block | None:
    """Grow (or create) an expandable segment so that one free block holds `size` bytes; the block is
    returned out of its pool, ready to be split and handed out. None when the pages cannot be mapped."""
    candidate = _find_expandable_block(alloc, size, is_small, stream)
    if not candidate.mapped and not _map_block(alloc, candidate, min(candidate.size, size)):
        return None
    while candidate.size < size:
        following = candidate.next
        if not _map_block(alloc, following, min(size - candidate.size, following.size)):
            return None
        candidate = following  # the newly mapped block absorbed the candidate
    alloc.pools[(is_small, stream)].remove(candidate)
    return candidate


def unmap_block(alloc: AllocatorState, block: Block) -> None:
    """Return the whole pages inside free block `block` to the device; drop the segment when empty."""
    segment = block.expandable
    page = segment.page
    begin = -(-(block.addr - segment.base) // page)
    end = (block.addr + block.size - segment.base) // page
    if begin < end:
        pool = alloc.pools[(block.is_small, block.stream)]
        pool.remove(block)
        start = segment.base + begin * page
        nbytes = (end - begin) * page
        before = start - block.addr
        if before > 0:
            head = Block(block.addr, before, block.stream, block.is_small, segment)
            _splice(head, block.prev, block)
            alloc.cache_block(head)
        after = block.size - before - nbytes
        if after > 0:
            tail = Block(start + nbytes, after, block.stream, block.is_small, segment)
            _splice(tail, block, block.next)
            alloc.cache_block(tail)
        block.addr = start
        block.size = nbytes
        block.mapped = False
        alloc.try_merge(block, block.prev)
        alloc.try_merge(block, block.next)
        unmapped_pool(alloc, block.is_small, block.stream).add(block)
        alloc.reserved -= nbytes
        alloc.segment_events.append((alloc.seq, alloc.t_ns, SEGMENT_UNMAP, start, nbytes))
    if block.prev is None and block.next is None and not block.mapped:
        alloc.unmapped[(block.is_small, block.stream)].remove(block)
        alloc.space.release(segment.base)
