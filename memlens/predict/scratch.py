"""Scratch memory that fake tensors never see: CUDA kernels' own temporaries, added as transient blocks, and
the cuBLAS workspaces, added as blocks held to the end.

A fake tensor runs an op's meta kernel, which allocates the outputs and nothing else. On a real GPU some
CUDA kernels also take temporaries from the caching allocator while they run (and free them before they
return); the allocator replay must see those too (they take cached blocks and can grow a segment). Each
modelled temporary is a block with ``source == "predict:model"`` and ``op`` naming what it stands for,
allocated and freed inside the op's interval, in the order the CUDA code allocates them.

Modelled (sources: PyTorch 2.x ``aten/src/ATen/native/cuda/Indexing.cu``, ``ATen/cuda/cub.cuh``, ``Reduce.cuh``):

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
4096, 4096, 4096, 1 bytes, in that order (``tests/test_predict.py``).

**cuDNN convolution workspaces: an allowance, off by default.** The workspace of a cuDNN convolution depends on
the algorithm cuDNN picks for that shape, GPU and cuDNN version (heuristics, or ``cudnn.benchmark``'s timed
search, which PyTorch lets use as much memory as the allocator can still give), so it cannot be known without
the GPU: from 0 bytes (implicit GEMM) to gigabytes (FFT / Winograd variants). There is no defensible default,
so none is added unless asked: ``memlens.predict(..., cudnn_workspace=BYTES)`` adds one transient block of
BYTES inside every convolution op (forward, and backward: its grad-input and grad-weight cuDNN calls run one
after the other, so one allowance covers both, the second reusing the first's cached block), or
``cudnn_workspace=fn`` with ``fn(op_row) -> bytes`` (the op's ``name`` and ``shapes``) per call. A
measured value from a real run of the same shapes (``torch.cuda.memory_stats`` around one conv) is the right
input. PyTorch sets no workspace cap of its own; frameworks that do chose very different ones (Caffe2's
``kCONV_CUDNN_WORKSPACE_LIMIT_BYTES`` 64 MiB, PaddlePaddle's ``FLAGS_conv_workspace_size_limit`` 512 MiB), which is
a range to try, not a default.

**CUDA reductions' global staging buffer and semaphores** (``aten/src/ATen/native/cuda/Reduce.cuh``): when
``setReduceConfig`` splits each output's inputs across several CTAs (ctas_per_output > 1, decided from the
TensorIterator layout, the block shape and the GPU's SM count and threads per SM: `reduce_global_bytes`),
``gpu_reduce_kernel`` takes ``global_memory_size()`` bytes and then ``semaphore_size()`` bytes from the caching
allocator for the launch and frees them after it. Applied to sum / mean / prod / amax / amin /
linalg_vector_norm (float accumulator; double for fp64) and max/min with ``dim`` / argmax / argmin (value + int64
index pairs, 16 bytes). Reproduces the issue's real 157 MiB row-max buffer (tests/test_predict.py); the cs336
runs need none, as their snapshots show.

**cuBLAS workspaces**: cuBLAS takes one workspace per (thread, stream) from the caching allocator at the
first GEMM there and keeps it (`cublas_workspace_blocks`; its size per GPU generation is in `gpus.py`).

Not modelled: boolean-mask indices (data-dependent ``nonzero``), broadcast ``values`` copies, sort / argsort /
topk / unique's own cub or segmented-sort temporaries, reductions' ``acc_buf`` (only for > 2^31-element inputs
split into sub-iterators), multi-output reductions (var_mean, aminmax, std/var's Welford), wider-than-4 vector
loads some half/bf16 reductions use.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

SINGLE_TILE_ITEMS_8B = 256 * 9     # cub single-tile radix sort, 8-byte keys and values (module docstring)
MODEL_SOURCE = "predict:model"


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


def events_to_blocks(events: list, op, first_id: int, round_size) -> list[dict]:
    """Block rows for `events` of op `op` (an ops-table row: op_id, start_ns, end_ns, module, thread), with
    times spread inside the op's interval in event order; sizes rounded with `round_size`."""
    start, end = int(op.start_ns), int(op.end_ns)
    step = max(1, (end - start) // (len(events) + 1))
    rows: dict[str, dict] = {}
    for k, e in enumerate(events):
        t = start + (k + 1) * step
        if e[0] == "alloc":
            _, key, size, what = e
            rows[key] = {"block_id": first_id + len(rows), "device": "cuda:0", "addr": pd.NA,
                         "size": int(round_size(int(size))), "requested_size": int(size), "alloc_ns": t,
                         "free_ns": pd.NA, "category": "temporary", "op": f"{what} (modelled)",
                         "alloc_op_id": int(op.op_id), "module": op.module, "stream": 0,
                         "allocated_before": False, "free_without_alloc": False, "source": MODEL_SOURCE}
        else:
            rows[e[1]]["free_ns"] = t
    return list(rows.values())


def add_blocks(trace, rows: list[dict]):
    """`trace` with the block rows added (sequence positions recomputed from times)."""
    if not rows:
        return trace
    from memlens.trace import Trace
    merged = pd.concat([trace.blocks, pd.DataFrame(rows)], ignore_index=True)
    merged["alloc_seq"] = pd.array([pd.NA] * len(merged), dtype="Int64")
    merged["free_seq"] = pd.array([pd.NA] * len(merged), dtype="Int64")
    extra = {t: getattr(trace, t) for t in ("segments", "segment_blocks", "events", "stacks")
             if getattr(trace, t, None) is not None}
    return Trace.from_tables(merged, trace.accesses, trace.ops, metadata=trace.metadata, **extra)


def sort_scratch_blocks(trace, facts: dict, round_size) -> list[dict]:
    """Block rows for every recorded sorted-accumulate ``index_put`` (`facts`: op_id -> index_put_sort_facts).
    An out-of-place ``aten::index_put`` in backward is autograd's ``index_backward`` on subclass tensors, which
    a real run executes as ``_index_put_impl_(unsafe=True)``; elsewhere the public ops check the range."""
    if not facts:
        return []
    ops = trace.ops.set_index("op_id", drop=False)
    phase = ops["phase"] if "phase" in ops.columns else pd.Series("", index=ops.index)
    next_id = int(trace.blocks["block_id"].max()) + 1 if len(trace.blocks) else 0
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


CONV_OPS = frozenset({"aten::convolution", "aten::_convolution", "aten::convolution_backward",
                      "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::conv_transpose1d",
                      "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::cudnn_convolution",
                      "aten::cudnn_convolution_transpose", "aten::convolution_overrideable"})


def conv_workspace_blocks(trace, allowance, round_size) -> list[dict]:
    """One transient block per convolution op on cuda (outermost op only: a composite ``conv2d`` and its
    ``convolution`` are one cuDNN call), of `allowance` bytes (an int, or a callable op_row -> bytes; 0 or
    None skips that op). See the module docstring for why this is an allowance, not a prediction."""
    if not allowance:
        return []
    ops = trace.ops
    conv = ops[ops["name"].isin(CONV_OPS)].sort_values(["start_ns", "op_id"])
    next_id = int(trace.blocks["block_id"].max()) + 1 if len(trace.blocks) else 0
    rows: list[dict] = []
    outer_end = None
    for op in conv.itertuples(index=False):
        if outer_end is not None and int(op.start_ns) < outer_end:
            continue          # nested inside the previous convolution op (its decomposition)
        outer_end = int(op.end_ns)
        size = allowance(op) if callable(allowance) else allowance
        if not size or int(size) <= 0:
            continue
        ev = [("alloc", "ws", int(size), "cudnn workspace allowance"), ("free", "ws")]
        rows += events_to_blocks(ev, op, next_id + len(rows), round_size)
    return rows


GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot",
                      "_addmm_activation", "_scaled_mm", "_int_mm"})


def cublas_workspace_blocks(trace, workspace_bytes: int) -> list[dict]:
    """Block rows of one cuBLAS workspace of `workspace_bytes` bytes per thread, allocated at that thread's
    first GEMM op and never freed; [] when the trace has no GEMM."""
    ops = trace.ops
    threads = ops["thread"] if "thread" in ops.columns else pd.Series(0, index=ops.index)
    names = ops["name"].astype("category")     # few distinct names: parse each once ("aten::addmm.default")
    is_gemm = np.array([str(n).split("::")[-1].split(".")[0] in GEMM_OPS for n in names.cat.categories],
                       dtype=bool)
    gemm = ops[is_gemm[names.cat.codes.to_numpy()]] if len(is_gemm) else ops.iloc[:0]
    if len(gemm) == 0:
        return []
    firsts = gemm.assign(thread=threads.loc[gemm.index]).groupby("thread", sort=False).head(1)
    next_id = int(trace.blocks["block_id"].max()) + 1 if len(trace.blocks) else 0
    return [{"block_id": next_id + i, "device": "cuda:0", "addr": pd.NA, "size": workspace_bytes,
             "requested_size": workspace_bytes, "alloc_ns": int(op.start_ns), "free_ns": pd.NA,
             "category": "unknown", "op": "cublas_workspace (modelled)", "alloc_op_id": int(op.op_id),
             "module": op.module, "stream": 0, "allocated_before": False, "free_without_alloc": False,
             "source": MODEL_SOURCE}
            for i, op in enumerate(firsts.itertuples(index=False))]


__all__ = ["conv_workspace_blocks", "cublas_workspace_blocks", "index_put_sort_facts", "cub_sort_pairs_temp_bytes",
           "index_put_sort_events", "events_to_blocks", "add_blocks", "sort_scratch_blocks"]


# ---- CUDA reductions' global staging buffer and semaphores ---------------------------------------------------
# ATen's reduce kernel (aten/src/ATen/native/cuda/Reduce.cuh, setReduceConfig) splits one output's inputs across
# several CTAs when each thread would still have >= 256 values and the grid is small for the GPU; the CTAs then
# combine partial results through a global buffer and per-output-column semaphores taken from the caching
# allocator for the kernel's duration (gpu_reduce_kernel: buffer of global_memory_size(), then semaphores of
# semaphore_size(); freed in reverse when the kernel has been launched).
MAX_NUM_THREADS = 512          # ReduceConfig's threads per block (mnt_wrapper, non-complex types)
WARP = 32
VT0 = 4                        # values per thread per load, and the input vector width
MIN_VALUES_PER_THREAD, MAX_VALUES_PER_THREAD = 16, 256


def _last_pow2(n: int) -> int:
    """floor(log2) as a power of two, at least 1 (Reduce.cuh last_pow2)."""
    return max(1, 1 << (int(n).bit_length() - 1)) if n > 0 else 1


def _iterator_layout(shape, strides, reduced):
    """TensorIterator's view of a reduction's input: size-1 dims dropped, reduced dims first, each group in
    ascending input stride, then adjacent dims of the same group coalesced when contiguous. Returns
    (sizes, input strides in elements, number of reduced dims)."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    red = sorted((d for d in dims if d in reduced), key=lambda d: (strides[d], -d))
    kept = sorted((d for d in dims if d not in reduced), key=lambda d: (strides[d], -d))
    groups = []
    for group in (red, kept):
        out: list[list[int]] = []
        for d in group:
            if out and out[-1][0] * out[-1][1] == strides[d]:
                out[-1][0] *= shape[d]
            else:
                out.append([shape[d], strides[d]])
        groups.append(out)
    sizes = [g[0] for g in groups[0] + groups[1]]
    st = [g[1] for g in groups[0] + groups[1]]
    return sizes, st, len(groups[0])


def reduce_global_bytes(shape, strides, reduced, arg_bytes: int, sm_count: int, max_threads_per_sm: int):
    """(global buffer bytes, semaphore bytes, ctas_per_output) ATen's CUDA reduce kernel asks the caching
    allocator for, for an input of `shape` / `strides` (elements) reduced over the dims in `reduced`, with an
    accumulator of `arg_bytes`; (0, 0, 1) when one CTA per output suffices (setReduceConfig ported)."""
    sizes, st, n_red = _iterator_layout(list(shape), list(strides), set(reduced))
    ndim = len(sizes)
    if ndim == 0 or n_red == 0:
        return 0, 0, 1
    num_outputs = math.prod(sizes[n_red:])
    inputs_per_output = math.prod(sizes[:n_red])
    on_fastest = n_red == ndim or st[0] < st[n_red]
    if on_fastest:
        dim0, dim1, fastest_stride = inputs_per_output, num_outputs, st[0]
    else:
        dim0, dim1, fastest_stride = num_outputs, inputs_per_output, st[n_red]
    out_vec = 1
    if fastest_stride == 1:
        if on_fastest and dim0 > 128 and n_red == 1:
            dim0 //= VT0                  # "vectorize along input"
        elif not on_fastest:              # "vectorize along output": widest of 4/2/1 dividing the layout
            out_vec = 4
            for n in [sizes[n_red]] + [s for j, s in enumerate(st) if j != n_red]:
                while n % out_vec:
                    out_vec //= 2
            dim0 //= out_vec
    max_threads = MAX_NUM_THREADS // out_vec
    d0 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    d1 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(d0, WARP)
    height = min(d1, max_threads // width)
    width = min(d0, max_threads // height)
    step_in = step_out = 1
    if on_fastest:
        step_in *= width                  # block_x_reduce
    else:
        step_out *= width
    split_warps = -(-inputs_per_output // step_in) >= min(height * 16, MAX_VALUES_PER_THREAD)
    if split_warps:
        step_in *= height
    else:
        step_out *= height
    blocks_per_sm = max_threads_per_sm // (width * height)
    target = sm_count * blocks_per_sm
    grid_x = -(-(num_outputs // out_vec) // step_out)
    values = -(-inputs_per_output // step_in)
    ctas = 1
    if split_warps and values >= MAX_VALUES_PER_THREAD and grid_x <= target:
        ctas = max(min(-(-target // grid_x), -(-values // MIN_VALUES_PER_THREAD)),
                   -(-values // MAX_VALUES_PER_THREAD))
    if ctas <= 1:
        return 0, 0, 1
    size = arg_bytes * num_outputs * ctas
    if not on_fastest:
        size *= width * out_vec
    return int(size), 4 * int(grid_x), int(ctas)


def reduce_op_table() -> dict:
    """OpOverload -> (position of its dim argument or None for all dims, accumulator kind)."""
    import torch
    a = torch.ops.aten
    table = {a.sum.default: (None, "acc"), a.sum.dim_IntList: (1, "acc"), a.mean.default: (None, "acc"),
             a.mean.dim: (1, "acc"), a.amax.default: (1, "acc"), a.amin.default: (1, "acc"),
             a.prod.default: (None, "acc"), a.prod.dim_int: (1, "acc"), a.linalg_vector_norm.default: (2, "acc"),
             a.max.dim: (1, "pair"), a.min.dim: (1, "pair"), a.argmax.default: (1, "pair"),
             a.argmin.default: (1, "pair")}
    return table


_REDUCE_TABLE: dict | None = None


def reduce_facts(func, args, kwargs) -> tuple | None:
    """(shape, strides, reduced dims, accumulator bytes) of a single-kernel CUDA reduction call, else None.
    The accumulator is ATen's acc type (float for fp32/fp16/bf16, double for fp64); value-and-index
    reductions (max/min with dim, argmax/argmin) carry a (value, int64 index) pair: 16 bytes."""
    global _REDUCE_TABLE
    import torch
    if _REDUCE_TABLE is None:
        _REDUCE_TABLE = reduce_op_table()
    spec = _REDUCE_TABLE.get(func)
    if spec is None:
        return None
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.device.type != "cuda" or x.numel() == 0 or not x.dtype.is_floating_point:
        return None
    pos, kind = spec
    dim = None
    if pos is not None:
        dim = args[pos] if len(args) > pos else (kwargs or {}).get("dim")
    ndim = x.dim()
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        reduced = tuple(range(ndim))
    elif isinstance(dim, int):
        reduced = (dim % max(ndim, 1),)
    else:
        reduced = tuple(int(d) % max(ndim, 1) for d in dim)
    acc = 8 if x.dtype == torch.float64 else 4
    arg = 16 if kind == "pair" else acc
    return (tuple(x.shape), tuple(x.stride()), reduced, arg)


def reduce_scratch_blocks(trace, facts: dict, sm_count: int, max_threads_per_sm: int, round_size) -> list[dict]:
    """Block rows for the reductions in `facts` (op_id -> reduce_facts) that need a global reduction."""
    if not facts:
        return []
    ops = trace.ops.set_index("op_id", drop=False)
    next_id = int(trace.blocks["block_id"].max()) + 1 if len(trace.blocks) else 0
    rows: list[dict] = []
    for op_id, (shape, strides, reduced, arg) in sorted(facts.items()):
        if op_id not in ops.index:
            continue
        buf, sem, ctas = reduce_global_bytes(shape, strides, reduced, arg, sm_count, max_threads_per_sm)
        if not buf:
            continue
        ev = [("alloc", "buf", buf, f"reduce global buffer ({ctas} CTAs per output)"),
              ("alloc", "sem", sem, "reduce semaphores"), ("free", "sem"), ("free", "buf")]
        rows += events_to_blocks(ev, ops.loc[op_id], next_id + len(rows), round_size)
    return rows


__all__ += ["reduce_global_bytes", "reduce_facts", "reduce_op_table", "reduce_scratch_blocks"]
