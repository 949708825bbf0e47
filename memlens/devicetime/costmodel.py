"""How long each op of a trace runs on a GPU: a per-op-class model, better than a roofline at the sizes
people profile.

Inputs are the ops table's cost facts (`flops`, `bytes_read`, `bytes_written`, `dtype`, `shapes`, see
`memlens.record.costs`) and a `GPU`. Each op gets an op class, a kernel count and a duration in ns:

- **none** (0 ns, 0 kernels): ops that move no bytes and do no arithmetic: views (``view``, ``t``,
  ``expand``, ``detach`` ...), metadata and allocation-only ops (``empty``, ``sym_size`` ...).
- **gemm** (mm, addmm, bmm, baddbmm, _scaled_mm, convolution as an implicit GEMM): a GEMM runs in waves
  of output tiles over the compute units. The library picks the tile (256x128 ... 16x16; smaller tiles
  reuse operands less, so they reach a lower share of the peak) that finishes first; each wave lasts
  ``max(K x gemm_k_ns`` (the serial main loop's latency) ``, tile flops / (per-unit peak x efficiency))``;
  when the tiles cannot fill the device, K may be split (2-16 ways, slices of >= 256) at the cost of
  writing and reducing fp32 partial sums;
  the whole is ``gemm_floor_ns + max(waves x wave, bytes / achieved bandwidth)``. Tiles that hang
  over M or N (141 rows in 128-row tiles) do the padded work; GEMMs whose innermost dimensions break
  16-byte alignment fall back to narrow loads (x `misaligned_gemm_penalty` on the compute part).
- **attention** (fused SDPA / flash / memory-efficient kernels): one thread block per (batch, head,
  128 query rows), each looping over 128-key blocks: ``attention_floor_ns + waves x key blocks x block
  flops / (per-unit peak x attention_efficiency)``; backward kernels do 2.5x the work and launch 3.
- **normalization** (layer/group/batch/RMS norm, softmax) and **reduction** (sum, mean, all, max ...):
  a reduction then a dependent pass, so two kernel floors plus the bytes at achieved bandwidth.
- **gather** (embedding, index_select, gather, index): two dependent loads (index, then row): two floors
  plus the bytes (reads counted as the rows fetched, not the whole table).
- **elementwise** (everything else that moves bytes): one kernel floor plus bytes at achieved bandwidth.
- **foreach** (``_foreach_*``, fused optimizers): multi-tensor-apply launches one kernel per group of
  tensors (110/64/48/36/30 tensors for 1-5 lists) or of 320 x 64 Ki elements, plus the bytes.
- **transfer** (``_local_scalar_dense``, i.e. ``.item()``): a small device-to-host copy, one floor.
Ops known to launch several kernels (norm backwards, embedding backward, sort, nonzero ...) pay one
floor per kernel (`MULTI_KERNEL`). The naive roofline (`roofline_ns`) is ``max(flops / peak, bytes /
bandwidth)`` per op, with no floors and no efficiencies: the baseline the model is compared with.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from memlens.devicetime.gpus import GPU, DTYPE_TO_KEY

MODEL_NAME = "memlens.devicetime v1 (per-op-class: GEMM waves, attention blocks, bandwidth + kernel floors)"

CLASSES = ("none", "gemm", "attention", "normalization", "reduction", "gather", "elementwise", "foreach",
           "transfer")

_GEMM = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_scaled_mm",
                   "aten::_int_mm", "aten::mv", "aten::addmv", "aten::dot", "aten::vdot", "aten::matmul",
                   "aten::_addmm_activation"})
_CONV = frozenset({"aten::convolution", "aten::_convolution", "aten::cudnn_convolution",
                   "aten::convolution_overrideable", "aten::mkldnn_convolution", "aten::miopen_convolution",
                   "aten::cudnn_convolution_transpose", "aten::convolution_backward"})
_ATTENTION_BHSD = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                   "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
                   "aten::_scaled_dot_product_fused_attention_overrideable")
_ATTENTION_BSHD = ("aten::_flash_attention_forward", "aten::_efficient_attention_forward",
                   "aten::_flash_attention_backward", "aten::_efficient_attention_backward")
_NORM = frozenset({"aten::native_layer_norm", "aten::native_group_norm", "aten::native_batch_norm",
                   "aten::_batch_norm_with_update", "aten::_native_batch_norm_legit",
                   "aten::_native_batch_norm_legit_no_training", "aten::_fused_rms_norm", "aten::rms_norm",
                   "aten::_softmax", "aten::_log_softmax", "aten::_softmax_backward_data",
                   "aten::_log_softmax_backward_data", "aten::native_layer_norm_backward",
                   "aten::native_group_norm_backward", "aten::native_batch_norm_backward",
                   "aten::_fused_rms_norm_backward", "aten::cudnn_batch_norm", "aten::miopen_batch_norm",
                   "aten::batch_norm_backward", "aten::cudnn_batch_norm_backward"})
_REDUCTION = frozenset({"aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::max", "aten::min",
                        "aten::all", "aten::any", "aten::argmax", "aten::argmin", "aten::prod", "aten::var",
                        "aten::std", "aten::var_mean", "aten::std_mean", "aten::norm", "aten::linalg_vector_norm",
                        "aten::logsumexp", "aten::cumsum", "aten::cumprod", "aten::nll_loss_forward",
                        "aten::nll_loss2d_forward", "aten::mse_loss", "aten::count_nonzero", "aten::_cdist_forward",
                        "aten::topk", "aten::sort", "aten::median", "aten::nansum", "aten::aminmax"})
_GATHER = frozenset({"aten::embedding", "aten::index_select", "aten::gather", "aten::index", "aten::take",
                     "aten::embedding_dense_backward", "aten::index_put_", "aten::_index_put_impl_",
                     "aten::scatter", "aten::scatter_", "aten::scatter_add", "aten::scatter_add_",
                     "aten::index_add_", "aten::index_add", "aten::embedding_bag", "aten::_embedding_bag"})
_TRANSFER = frozenset({"aten::_local_scalar_dense"})

# eager CUDA ops that launch more than one kernel (PyTorch's native CUDA implementations)
MULTI_KERNEL = {
    "aten::native_layer_norm_backward": 2,      # input grad, then gamma/beta grads
    "aten::native_group_norm_backward": 3,
    "aten::native_batch_norm_backward": 2,
    "aten::batch_norm_backward": 2,
    "aten::_fused_rms_norm_backward": 2,
    "aten::embedding_dense_backward": 4,        # sort indices, segment offsets, partial sums, scatter
    "aten::_flash_attention_backward": 3,       # dO.O preprocess, main, dQ convert
    "aten::_scaled_dot_product_flash_attention_backward": 3,
    "aten::_efficient_attention_backward": 2,
    "aten::_scaled_dot_product_efficient_attention_backward": 2,
    "aten::convolution_backward": 3,            # grad input, grad weight, grad bias
    "aten::nonzero": 3, "aten::_unique2": 5, "aten::unique_dim": 5, "aten::unique_consecutive": 4,
    "aten::sort": 2, "aten::topk": 2, "aten::multinomial": 3, "aten::index_put_": 3,
    "aten::_index_put_impl_": 3, "aten::max_pool2d_with_indices_backward": 2, "aten::nll_loss_forward": 1,
    "aten::cross_entropy_loss": 3, "aten::_cdist_forward": 2, "aten::median": 2,
}

# multi_tensor_apply: tensors per launch by number of tensor lists (PyTorch's depth_to_max_tensors)
_FOREACH_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
_FOREACH_BLOCKS, _FOREACH_CHUNK = 320, 65536

# candidate GEMM tiles and the share of the peak each reaches (operand reuse falls with the tile size)
GEMM_TILES = ((256, 128, 1.0), (128, 128, 1.0), (128, 64, 0.9), (64, 64, 0.8), (32, 32, 0.5), (16, 16, 0.3))
_ATTN_BLOCK = 128
# split-K factors a library may use when the output has too few tiles to fill the device (small M x N,
# long K: weight gradients, tall-skinny products)
SPLIT_K = (1, 2, 4, 8, 16)

_TENSOR_RE = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_MORE_RE = re.compile(r"\.\.\.\+(\d+)")
_ITEMSIZE = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "b8": 1,
             "c64": 8, "c128": 16, "f8e4m3": 1, "f8e5m2": 1}


def base_name(name: str) -> str:
    """``"aten::add.Tensor"`` -> ``"aten::add"`` (overloads cost the same)."""
    head, sep, tail = name.partition("::")
    return head + sep + tail.split(".", 1)[0] if sep else name.split(".", 1)[0]


def op_class(name: str, flops: int = 1, bytes_moved: int = 1) -> str:
    """The class of an op (see the module docstring); ``"none"`` for ops that move no byte."""
    if flops == 0 and bytes_moved == 0:
        return "none"
    n = base_name(name)
    if n in _GEMM or n in _CONV:
        return "gemm" if flops > 0 else "elementwise"
    if n in _ATTENTION_BHSD or n in _ATTENTION_BSHD or "scaled_dot_product" in n and "backward" in n:
        return "attention"
    if n in _NORM:
        return "normalization"
    if n in _REDUCTION:
        return "reduction"
    if n in _GATHER:
        return "gather"
    if n in _TRANSFER:
        return "transfer"
    if n.startswith("aten::_foreach_") or n.startswith("aten::_fused_adam") or n.startswith("aten::_fused_sgd"):
        return "foreach"
    return "elementwise"


def parse_shapes(shapes: str) -> tuple[list, list, int]:
    """``"bf16[141,512],bf16[512,512]->bf16[141,512]"`` -> (input tensors, output tensors, tensors left
    out of shortened lists); each tensor is (short dtype, shape tuple)."""
    left, _, right = (shapes or "").partition("->")
    def tensors(text):
        return [(d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _TENSOR_RE.findall(text)]
    more = sum(int(m) for m in _MORE_RE.findall(left))
    return tensors(left), tensors(right), more


def _gemm_ns(g: GPU, flops: float, out_shape: tuple, conv: bool, dtype: str, bytes_moved: float,
             aligned: bool, tf32: bool) -> float:
    if conv and len(out_shape) >= 3:
        m, n, batch = out_shape[0] * math.prod(out_shape[2:]), out_shape[1], 1
    elif len(out_shape) >= 2:
        m, n, batch = out_shape[-2], out_shape[-1], math.prod(out_shape[:-2])
    else:
        m, n, batch = 1, max(math.prod(out_shape), 1), 1
    m, n = max(m, 1), max(n, 1)
    k = flops / (2.0 * batch * m * n)
    per_unit = g.peak_flops(dtype, tf32=tf32) * g.gemm_efficiency / g.compute_units
    best = math.inf
    for tm, tn, eff in GEMM_TILES:
        tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        tile_ns = 2.0 * tm * tn * k / (per_unit * eff) * 1e9
        if not aligned:
            tile_ns *= g.misaligned_gemm_penalty
        for split in SPLIT_K:
            if split > 1 and (tiles * split > g.compute_units or k / split < 256):
                break
            waves = math.ceil(tiles * split / g.compute_units)
            # split-K: each slice runs 1/split of the main loop; the partial sums (fp32) are written and
            # reduced once more (one more pass over split x the output)
            reduce_ns = 0.0 if split == 1 else \
                (split + 1) * 4.0 * batch * m * n / (g.mem_bw * g.mem_efficiency) * 1e9
            best = min(best, waves * max(k / split * g.gemm_k_ns, tile_ns / split) + reduce_ns)
    mem_ns = bytes_moved / (g.mem_bw * g.mem_efficiency) * 1e9
    return g.gemm_floor_ns + max(best, mem_ns)


def _attention_ns(g: GPU, name: str, inputs: list, flops: float, dtype: str, backward: bool) -> float:
    q = inputs[0][1] if inputs else ()
    k = inputs[1][1] if len(inputs) > 1 else q
    if len(q) == 4:
        if base_name(name) in _ATTENTION_BSHD:
            b, sq, h, d = q
            skv = k[1] if len(k) == 4 else sq
        else:
            b, h, sq, d = q
            skv = k[2] if len(k) == 4 else sq
        blocks = b * h * math.ceil(sq / _ATTN_BLOCK)
        kv_blocks = math.ceil(skv / _ATTN_BLOCK)
        block_flops = 4.0 * _ATTN_BLOCK * _ATTN_BLOCK * d * (2.5 if backward else 1.0)
        per_unit = g.peak_flops(dtype) * g.attention_efficiency / g.compute_units
        waves = math.ceil(blocks / g.compute_units)
        work = waves * kv_blocks * block_flops / per_unit * 1e9
    else:   # shapes unknown: the whole op's flops at the attention efficiency
        work = flops / (g.peak_flops(dtype) * g.attention_efficiency) * 1e9
    return g.attention_floor_ns * (2.0 if backward else 1.0) + work


_LIST_RE = re.compile(r"\[((?:[a-z0-9]+\[[0-9,]*\],?)+)(?:\.\.\.\+(\d+))?\]")


def _foreach_kernels(shapes: str, total_bytes: float) -> int:
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
    itemsize = _ITEMSIZE.get(lists[0][1], 4)
    elements = total_bytes / itemsize / len(lists)
    by_tensors = math.ceil(per_list / _FOREACH_TENSORS[depth])
    by_chunks = math.ceil(elements / (_FOREACH_CHUNK * _FOREACH_BLOCKS))
    return max(1, by_tensors, by_chunks)


def _aligned(inputs: list, outputs: list) -> bool:
    """Innermost dimensions of every GEMM operand are multiples of 16 bytes."""
    for d, shape in inputs + outputs:
        if len(shape) >= 1 and shape[-1] > 1 and (shape[-1] * _ITEMSIZE.get(d, 4)) % 16:
            return False
    return True


def model_op(g: GPU, name: str, flops: int, bytes_read: int, bytes_written: int, dtype: str, shapes: str,
             *, tf32: bool = False) -> tuple[str, int, float]:
    """(op class, kernels launched, device ns) of one op on `g`."""
    moved = float(bytes_read + bytes_written)
    cls = op_class(name, flops, int(moved))
    if cls == "none":
        return cls, 0, 0.0
    n = base_name(name)
    inputs, outputs, more = parse_shapes(shapes)
    stream_ns = moved / (g.mem_bw * g.mem_efficiency) * 1e9
    kernels = MULTI_KERNEL.get(n, 1)
    if cls == "gemm":
        out_shape = outputs[0][1] if outputs else ()
        if n == "aten::convolution_backward":
            out_shape = inputs[0][1] if inputs else out_shape
        t = _gemm_ns(g, float(flops), out_shape, n in _CONV, dtype, moved, _aligned(inputs, outputs), tf32)
        if kernels > 1:
            t += (kernels - 1) * g.launch_ns
        return cls, kernels, t
    if cls == "attention":
        backward = "backward" in n
        return cls, kernels, _attention_ns(g, name, inputs, float(flops), dtype, backward) + (kernels - 1) * g.launch_ns
    if cls in ("normalization", "reduction", "gather"):
        if cls == "gather" and n in ("aten::embedding", "aten::index_select", "aten::gather", "aten::take",
                                     "aten::index") and outputs:
            # the rows fetched, not the whole table: output-sized reads plus the indices
            out_bytes = sum(_ITEMSIZE.get(d, 4) * math.prod(s) for d, s in outputs)
            idx_bytes = sum(_ITEMSIZE.get(d, 4) * math.prod(s) for d, s in inputs[1:] if d in ("i64", "i32"))
            stream_ns = (2 * out_bytes + idx_bytes) / (g.mem_bw * g.mem_efficiency) * 1e9
        return cls, kernels, (kernels + 1) * g.launch_ns + stream_ns
    if cls == "foreach":
        kernels = _foreach_kernels(shapes, moved)
        return cls, kernels, kernels * g.launch_ns + stream_ns
    if cls == "transfer":
        return cls, 1, g.launch_ns
    if flops > 0:   # an elementwise op with registered flops (rare): whichever bound is slower
        stream_ns = max(stream_ns, flops / g.peak_flops(dtype) * 1e9)
    return cls, kernels, kernels * g.launch_ns + stream_ns


def roofline_op(g: GPU, flops: int, bytes_moved: int, dtype: str, *, tf32: bool = False) -> float:
    """Naive roofline: ``max(flops / dense peak, bytes / bandwidth)`` in ns (no floors, no efficiencies)."""
    if flops == 0 and bytes_moved == 0:
        return 0.0
    return max(flops / g.peak_flops(dtype or "float32", tf32=tf32), bytes_moved / g.mem_bw) * 1e9


def has_cost_facts(ops: pd.DataFrame) -> bool:
    """True when the ops table carries cost facts (some op moved bytes or did flops)."""
    return any(c in ops.columns and (ops[c] > 0).any() for c in ("bytes_read", "bytes_written", "flops"))


def device_times(ops: pd.DataFrame, gpu: GPU, *, tf32: bool = False) -> pd.DataFrame:
    """Per op of `ops`: op_class (str), kernels (int64), device_ns (int64, modeled duration on `gpu`) and
    roofline_ns (int64, the naive roofline), in the order of `ops`. Computed once per distinct
    (name, facts) signature."""
    cols = ["name", "flops", "bytes_read", "bytes_written", "dtype", "shapes"]
    facts = ops.reindex(columns=cols)
    facts = facts.fillna({"flops": 0, "bytes_read": 0, "bytes_written": 0, "dtype": "", "shapes": ""})
    key = pd.MultiIndex.from_frame(facts.astype({"flops": "int64", "bytes_read": "int64", "bytes_written": "int64",
                                                 "dtype": str, "shapes": str, "name": str}))
    codes, uniques = pd.factorize(key)
    rows = []
    for name, flops, br, bw, dtype, shapes in uniques:
        cls, kernels, ns = model_op(gpu, name, int(flops), int(br), int(bw), dtype, shapes, tf32=tf32)
        rows.append((cls, kernels, ns, roofline_op(gpu, int(flops), int(br) + int(bw), dtype, tf32=tf32)))
    if not rows:
        return pd.DataFrame({"op_class": pd.Series(dtype=object), "kernels": pd.Series(dtype=np.int64),
                             "device_ns": pd.Series(dtype=np.int64), "roofline_ns": pd.Series(dtype=np.int64)})
    cls, kernels, ns, roof = (np.asarray(x) for x in zip(*rows))
    return pd.DataFrame({"op_class": cls.astype(object)[codes], "kernels": kernels.astype(np.int64)[codes],
                         "device_ns": np.rint(ns).astype(np.int64)[codes],
                         "roofline_ns": np.rint(roof).astype(np.int64)[codes]}, index=ops.index)


__all__ = ["CLASSES", "MODEL_NAME", "MULTI_KERNEL", "device_times", "model_op", "op_class", "roofline_op",
           "parse_shapes", "has_cost_facts", "DTYPE_TO_KEY"]
