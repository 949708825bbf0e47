"""Scratch memory that fake tensors never see, added to a predicted trace: CUDA kernels' own temporaries as
transient blocks, the cuBLAS workspaces as blocks held to the end, and an optional cuDNN allowance.

A fake tensor runs an op's meta kernel, which allocates the outputs and nothing else. On a real GPU some
CUDA kernels also take temporaries from the caching allocator while they run (and free them before they
return); the allocator replay must see those too (they take cached blocks and can grow a segment). Each
modelled temporary is a block with ``source == "predict:model"`` and ``op`` naming what it stands for,
allocated and freed inside the op's interval, in the order the CUDA code allocates them
(`memlens.prediction.scratch.blocks`).

Modelled, each in its own module with its sources:

- the sorted accumulate of ``index_put`` (embedding backward): `memlens.prediction.scratch.index_put`;
- flash attention backward's ``softmax_d`` and ``dq_accum``: `memlens.prediction.scratch.flash`;
- CUDA reductions' global staging buffer and semaphores: `memlens.prediction.scratch.reduce`;
- cuBLAS workspaces (one per thread and stream, kept) and the cuDNN convolution workspace allowance (off by
  default: cuDNN picks its algorithm on the real GPU): `memlens.prediction.scratch.workspaces`.

Not modelled: boolean-mask indices (data-dependent ``nonzero``), broadcast ``values`` copies, sort / argsort /
topk / unique's own cub or segmented-sort temporaries, reductions' ``acc_buf`` (only for > 2^31-element inputs
split into sub-iterators), multi-output reductions (var_mean, aminmax, std/var's Welford), wider-than-4 vector
loads some half/bf16 reductions use.
"""
from __future__ import annotations

from memlens.prediction.scratch.blocks import add_blocks, events_to_blocks, next_block_id
from memlens.prediction.scratch.flash import flash_backward_scratch_blocks
from memlens.prediction.scratch.index_put import (cub_sort_pairs_temp_bytes, index_put_sort_events, index_put_sort_facts,
                                               sort_scratch_blocks)
from memlens.prediction.scratch.reduce import reduce_facts, reduce_global_bytes, reduce_op_table, reduce_scratch_blocks
from memlens.prediction.scratch.workspaces import conv_workspace_blocks, cublas_workspace_blocks

# re-exported: the models' functions stay importable from here, where they were before the split
__all__ = ["add_modelled_scratch", "conv_workspace_blocks", "cublas_workspace_blocks", "index_put_sort_facts",
           "cub_sort_pairs_temp_bytes", "index_put_sort_events", "events_to_blocks", "add_blocks",
           "sort_scratch_blocks", "reduce_global_bytes", "reduce_facts", "reduce_op_table", "reduce_scratch_blocks"]


def add_modelled_scratch(trace, gpu, round_size, *, cublas_workspaces: bool = True, kernel_scratch: bool = True,
                         index_put_facts: dict | None = None, reduction_facts: dict | None = None,
                         flash_facts: dict | None = None, cudnn_workspace=None) -> tuple:
    """(`trace` with the modelled blocks added, number of kernel temporaries added).

    `gpu` is the prediction's `GPUMemoryFacts` (cuBLAS workspace bytes, SM count, threads per SM);
    `round_size` maps requested bytes to the bytes the caching allocator gives. `index_put_facts` /
    `reduction_facts` / `flash_facts` are what the prediction session saw (op_id -> facts); `cudnn_workspace` is bytes per
    convolution call, a callable ``op_row -> bytes``, or None (none added).
    """
    if cublas_workspaces:
        trace = add_blocks(trace, cublas_workspace_blocks(trace, gpu.cublas_workspace))
    n_kernel_scratch = 0
    if kernel_scratch:
        scratch = sort_scratch_blocks(trace, index_put_facts or {}, round_size)
        scratch += reduce_scratch_blocks(trace, reduction_facts or {}, gpu.sm_count, gpu.max_threads_per_sm, round_size)
        scratch += flash_backward_scratch_blocks(trace, flash_facts or {}, gpu.sm_count, round_size)
        first_id = next_block_id(trace)
        for i, row in enumerate(scratch):       # ids follow on from the trace's, in one sequence
            row["block_id"] = first_id + i
        trace = add_blocks(trace, scratch)
        n_kernel_scratch = len(scratch)
    if cudnn_workspace:
        trace = add_blocks(trace, conv_workspace_blocks(trace, cudnn_workspace, round_size))
    return trace, n_kernel_scratch
