"""Memory-bound ops: elementwise, gathers, pooling, multi-tensor apply and host <-> device copies.

Sources: PyTorch's elementwise machinery (aten/src/ATen/native/cuda/Loops.cuh, CUDALoops.cuh): operands
that are contiguous and of one shape take the vectorized path (16-byte loads); a broadcast operand forces
the ``OffsetCalculator`` path with one element per load, which halves the achieved bandwidth of 2-byte
types (a warp's load is 64 bytes instead of 128). A permuted (non-contiguous) operand takes the same path,
but its unit-stride innermost dimension keeps each warp's loads in whole segments, so it loses a third,
not half (`STRIDED_FACTOR`; the transposed q/k copies and rotary ops of the Qwen and TimeSformer profiles). Multi-tensor apply (ATen/native/cuda/MultiTensorApply.cuh,
``depth_to_max_tensors``): 110/64/48/36/30 tensors per launch for 1-5 lists, 320 blocks of 64 Ki elements.
Max-pool backward (DilatedMaxPool2d.cu): the input gradient is zero-filled and every input element gathers
from the overlapping output windows, so it reads the output gradient and indices about twice and writes the
input gradient twice. Host copies: NVIDIA, "How to Optimize Data Transfers in CUDA C/C++" (pageable memory
is staged through a pinned buffer by a host memcpy, so a pageable copy runs at the host's copy rate, ~10
GB/s, not at the link's: 9.9 GB/s on the V100 DGX profile, 11 GB/s on the H100 one; ROCm's staged copy
on the MI300X profile: 35 GB/s), at most the pinned link rate (`GPU.host_bw`).
"""
from __future__ import annotations

import math
import re

from memlens.devicetime.rules.gemm import ITEMSIZE
from memlens.devicetime.rules.names import logged_list

_FOREACH_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
_FOREACH_BLOCKS, _FOREACH_CHUNK = 320, 65536
_TENSOR_RE = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_LIST_RE = re.compile(r"\[((?:[a-z0-9]+\[[0-9,]*\],?)+)(?:\.\.\.\+(\d+))?\]")
BROADCAST_FACTOR = 2.0      # one-element loads of a 2-byte type: half the bytes per warp load
STRIDED_FACTOR = 1.5        # permuted operand, unit innermost stride: the index math, not the segments
_ROW_GATHERS = ("aten::embedding", "aten::index_select", "aten::gather", "aten::take", "aten::index")


def stream_ns(g, moved: float) -> float:
    """Bytes at the achieved streaming bandwidth, ns."""
    return moved / (g.mem_bw * g.mem_efficiency) * 1e9


def elementwise_ns(g, kernels: int, inputs: list, outputs: list, moved: float, flops: float, dtype: str,
                   strided: bool = False) -> float:
    """One floor per kernel plus the bytes; for a 2-byte (or narrower) result, a broadcast operand costs
    `BROADCAST_FACTOR` and a non-contiguous one (`strided`) `STRIDED_FACTOR` on the bytes; registered
    flops (rare) bound it from below."""
    ns = stream_ns(g, moved)
    out = outputs[0] if outputs else None
    if out is not None:
        out_n = math.prod(out[1])
        itemsize = ITEMSIZE.get(out[0], 4)
        broadcast = any(0 < math.prod(s) < out_n and len(s) > 0 for _, s in inputs)
        if broadcast and itemsize < 4:
            ns *= BROADCAST_FACTOR
        elif strided and itemsize < 4:
            ns *= STRIDED_FACTOR
    if flops > 0:
        ns = max(ns, flops / g.peak_flops(dtype) * 1e9)
    return kernels * g.launch_ns + ns


def non_contiguous(inputs: list, strides) -> bool:
    """True when a tensor input's strides (`strides`: one list per schema argument, as a profile logs
    them, ``[]`` for non-tensors; or its JSON text) are not the contiguous ones for its sizes (dimensions
    of size 1 ignored). Lists are matched to the tensor inputs in order, by rank."""
    if not strides:
        return False
    strides = logged_list(strides)
    if not isinstance(strides, (list, tuple)):
        return False
    lists = [s for s in strides if isinstance(s, list) and s and all(isinstance(v, int) for v in s)]
    j = 0
    for _, dims in inputs:
        while j < len(lists) and len(lists[j]) != len(dims):
            j += 1
        if j >= len(lists):
            return False
        expected = 1
        for size, stride in zip(reversed(dims), reversed(lists[j])):
            if size > 1 and stride != expected:
                return True
            expected *= size
        j += 1
    return False


def gather_ns(g, n: str, kernels: int, inputs: list, outputs: list, moved: float) -> float:
    """Two dependent loads (index, then row): two floors plus the rows fetched (output-sized reads plus the
    indices, not the whole table)."""
    if n in _ROW_GATHERS and outputs:
        out_bytes = sum(ITEMSIZE.get(d, 4) * math.prod(s) for d, s in outputs)
        idx_bytes = sum(ITEMSIZE.get(d, 4) * math.prod(s) for d, s in inputs[1:] if d in ("i64", "i32"))
        moved = 2 * out_bytes + idx_bytes
    return (kernels + 1) * g.launch_ns + stream_ns(g, moved)


def pooling_ns(g, n: str, kernels: int, moved: float, read: float, written: float) -> float:
    """Forward pooling streams its bytes once; backward reads twice and writes twice (zero-fill, then the
    gathered gradient)."""
    if "backward" in n:
        moved = 2.0 * read + 2.0 * written
    return kernels * g.launch_ns + stream_ns(g, moved)


def foreach_kernels(shapes: str, total_bytes: float) -> int:
    """Launches of one multi-tensor-apply op: by tensors per launch (depth = number of tensor lists)
    or by 64 Ki-element chunks (320 blocks per launch), whichever needs more."""
    left = (shapes or "").partition("->")[0]
    lists = []
    for body, more in _LIST_RE.findall(left):
        tensors = _TENSOR_RE.findall(body)
        lists.append((len(tensors) + int(more or 0), tensors[0][0] if tensors else "f32"))
    if not lists:
        return 1
    depth = min(len(lists), 5)
    per_list = max(n for n, _ in lists)
    itemsize = ITEMSIZE.get(lists[0][1], 4)
    elements = total_bytes / itemsize / len(lists)
    by_tensors = math.ceil(per_list / _FOREACH_TENSORS[depth])
    by_chunks = math.ceil(elements / (_FOREACH_CHUNK * _FOREACH_BLOCKS))
    return max(1, by_tensors, by_chunks)


def host_copy_ns(g, direction: str, inputs: list, outputs: list, moved: float) -> float:
    """A copy over the host link (`direction` "h2d" or "d2h"): the destination's bytes at the pageable
    rate (at most the pinned link rate of that direction), plus one floor."""
    dst = outputs[0] if outputs else inputs[0] if inputs else None
    link_bytes = ITEMSIZE.get(dst[0], 4) * math.prod(dst[1]) if dst is not None else moved / 2.0
    pinned = g.host_bw[1] if direction == "h2d" else g.host_bw[0]
    return g.launch_ns + link_bytes / min(g.pageable_bw, pinned) * 1e9
