"""How much global memory a CUDA reduction kernel takes from the caching allocator for one launch: ATen's
``setReduceConfig`` ported, with each GPU's SM count and threads per SM.

**CUDA reductions' global staging buffer and semaphores** (``aten/src/ATen/native/cuda/Reduce.cuh``): when
``setReduceConfig`` splits each output's inputs across several CTAs (ctas_per_output > 1, decided from the
TensorIterator layout, the block shape and the GPU's SM count and threads per SM: `reduce_global_bytes`),
``gpu_reduce_kernel`` takes ``global_memory_size()`` bytes and then ``semaphore_size()`` bytes from the caching
allocator for the launch and frees them after it. Applied to sum / mean / prod / amax / amin /
linalg_vector_norm (float accumulator; double for fp64) and max/min with ``dim`` / argmax / argmin (value + int64
index pairs, 16 bytes). Reproduces the issue's real 157 MiB row-max buffer
(tests/integration/test_predict_cuda_kernels.py); the cs336 runs need none, as their snapshots show.
"""
from __future__ import annotations

import math

from memlens.prediction.scratch.blocks import events_to_blocks, next_block_id


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
    next_id = next_block_id(trace)
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
