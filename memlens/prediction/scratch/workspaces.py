"""Which library workspaces a predicted trace holds: cuBLAS's, one per thread kept from its first GEMM, and an
optional cuDNN allowance per convolution call.

**cuBLAS workspaces**: cuBLAS takes one workspace per (thread, stream) from the caching allocator at the
first GEMM there and keeps it (`cublas_workspace_blocks`; its size per GPU generation is in `gpus.py`).

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
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.prediction.scratch.blocks import events_to_blocks, modelled_block, next_block_id


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
    next_id = next_block_id(trace)
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
    next_id = next_block_id(trace)
    return [modelled_block(next_id + i, op, workspace_bytes, workspace_bytes, int(op.start_ns), "workspace",
                           "cublas_workspace")
            for i, op in enumerate(firsts.itertuples(index=False))]
