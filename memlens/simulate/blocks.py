"""The simulator's data structures: blocks, the ordered free pools, and the device address space.

Kept deliberately small and flat (``__slots__``, integer keys, `bisect` on Python lists) because the
replay loop touches them once or more per event and must run at over 100k events per second.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

ADDR_BITS = 64  # free-pool keys are (size << 64) | address: one int orders by (size, address)
# device-memory events, spelled as in a snapshot's device traces
SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP = "segment_alloc", "segment_free", "segment_map", \
    "segment_unmap"


class Block:
    """A contiguous range inside a segment: allocated, free (cached), or unmapped (expandable only)."""

    __slots__ = ("addr", "size", "requested", "stream", "is_small", "allocated", "pending", "prev", "next",
                 "mapped", "expandable", "gc_base")

    def __init__(self, addr: int, size: int, stream: int, is_small: bool, expandable=None):
        self.addr = addr
        self.size = size
        self.requested = 0
        self.stream = stream
        self.is_small = is_small
        self.allocated = False
        self.pending = False  # free requested, waiting for record_stream uses to finish
        self.prev: Block | None = None
        self.next: Block | None = None
        self.mapped = True
        self.expandable = expandable  # the ExpandableSegment it lives in, or None
        self.gc_base = 0  # pool's get_free_block counter when the block was cached (GC age origin)

    @property
    def is_split(self) -> bool:
        """True when the block shares its segment with other blocks."""
        return self.prev is not None or self.next is not None

    @property
    def is_free(self) -> bool:
        """Cached and reusable: not handed out and not awaiting a deferred free."""
        return not self.allocated and not self.pending

    def __repr__(self) -> str:
        state = "alloc" if self.allocated else ("pending" if self.pending else
                                                ("free" if self.mapped else "unmapped"))
        return f"Block({self.addr:#x}, {self.size}, {state}, stream={self.stream})"


class FreePool:
    """Cached blocks of one pool (small or large) on one stream, ordered by (size, address)."""

    __slots__ = ("keys", "blocks")

    def __init__(self):
        self.keys: list[int] = []
        self.blocks: dict[int, Block] = {}

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, block: Block) -> None:
        key = (block.size << ADDR_BITS) | block.addr
        insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block: Block) -> None:
        key = (block.size << ADDR_BITS) | block.addr
        keys = self.keys
        i = bisect_left(keys, key)
        if i < len(keys) and keys[i] == key:
            del keys[i]
            del self.blocks[key]

    def index_at_least(self, size: int) -> int:
        """Index of the smallest cached block with at least `size` bytes (len when none)."""
        return bisect_left(self.keys, size << ADDR_BITS)

    def at(self, index: int) -> Block:
        return self.blocks[self.keys[index]]

    def all_blocks(self) -> list[Block]:
        """Blocks in (size, address) order (a copy: safe to mutate the pool while iterating)."""
        blocks = self.blocks
        return [blocks[k] for k in self.keys]


class UnmappedPool:
    """Unmapped ranges of expandable segments of one pool and stream, ordered by address."""

    __slots__ = ("addrs", "blocks")

    def __init__(self):
        self.addrs: list[int] = []
        self.blocks: dict[int, Block] = {}

    def add(self, block: Block) -> None:
        insort(self.addrs, block.addr)
        self.blocks[block.addr] = block

    def remove(self, block: Block) -> None:
        i = bisect_left(self.addrs, block.addr)
        if i < len(self.addrs) and self.addrs[i] == block.addr:
            del self.addrs[i]
            del self.blocks[block.addr]

    def in_address_order(self) -> list[Block]:
        return [self.blocks[a] for a in self.addrs]


class AddressSpace:
    """Where new segments land in the simulated device's virtual address space.

    Addresses only break ties between equal-sized cached blocks, but those ties decide which block a
    request takes, so a faithful replay of a recording uses the addresses the device really returned:
    `hints` maps a segment size to the recorded addresses of segments of that size, in order. A hint is
    taken when it does not overlap a live segment; otherwise the segment goes above everything.
    """

    def __init__(self, hints: dict[int, list[int]] | None = None, base: int = 1 << 44):
        self._hints = {size: list(reversed(addrs)) for size, addrs in (hints or {}).items()}
        self._top = base
        self._starts: list[int] = []
        self._ends: dict[int, int] = {}

    def _overlaps(self, start: int, end: int) -> bool:
        i = bisect_right(self._starts, start)
        if i > 0 and self._ends[self._starts[i - 1]] > start:
            return True
        return i < len(self._starts) and self._starts[i] < end

    def reserve(self, size: int, alignment: int = 1 << 21) -> int:
        """A start address for a new segment of `size` bytes."""
        hints = self._hints.get(size)
        addr = None
        while hints:
            candidate = hints.pop()
            if not self._overlaps(candidate, candidate + size):
                addr = candidate
                break
        if addr is None:
            addr = -(-self._top // alignment) * alignment
        self.occupy(addr, size)
        return addr

    def occupy(self, addr: int, size: int) -> None:
        """Mark [addr, addr + size) as a live segment (also used for segments present at the start)."""
        insort(self._starts, addr)
        self._ends[addr] = addr + size
        self._top = max(self._top, addr + size)

    def release(self, addr: int) -> None:
        """The segment at `addr` went back to the device."""
        i = bisect_left(self._starts, addr)
        if i < len(self._starts) and self._starts[i] == addr:
            del self._starts[i]
            del self._ends[addr]
