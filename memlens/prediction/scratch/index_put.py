"""Which temporaries CUDA's sorted accumulate in ``index_put`` takes from the caching allocator, in order
(sources: PyTorch 2.x ``aten/src/ATen/native/cuda/Indexing.cu``, ``ATen/cuda/cub.cuh``).

**Sorted accumulate of ``index_put`` with ``accumulate=True``** (or any ``index_put`` under
``torch.use_deterministic_algorithms(True)``): on CUDA ``_index_put_impl_`` runs ``index_put_with_sort_kernel``,
which (integer index tensors, broadcast to N elements):

1. when the range is checked (not ``unsafe``: a user's ``x.index_put_(..., accumulate=True)``): per index tensor
   ``index.max()`` and ``index.min()`` (8-byte scalars, read back with ``.item()`` and freed);
2. ``makeLinearIndex``: int32 index tensors are first converted to int64 (N x 8 bytes, kept for the kernel); per
   index tensor ``index.remainder(dim_size)`` (N x 8) times the dimension's stride (N x 8), the remainder freed;
   the first product is the linear index, later ones are added to it in place and freed;
3. when the indexed tensor is not contiguous or the indexed dimensions are not adjacent (ATen transposes them
   to the front): ``src.contiguous()``, a copy of the whole tensor, written back at the end;
4. ``sorted_indices`` and ``orig_indices`` (N x 8 each), ``range = arange(N)`` (N x 8);
5. cub's radix sort of (linear index, range) pairs: ``radix_sort_pairs`` asks cub for its temp-storage size
   and allocates exactly that from the caching allocator (``CUB_WRAPPER``). For N within one tile cub's
   single-tile path asks for 1 byte (cub ``DispatchRadixSort::InvokeSingleTile``); the tile is the
   single-tile policy's 256 threads x 19 nominal 4-byte items, scaled to the 8-byte key/value (9 items):
   2,304 items. Larger sorts run the multi-pass path, whose temp storage holds alternate key and value
   buffers (N x 8 each) plus per-pass histograms; memlens counts the two buffers (a lower bound, marked
   ``estimate`` in the block's op name).
6. the temporaries are freed in reverse: range, orig_indices, sorted_indices, the linear index.

The embedding-style lookup ``weight[ids]`` has this in its backward (``index_backward`` calls
``_index_put_impl_(..., accumulate=True, unsafe=True)``), so a language model's training step has one per
lookup. Checked against the real cs336 training snapshot (512 token ids): 4096, 4096 (remainder freed),
4096, 4096, 4096, 1 bytes, in that order (``tests/integration/test_predict_cuda_kernels.py``).
"""
from __future__ import annotations

import math

import pandas as pd

from memlens.prediction.scratch.blocks import events_to_blocks, next_block_id

SINGLE_TILE_ITEMS_8B = 256 * 9     # cub single-tile radix sort, 8-byte keys and values (module docstring)


def index_put_sort_facts(func, args, kwargs) -> tuple | None:
    """What the sorted-accumulate CUDA path of an ``index_put`` call depends on, from its fake operands:
    (N index elements, number of int32 index tensors, number of index tensors, unsafe flag or None when
    the op has none, copy bytes of a non-contiguous / transposed ``self`` (0 if none)). None when the call
    does not take that path (no accumulate, not deterministic) or is outside the model (masks, empty)."""
    import torch
    name = func.__name__ if hasattr(func, "__name__") else str(func)
    accumulate = args[3] if len(args) > 3 else (kwargs or {}).get("accumulate", False)
    if not accumulate and not torch.are_deterministic_algorithms_enabled():
        return None
    self, indices = args[0], args[1]
    if not isinstance(self, torch.Tensor) or self.device.type != "cuda":
        return None
    unsafe = None
    if name.startswith("_index_put_impl_"):
        unsafe = bool(args[4] if len(args) > 4 else (kwargs or {}).get("unsafe", False))
    elif name.startswith("_unsafe_index_put"):
        unsafe = True
    shapes, positions, n_int32 = [], [], 0
    for pos, idx in enumerate(indices):
        if idx is None:
            continue
        if idx.dtype in (torch.bool, torch.uint8):
            return None       # masks: nonzero() of data-dependent size, not modelled
        if idx.dtype == torch.int32:
            n_int32 += 1
        shapes.append(tuple(idx.shape))
        positions.append(pos)
    if not shapes:
        return None
    n = math.prod(torch.broadcast_shapes(*shapes))
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    last = positions[-1] if adjacent else len(positions) - 1
    slice_size = math.prod(self.shape[last + 1:]) if adjacent else \
        math.prod(s for i, s in enumerate(self.shape) if i not in positions)
    if n == 0 or slice_size == 0:
        return None
    permuted = (not adjacent) or not self.is_contiguous()
    copy_bytes = self.numel() * self.element_size() if permuted else 0
    return (int(n), n_int32, len(shapes), unsafe, int(copy_bytes))


def cub_sort_pairs_temp_bytes(n: int, key_bytes: int = 8, value_bytes: int = 8) -> tuple[int, bool]:
    """cub ``DeviceRadixSort::SortPairs`` temp storage for `n` (8-byte key, 8-byte value) pairs, bytes, and
    whether the figure is exact (single tile: 1 byte) or a lower bound (the two alternate buffers)."""
    if n <= SINGLE_TILE_ITEMS_8B:
        return 1, True
    return n * key_bytes + n * value_bytes, False


def index_put_sort_events(n: int, n_int32: int, n_indices: int, unsafe: bool, copy_bytes: int) -> list:
    """The temporaries of one ``index_put_with_sort_kernel`` call in the order CUDA allocates and frees them:
    a list of ("alloc", key, bytes, what) / ("free", key) (see the module docstring for the source)."""
    ev: list = []
    live_linear = None
    for i in range(n_int32):
        ev.append(("alloc", f"long{i}", n * 8, "index_put sort: int32 index as int64"))
    for i in range(n_indices):
        if not unsafe:
            ev += [("alloc", f"max{i}", 8, "index_put sort: index.max() range check"), ("free", f"max{i}"),
                   ("alloc", f"min{i}", 8, "index_put sort: index.min() range check"), ("free", f"min{i}")]
        ev.append(("alloc", f"rem{i}", n * 8, "index_put sort: index.remainder(size)"))
        ev.append(("alloc", f"lin{i}", n * 8, "index_put sort: linear index (index * stride)"))
        ev.append(("free", f"rem{i}"))
        if live_linear is None:
            live_linear = f"lin{i}"
        else:
            ev.append(("free", f"lin{i}"))     # added into the first one in place
    if copy_bytes:
        ev.append(("alloc", "src", copy_bytes, "index_put sort: self.contiguous() (permuted)"))
    ev.append(("alloc", "sorted", n * 8, "index_put sort: sorted_indices"))
    ev.append(("alloc", "orig", n * 8, "index_put sort: orig_indices"))
    ev.append(("alloc", "range", n * 8, "index_put sort: arange(N)"))
    temp, exact = cub_sort_pairs_temp_bytes(n)
    ev.append(("alloc", "cub", temp, "cub radix_sort_pairs temp storage" + ("" if exact else " (estimate)")))
    ev.append(("free", "cub"))
    ev += [("free", "range"), ("free", "orig"), ("free", "sorted"), ("free", live_linear)]
    if copy_bytes:
        ev.append(("free", "src"))
    for i in range(n_int32):
        ev.append(("free", f"long{i}"))
    return ev


def sort_scratch_blocks(trace, facts: dict, round_size) -> list[dict]:
    """Block rows for every recorded sorted-accumulate ``index_put`` (`facts`: op_id -> index_put_sort_facts).
    An out-of-place ``aten::index_put`` in backward is autograd's ``index_backward`` on subclass tensors, which
    a real run executes as ``_index_put_impl_(unsafe=True)``; elsewhere the public ops check the range."""
    if not facts:
        return []
    ops = trace.ops.set_index("op_id", drop=False)
    phase = ops["phase"] if "phase" in ops.columns else pd.Series("", index=ops.index)
    next_id = next_block_id(trace)
    rows: list[dict] = []
    for op_id, (n, n_int32, n_indices, unsafe, copy_bytes) in sorted(facts.items()):
        if op_id not in ops.index:
            continue
        op = ops.loc[op_id]
        if unsafe is None:
            unsafe = str(op["name"]) == "aten::index_put" and phase.loc[op_id] == "backward"
        events = index_put_sort_events(n, n_int32, n_indices, unsafe, copy_bytes)
        new = events_to_blocks(events, op, next_id + len(rows), round_size)
        rows += new
    return rows
