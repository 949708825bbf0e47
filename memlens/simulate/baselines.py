"""Allocators to compare the caching allocator with, replaying the same requests and reporting the same
measures (reserved = memory taken from the device, allocated = bytes handed to the program).

- `DeviceMalloc`: no caching; every request is its own cudaMalloc, every free a cudaFree
  (what ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` does). Reserved equals allocated.
- `BestFitHeap`: one contiguous heap without segments; best-fit holes (smallest, then lowest address),
  coalescing on free, the heap top shrinking when its last block is freed. Reserved is the heap top.
- `BumpArena`: allocations are stacked upwards and only reclaimed when every block is free (or a free
  block is at the top). Reserved is the bump pointer.

Requests are rounded to 512 bytes as cudaMalloc aligns them. A request past `capacity` is an OOM.
"""
from __future__ import annotations

from bisect import bisect_left, insort

ALIGN = 512


def _aligned(size: int) -> int:
    return ALIGN if size < ALIGN else -(-size // ALIGN) * ALIGN


class _Baseline:
    """Shared bookkeeping: live blocks, counters, OOMs, segment events, deferred frees."""

    name = "baseline"

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.live: dict[int, tuple[int, int]] = {}  # block id -> (addr, size)
        self.pending: set[int] = set()
        self.reserved = 0
        self.allocated = 0
        self.inactive_split = 0
        self.segment_events: list[tuple[int, int, str, int, int]] = []
        self.ooms: list[dict] = []
        self.seq = 0
        self.t_ns = 0

    def _oom(self, requested: int, size: int, stream: int) -> None:
        self.ooms.append({"seq": self.seq, "t_ns": self.t_ns, "requested": requested, "size": size,
                          "alloc_size": size, "stream": stream, "reserved": self.reserved,
                          "allocated": self.allocated})

    def malloc(self, block_id: int, requested: int, stream: int):
        size = _aligned(requested)
        addr = self._place(size)
        if addr is None:
            self._oom(requested, size, stream)
            return None
        self.live[block_id] = (addr, size)
        self.allocated += size
        return addr

    def free_requested(self, block_id: int) -> None:
        if block_id in self.live and block_id not in self.pending:
            self.pending.add(block_id)
            self.allocated -= self.live[block_id][1]

    def free_completed(self, block_id: int) -> None:
        entry = self.live.pop(block_id, None)
        if entry is None:
            return
        if block_id in self.pending:
            self.pending.discard(block_id)
        else:
            self.allocated -= entry[1]
        self._release(*entry)

    free = free_completed

    def empty_cache(self) -> None:
        """Nothing is cached by these allocators."""
        return None


class DeviceMalloc(_Baseline):
    name = "malloc"

    def __init__(self, capacity: int | None = None):
        super().__init__(capacity)
        self._next_addr = 1 << 44

    def _place(self, size: int) -> int | None:
        if self.capacity is not None and self.reserved + size > self.capacity:
            return None
        addr = self._next_addr
        self._next_addr += size
        self.reserved += size
        self.segment_events.append((self.seq, self.t_ns, "segment_alloc", addr, size))
        return addr

    def _release(self, addr: int, size: int) -> None:
        self.reserved -= size
        self.segment_events.append((self.seq, self.t_ns, "segment_free", addr, size))


class BestFitHeap(_Baseline):
    name = "bestfit"

    def __init__(self, capacity: int | None = None):
        super().__init__(capacity)
        self._holes: list[tuple[int, int]] = []  # (size, addr), sorted
        self._hole_at: dict[int, int] = {}  # addr -> size
        self._hole_end: dict[int, int] = {}  # end addr -> start addr

    def _add_hole(self, addr: int, size: int) -> None:
        insort(self._holes, (size, addr))
        self._hole_at[addr] = size
        self._hole_end[addr + size] = addr

    def _drop_hole(self, addr: int) -> int:
        size = self._hole_at.pop(addr)
        del self._hole_end[addr + size]
        del self._holes[bisect_left(self._holes, (size, addr))]
        return size

    def _place(self, size: int) -> int | None:
        i = bisect_left(self._holes, (size, -1))
        if i < len(self._holes):
            hole_size, addr = self._holes[i]
            self._drop_hole(addr)
            if hole_size > size:
                self._add_hole(addr + size, hole_size - size)
            return addr
        if self.capacity is not None and self.reserved + size > self.capacity:
            return None
        addr = self.reserved
        self.reserved += size
        return addr

    def _release(self, addr: int, size: int) -> None:
        if addr + size in self._hole_at:  # merge with the hole after
            size += self._drop_hole(addr + size)
        start = self._hole_end.get(addr)
        if start is not None:  # merge with the hole before
            size += self._drop_hole(start)
            addr = start
        if addr + size == self.reserved:  # the heap top shrinks
            self.reserved = addr
        else:
            self._add_hole(addr, size)


class BumpArena(_Baseline):
    name = "bump"

    def __init__(self, capacity: int | None = None):
        super().__init__(capacity)
        self._top_blocks: list[tuple[int, int]] = []  # stack of (addr, size) still occupying the arena
        self._freed: set[int] = set()  # addresses freed but below the top

    def _place(self, size: int) -> int | None:
        if self.capacity is not None and self.reserved + size > self.capacity:
            return None
        addr = self.reserved
        self.reserved += size
        self._top_blocks.append((addr, size))
        return addr

    def _release(self, addr: int, size: int) -> None:
        self._freed.add(addr)
        stack = self._top_blocks
        while stack and stack[-1][0] in self._freed:  # pop freed blocks off the top
            top_addr, _ = stack.pop()
            self._freed.discard(top_addr)
            self.reserved = top_addr


BASELINES = {cls.name: cls for cls in (DeviceMalloc, BestFitHeap, BumpArena)}
