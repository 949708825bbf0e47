"""Putting a measured profile onto another GPU: each op's measured kernel time, scaled op by op.

A trace on the measured kernel clock (``metadata["clock"]["kind"] == "cuda"``) already knows how long every
op's kernels took on the GPU that ran them. Moving it to another GPU starts from that time, not from the
op's shapes, so ops the cost rules do not price (compiled regions, triton and custom kernels) keep a time.

Each op's own measured time (``device_self_ns``) is multiplied by the ratio of its roofline times on the two
GPUs. On a GPU, an op of ``flops`` FLOPs moving ``bytes_read + bytes_written`` bytes is compute-bound when
its arithmetic intensity (FLOP per byte) is above the GPU's ridge point, the achieved compute rate over the
achieved memory rate, and memory-bound below it; its time is then flops / compute rate, else bytes / memory
rate (equivalently: the larger of the two). The rates are achieved ones, peak times the GPU table's
efficiency for the op's class (`memlens.devicetime.rules.names.op_class`): fused attention computes at
``attention_efficiency`` of the dtype's peak, every other op at ``gemm_efficiency``; row-wise norms and
softmax stream at ``norm_efficiency`` of ``mem_bw``, every other op at ``mem_efficiency``. So an op compute-bound
on both GPUs scales by the compute-rate ratio, one memory-bound on both by the memory-rate ratio, and one
whose regime flips by (its time on the target's bound) / (its time on the source's bound).

An op without cost facts (no flops and no bytes) nested in one that has them takes its nearest such
ancestor's ratio: the facts of ``aten::_scaled_dot_product_flash_attention`` describe the kernel its nested
``aten::_flash_attention_forward`` launches. Other ops without cost facts scale by the achieved memory-rate
ratio: the kernels the rules cannot price are mostly fused elementwise or reduction kernels, which stream
memory. Host <-> device
copies (``transfer`` = "h2d"/"d2h") scale by the ratio of the host links in their direction.

Only the part of an op's time above its kernels' floors scales (`scaled_ns`): the first `floor_ns` of each
kernel (the GPU table's fixed time of a GEMM or fused-attention kernel, else its smallest-kernel time) is the
same for any amount of work, so it becomes the target's floor. Without it, a profile of small kernels would be scaled as if it streamed at full rate.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.clock import op_parents
from memlens.devicetime.gpu import GPU
from memlens.devicetime.rules.names import op_class


def compute_rate(g: GPU, dtype: str, cls: str = "gemm", *, tf32: bool = False) -> float:
    """Achieved FLOP/s of `g` for `dtype` in an op of class `cls`: its dense peak times the class's efficiency."""
    eff = g.attention_efficiency if cls == "attention" else g.gemm_efficiency
    return g.peak_flops(dtype, tf32=tf32) * eff


def memory_rate(g: GPU, cls: str = "elementwise") -> float:
    """Achieved bytes/s of `g`'s memory in an op of class `cls`: its bandwidth times the class's efficiency."""
    return g.mem_bw * (g.norm_efficiency if cls == "normalization" else g.mem_efficiency)


def roofline_ns(g: GPU, flops, moved, dtypes, classes, *, tf32: bool = False) -> np.ndarray:
    """Per op, the larger of flops / compute rate and bytes moved / memory rate on `g` (rates of the op's
    dtype and class), ns (0 for an op with neither)."""
    flops = np.asarray(flops, dtype="float64")
    moved = np.asarray(moved, dtype="float64")
    keys = list(zip(dtypes, classes))
    rates = {k: (compute_rate(g, k[0], k[1], tf32=tf32), memory_rate(g, k[1])) for k in set(keys)}
    per_op = np.array([rates[k] for k in keys], dtype="float64").reshape(len(keys), 2)
    return np.maximum(flops / per_op[:, 0], moved / per_op[:, 1]) * 1e9


def _host_ratio(src: GPU, dst: GPU, direction: str) -> float:
    index = 0 if direction == "d2h" else 1          # host_bw = (device -> host, host -> device)
    return float(src.host_bw[index]) / float(dst.host_bw[index])


def scale_factors(ops: pd.DataFrame, src: GPU, dst: GPU, *, tf32: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(factor, priced, op class) per op row: the multiplier from its measured time on `src` to `dst` (module
    docstring) and whether cost facts decided it, its own or an ancestor's (False: the default memory-rate
    ratio or a host link)."""
    n = len(ops)

    def col(name, default):
        return ops[name].to_numpy() if name in ops.columns else np.full(n, default)

    flops = pd.to_numeric(pd.Series(col("flops", 0)), errors="coerce").fillna(0).to_numpy("float64")
    moved = (pd.to_numeric(pd.Series(col("bytes_read", 0)), errors="coerce").fillna(0)
             + pd.to_numeric(pd.Series(col("bytes_written", 0)), errors="coerce").fillna(0)).to_numpy("float64")
    dtypes = np.array([d if isinstance(d, str) and d else "float32" for d in col("dtype", "float32")], dtype=object)
    transfer = np.array([t if isinstance(t, str) else "" for t in col("transfer", "")], dtype=object)
    names = col("name", "")
    classes = np.array([op_class(str(n), int(f), int(b)) for n, f, b in zip(names, flops, moved)], dtype=object)
    before = roofline_ns(src, flops, moved, dtypes, classes, tf32=tf32)
    after = roofline_ns(dst, flops, moved, dtypes, classes, tf32=tf32)
    priced = before > 0
    factor = np.where(priced, after / np.where(priced, before, 1.0), memory_rate(src) / memory_rate(dst))
    parent = op_parents(ops)
    for row in np.flatnonzero(~priced & (parent >= 0)):
        up = parent[row]
        for _ in range(n):                    # bounded: a malformed (cyclic) nesting stops after n steps
            if up < 0 or priced[up]:
                break
            up = parent[up]
        if up >= 0 and priced[up]:
            factor[row], classes[row] = factor[up], classes[up]
            priced[row] = True
    for direction in ("h2d", "d2h"):
        copy = transfer == direction
        factor[copy] = _host_ratio(src, dst, direction)
        priced[copy] = False
    return factor, priced, classes


def floor_ns(g: GPU, classes) -> np.ndarray:
    """Per op class, the fixed time of one kernel on `g`, ns (GPU table): ``gemm_floor_ns`` for a GEMM,
    ``attention_floor_ns`` for fused attention, ``launch_ns`` (the smallest kernel) for the rest."""
    table = {"gemm": g.gemm_floor_ns, "attention": g.attention_floor_ns}
    return np.array([table.get(c, g.launch_ns) for c in classes], dtype="float64")


def scaled_ns(measured, own_kernels, factor, classes, src: GPU, dst: GPU) -> np.ndarray:
    """Each op's time on `dst`, ns, from its measured own time on `src` (ns), the kernels it launched itself,
    its `factor` and class (`scale_factors`). The first `floor_ns` of each kernel is fixed work no FLOP or byte
    rate moves: it becomes `dst`'s floor for the class; the rest of the time scales by `factor`."""
    measured = np.asarray(measured, dtype="float64")
    kernels = np.clip(np.asarray(own_kernels, dtype="float64"), 0, None)
    src_floor, dst_floor = floor_ns(src, classes), floor_ns(dst, classes)
    fixed = np.minimum(measured, kernels * src_floor)
    return fixed * (dst_floor / src_floor) + (measured - fixed) * np.asarray(factor, dtype="float64")
