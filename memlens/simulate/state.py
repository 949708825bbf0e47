"""The allocator's state in and out: install segments that were reserved before a replay starts (a warm
start rebuilt from a snapshot), and list every block at the end (the picture a snapshot's ``segments``
give, to compare with one)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from memlens.simulate import expandable
from memlens.simulate.blocks import Block

if TYPE_CHECKING:
    from memlens.simulate.caching import CachingAllocator


def blocks_table(alloc: "CachingAllocator") -> list[dict]:
    """Every block of every segment, in address order: segment_addr, addr, size, requested, state
    ("allocated", "pending_free", "inactive" or "unmapped"), pool ("small"/"large"), stream, expandable.
    The same picture as a snapshot's ``segments[*].blocks``."""
    every = list(alloc.live.values())
    every += [b for pool in alloc.pools.values() for b in pool.blocks.values()]
    every += [b for pool in alloc.unmapped.values() for b in pool.blocks.values()]
    rows = []
    head_addr = 0
    for block in sorted(every, key=lambda b: b.addr):  # segments never overlap: heads come first
        prev = block.prev
        if prev is None or (block.expandable is not None and prev.mapped != block.mapped):
            head_addr = block.addr  # an expandable segment shows one segment per mapped range, as torch does
        state = "allocated" if block.allocated else "pending_free" if block.pending else \
            "inactive" if block.mapped else "unmapped"
        rows.append({"segment_addr": head_addr, "addr": block.addr, "size": block.size,
                     "requested": block.requested if block.allocated or block.pending else 0,
                     "state": state, "pool": "small" if block.is_small else "large",
                     "stream": block.stream, "expandable": block.expandable is not None})
    return rows


def _carve(alloc: "CachingAllocator", start: int, end: int, live_blocks, stream: int, is_small: bool,
           segment=None) -> list[Block]:
    """The blocks of the mapped range [start, end): its live blocks (registered as live or pending) and
    free blocks in the gaps between them, in address order."""
    pieces: list[Block] = []
    cursor = start
    for block_id, b_addr, b_size, requested, pending in sorted(live_blocks, key=lambda x: x[1]):
        if b_addr > cursor:
            pieces.append(Block(cursor, b_addr - cursor, stream, is_small, segment))
        block = Block(b_addr, b_size, stream, is_small, segment)
        block.requested = requested
        if pending:
            block.pending = True
            alloc.pending[block_id] = block
        else:
            block.allocated = True
            alloc.allocated += b_size
        alloc.live[block_id] = block
        pieces.append(block)
        cursor = b_addr + b_size
    if cursor < end:
        pieces.append(Block(cursor, end - cursor, stream, is_small, segment))
    alloc.reserved += end - start
    return pieces


def _link_and_cache(alloc: "CachingAllocator", pieces: list[Block]) -> None:
    """Chain neighbouring blocks and put the free ones into their pools."""
    for left, right in zip(pieces, pieces[1:]):
        left.next, right.prev = right, left
    for piece in pieces:
        if not piece.mapped:
            expandable.unmapped_pool(alloc, piece.is_small, piece.stream).add(piece)
        elif piece.is_free:
            alloc.cache_block(piece)
            if piece.is_split and piece.expandable is None:
                alloc.inactive_split += piece.size


def install_segment(alloc: "CachingAllocator", addr: int, size: int, is_small: bool, stream: int,
                    live_blocks: list[tuple[int, int, int, int, bool]]) -> None:
    """Install a segment reserved before the replay starts.

    `live_blocks`: (block_id, addr, size, requested, pending) of the blocks live in it, any order;
    the gaps between them become cached free blocks.
    """
    alloc.space.occupy(addr, size)
    _link_and_cache(alloc, _carve(alloc, addr, addr + size, live_blocks, stream, is_small))


def install_expandable(alloc: "CachingAllocator", base: int, page: int, is_small: bool, stream: int,
                       runs: list[tuple[int, int, list]]) -> None:
    """Install an expandable segment at `base` whose mapped ranges at the start are `runs`:
    (addr, size, live_blocks) each; everything else of its virtual range is unmapped."""
    span = alloc.capacity + alloc.capacity // 8 if alloc.capacity else expandable.DEFAULT_ADDRESS_SPACE
    last_end = max(addr + size for addr, size, _ in runs)
    pages = max(-(-span // page), -(-(last_end - base) // page))
    segment = expandable.ExpandableSegment(base, page, pages)
    alloc.space.occupy(base, pages * page)
    pieces: list[Block] = []
    cursor = base
    for addr, size, live_blocks in sorted(runs, key=lambda r: r[0]):
        if addr > cursor:
            pieces.append(_unmapped(cursor, addr - cursor, stream, is_small, segment))
        pieces += _carve(alloc, addr, addr + size, live_blocks, stream, is_small, segment)
        cursor = addr + size
    if cursor < base + pages * page:
        pieces.append(_unmapped(cursor, base + pages * page - cursor, stream, is_small, segment))
    _link_and_cache(alloc, pieces)


def _unmapped(addr: int, size: int, stream: int, is_small: bool, segment) -> Block:
    block = Block(addr, size, stream, is_small, segment)
    block.mapped = False
    return block
