"""Compact event buffers for the recorder: flat int64 arrays, not Python objects per event.

Each stream is an `array.array('q')` of fixed-width records appended with one `extend` call (atomic
under the GIL, so events from several threads never interleave inside a record). At the end the
stream becomes an (n, width) numpy view without copying. The recorder checks the total against a
byte budget so that a run of millions of ops cannot exhaust memory.
"""
from __future__ import annotations

from array import array

import numpy as np

INT64_BYTES = 8


class Stream:
    """One stream of fixed-width int64 records (e.g. one record per op)."""

    __slots__ = ("name", "width", "data")

    def __init__(self, name: str, width: int):
        self.name = name
        self.width = width
        self.data = array("q")

    def __len__(self) -> int:
        return len(self.data) // self.width

    @property
    def nbytes(self) -> int:
        """Bytes held by the stream's buffer (what was appended; the array may over-allocate ~12%)."""
        return len(self.data) * INT64_BYTES

    def replace(self, table: np.ndarray) -> None:
        """Make the stream hold exactly the records of `table` (n x width, or n values for width 1), as int64
        (a new buffer: views of the old one stay valid)."""
        self.data = array("q")
        self.data.frombytes(np.ascontiguousarray(table, dtype=np.int64).tobytes())

    def to_numpy(self) -> np.ndarray:
        """The records as an (n, width) int64 array (a copy: the stream may go on growing)."""
        # Slice first (one copy, atomic under the GIL), never export the live buffer: a thread still inside
        # an op may append to it, and an array that is exporting its buffer refuses to grow (BufferError).
        n = len(self.data) // self.width
        records = self.data[:n * self.width]
        flat = np.frombuffer(records, dtype=np.int64) if n else np.empty(0, np.int64)
        return flat.reshape(n, self.width)


class EventBuffers:
    """The recorder's streams and its byte budget.

    Streams (widths): ``ops`` (name_idx, ctx, start_ns, end_ns, autograd_seq, access_end),
    ``accesses`` (block_id * 2 + is_write), ``blocks`` (block_id, device_idx, addr, size, alloc_ns,
    alloc_op, allocated_before), ``frees`` (block_id, t_ns), ``marks`` (block_id, category_code,
    op_index, module_idx), ``iter_marks`` (op_index, kind), ``op_stacks`` (stack_id per op, only with stacks),
    ``op_sigs`` (cost-signature number per op, -1 for none; see `memlens.recording.costs`), ``own`` (start, end of
    each stretch of the Python recorder's own work; see `memlens.recording.own_clock`).
    Times are absolute `time.perf_counter_ns()` values; the builder makes them relative.
    """

    OPS_WIDTH = 6

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.ops = Stream("ops", self.OPS_WIDTH)
        self.accesses = Stream("accesses", 1)
        self.blocks = Stream("blocks", 7)
        self.frees = Stream("frees", 2)
        self.marks = Stream("marks", 4)
        self.iter_marks = Stream("iter_marks", 2)
        self.op_stacks = Stream("op_stacks", 1)
        self.op_sigs = Stream("op_sigs", 1)
        self.own = Stream("own", 2)

    def streams(self) -> list[Stream]:
        return [self.ops, self.accesses, self.blocks, self.frees, self.marks, self.iter_marks,
                self.op_stacks, self.op_sigs, self.own]

    @property
    def nbytes(self) -> int:
        """Bytes of event data held now."""
        return sum(s.nbytes for s in self.streams())

    def over_budget(self) -> bool:
        return self.nbytes > self.max_bytes
