"""How long each op of a trace runs on a GPU: a per-op-class model, better than a roofline at the sizes
people profile and checked against real profiles of several models on NVIDIA and AMD parts
(``benchmarks/device_time.py``).

Inputs are the ops table's cost facts (`flops`, `bytes_read`, `bytes_written`, `dtype`, `shapes`, see
`memlens.recording.costs`), optional per-op columns (`causal`: the attention op masks causally;
`transfer`: "h2d" / "d2h" for a copy over the host link; `strided`: an input is not contiguous;
`device`: "cpu" for an op that ran on the host; an imported profile's `concrete_inputs` and
`input_strides` stand in for `causal` and `strided`), and a `GPU`. Each op gets an op class, a kernel count and a duration in ns; the rules live in
`memlens.devicetime.rules` (one module per class, each with its sources):

- **none** (0 ns, 0 kernels): views, metadata, allocation-only ops and composites that had nothing to do
  (``_unsafe_view``, eval-mode ``dropout``, ``contiguous`` of a contiguous tensor), and host-side ops.
- **gemm**: matmuls as tile waves (tile quantization, wave efficiency, split-K, 16-byte alignment on
  compute and memory); convolutions as implicit GEMMs by algorithm class (Tensor Core NHWC with layout
  transposes and channel padding, direct NCHW for fp32 on CUDA cores, depthwise at memory speed).
- **attention**: fused flash attention by query/key blocks, causal or full.
- **normalization**: softmax by row length (warp-per-row up to 1024, block-per-row beyond), row-wise
  norms at `norm_efficiency`, batch norm as its passes over the activation.
- **reduction**, **gather**, **elementwise** (contiguous or broadcast), pooling, **foreach**, and
  **transfer** (``.item()`` and host <-> device copies at the host link's pageable rate).
- **communication**: the collectives an imported profile describes (``record_param_comms``: kind, message
  bytes, group size), by the ring / tree / hierarchical model over NVLink or the network of the GPU table
  (`communication_op`); on the one modeled stream, not overlapped with compute.

A calibrated GPU (`memlens.calibrate`) scales each class's fixed part (floors) and throughput part by the
factors fitted to a real profile (`GPU.class_scale`). The naive roofline (`roofline_op`) is ``max(flops /
peak, bytes / bandwidth)`` per op, with no floors and no efficiencies: the baseline the model is compared
with.
"""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pandas as pd

from memlens.devicetime.collectives import collective_ns
from memlens.devicetime.gpus import DTYPE_TO_KEY, GPU
from memlens.devicetime.rules import attention, gemm, memory, rowwise
from memlens.devicetime.rules.gemm import GEMM_TILES, SPLIT_K
from memlens.devicetime.rules.names import (CLASSES, CONV, MULTI_KERNEL, NORM, POOLING, base_name,
                                            causal_from_args, op_class)
from memlens.devicetime.tf32 import flags, tf32_setting

MODEL_NAME = ("memlens.devicetime v2 (per-op-class: GEMM/conv waves by shape and layout, causal attention, "
              "softmax by row length, host links, calibratable)")

_TENSOR_RE = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_MORE_RE = re.compile(r"\.\.\.\+(\d+)")
# elementwise-class ops with their own indexing kernels (not TensorIterator's vectorized/strided pair)
_OWN_INDEXING = frozenset({"aten::cat", "aten::stack", "aten::_cat"})
_FLOOR_FIELDS = ("launch_ns", "gemm_floor_ns", "gemm_k_ns", "attention_floor_ns")


def parse_shapes(shapes: str) -> tuple[list, list, int]:
    """``"bf16[141,512],bf16[512,512]->bf16[141,512]"`` -> (input tensors, output tensors, tensors left
    out of shortened lists); each tensor is (short dtype, shape tuple)."""
    left, _, right = (shapes or "").partition("->")

    def tensors(text):
        return [(d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _TENSOR_RE.findall(text)]
    more = sum(int(m) for m in _MORE_RE.findall(left))
    return tensors(left), tensors(right), more


def tf32_flags(g: GPU, tf32) -> tuple[bool, bool]:
    """(matmul, conv) TF32 flags on `g` of a `tf32` argument: a bool sets both, a mapping (a clock's
    ``tf32`` entry) each, None takes the defaults for `g`'s vendor (`memlens.devicetime.tf32`)."""
    return flags(tf32_setting(None, None, g.vendor) if tf32 is None else tf32)


def _raw_op(g: GPU, name: str, flops: int, bytes_read: int, bytes_written: int, dtype: str, shapes: str,
            tf32, causal: bool, transfer: str, strided: bool = False) -> tuple[str, int, float]:
    tf32_matmul, tf32_conv = tf32_flags(g, tf32)
    moved = float(bytes_read + bytes_written)
    cls = op_class(name, flops, int(moved))
    if transfer in ("h2d", "d2h") and moved > 0:
        inputs, outputs, _ = parse_shapes(shapes)
        return "transfer", 1, memory.host_copy_ns(g, transfer, inputs, outputs, moved)
    if cls == "none":
        return cls, 0, 0.0
    n = base_name(name)
    inputs, outputs, _ = parse_shapes(shapes)
    kernels = MULTI_KERNEL.get(n, 1)
    if cls == "gemm":
        if n in CONV:
            return (cls,) + gemm.conv_ns(g, n, float(flops), inputs, outputs, dtype, moved, tf32=tf32_conv)
        return cls, kernels, gemm.gemm_ns(g, float(flops), inputs, outputs, dtype, moved, tf32=tf32_matmul)
    if cls == "attention":
        backward = "backward" in n
        ns = attention.attention_ns(g, name, inputs, float(flops), dtype, backward=backward, causal=causal)
        return cls, kernels, ns + (kernels - 1) * g.launch_ns
    if cls == "normalization" and n in NORM:
        return cls, kernels, rowwise.rowwise_ns(g, n, kernels, inputs, outputs, moved, strided)
    if n == "aten::mse_loss":
        return (cls,) + rowwise.mse_loss_ns(g, inputs, outputs, moved)
    if cls == "reduction":
        return cls, kernels, rowwise.reduction_ns(g, kernels, moved)
    if cls == "gather":
        return cls, kernels, memory.gather_ns(g, n, kernels, inputs, outputs, moved)
    if cls == "foreach":
        kernels = memory.foreach_kernels(shapes, moved)
        return cls, kernels, kernels * g.launch_ns + memory.stream_ns(g, moved)
    if cls == "transfer":
        return cls, 1, g.launch_ns
    if n in POOLING:
        return cls, kernels, memory.pooling_ns(g, n, kernels, moved, float(bytes_read), float(bytes_written))
    if n in _OWN_INDEXING:      # its inputs are smaller than its result without being broadcast
        return cls, kernels, kernels * g.launch_ns + memory.stream_ns(g, moved)
    return cls, kernels, memory.elementwise_ns(g, kernels, inputs, outputs, moved, float(flops), dtype, strided)


def model_op(g: GPU, name: str, flops: int, bytes_read: int, bytes_written: int, dtype: str, shapes: str,
             *, tf32=None, causal: bool = False, transfer: str = "", strided: bool = False
             ) -> tuple[str, int, float]:
    """(op class, kernels launched, device ns) of one op on `g`.

    `tf32`: fp32 matmuls and convolutions at the TF32 rate - a bool for both, ``{"matmul": bool, "conv":
    bool}`` for each, None for PyTorch's defaults on `g`'s vendor (matmul off, cuDNN convolutions on; ROCm
    neither).

    `causal`: a fused attention op with a causal mask; `transfer`: "h2d"/"d2h" for a copy over the host
    link; `strided`: an input is not contiguous (elementwise ops lose their vectorized path). On a calibrated GPU (`g.class_scale`), the class's fixed part (what the latency constants
    contribute) and throughput part (the rest) are scaled by the fitted factors.
    """
    cls, kernels, ns = _raw_op(g, name, flops, bytes_read, bytes_written, dtype, shapes, tf32, causal, transfer,
                               strided)
    scale = g.class_scale.get(cls) if g.class_scale else None
    if scale is not None and ns > 0:
        fixed, work = split_parts(g, name, flops, bytes_read, bytes_written, dtype, shapes, tf32=tf32,
                                  causal=causal, transfer=transfer, strided=strided, total=ns)
        ns = float(scale[0]) * fixed + float(scale[1]) * work
    return cls, kernels, ns


def split_parts(g: GPU, name: str, flops: int, bytes_read: int, bytes_written: int, dtype: str, shapes: str,
                *, tf32=None, causal: bool = False, transfer: str = "", strided: bool = False,
                total: float | None = None) -> tuple[float, float]:
    """(fixed ns, throughput ns) of one op on uncalibrated `g`: the throughput part is the op's time with
    every latency constant at 0, the fixed part what the constants add."""
    if total is None:
        total = _raw_op(g, name, flops, bytes_read, bytes_written, dtype, shapes, tf32, causal, transfer, strided)[2]
    bare = replace(g, class_scale={}, **{f: 0.0 for f in _FLOOR_FIELDS})
    work = _raw_op(bare, name, flops, bytes_read, bytes_written, dtype, shapes, tf32, causal, transfer, strided)[2]
    return max(total - work, 0.0), work


def roofline_op(g: GPU, flops: int, bytes_moved: int, dtype: str, *, tf32: bool = False) -> float:
    """Naive roofline: ``max(flops / dense peak, bytes / bandwidth)`` in ns (no floors, no efficiencies);
    `tf32`: an fp32 op's peak is the TF32 one."""
    if flops == 0 and bytes_moved == 0:
        return 0.0
    return max(flops / g.peak_flops(dtype or "float32", tf32=tf32), bytes_moved / g.mem_bw) * 1e9


def has_cost_facts(ops: pd.DataFrame) -> bool:
    """True when the ops table carries cost facts (some op moved bytes or did flops, or a collective moved a
    message)."""
    return any(c in ops.columns and (ops[c] > 0).any() for c in ("bytes_read", "bytes_written", "flops",
                                                                  "collective_bytes"))


_FACTS = ["name", "flops", "bytes_read", "bytes_written", "dtype", "shapes", "causal", "transfer", "strided", "device",
          "collective", "collective_bytes", "group_size"]
COLLECTIVE_FACTS = ("collective", "collective_bytes", "group_size")   # an imported trace's (`memlens.io.kineto.comms`)


_DEFAULTS = {"name": "", "flops": 0, "bytes_read": 0, "bytes_written": 0, "dtype": "", "shapes": "",
             "causal": False, "transfer": "", "strided": False, "device": "", "collective": "",
             "collective_bytes": 0, "group_size": 0}
_COMM_PREFIXES = ("c10d::", "_c10d_functional::")


def communication_op(g: GPU, name: str, collective: str, nbytes: int, group: int) -> tuple[str, int, float]:
    """(class, kernels, ns) of an op of a trace that describes its collectives (`COLLECTIVE_FACTS`): a
    collective of `nbytes` over `group` ranks is priced by the ring / tree / hierarchical model
    (`memlens.devicetime.collectives`; an all-to-all sends (N-1)/N of its message per rank, as an all-gather's
    ring); a c10d op around it launches nothing of its own (its collective is priced once, inside it)."""
    if collective:
        kind = "all_gather" if collective == "all_to_all" else collective
        return "communication", 1, collective_ns(kind, int(nbytes), max(int(group), 1), g)
    return "none", 0, 0.0


def op_facts(ops: pd.DataFrame) -> pd.DataFrame:
    """The columns the model reads, typed and filled (`_FACTS`): the cost facts plus ``causal``,
    ``transfer``, ``strided`` and ``device``. ``causal`` and ``strided`` come from the ops table when it
    has them, else from an imported trace's ``concrete_inputs`` / ``input_strides`` (the profile's scalar
    arguments and strides)."""
    n = len(ops)
    facts = pd.DataFrame({c: (ops[c].to_numpy() if c in ops.columns else np.full(n, _DEFAULTS[c], dtype=object))
                          for c in _FACTS}, index=ops.index)
    if "causal" not in ops.columns and "concrete_inputs" in ops.columns and n:
        facts["causal"] = [causal_from_args(n_, a) for n_, a in zip(ops["name"].astype(str), ops["concrete_inputs"])]
    if "strided" not in ops.columns and "input_strides" in ops.columns and n:
        facts["strided"] = [memory.non_contiguous(parse_shapes(s)[0], st) if isinstance(s, str) else False
                            for s, st in zip(ops["shapes"], ops["input_strides"])]
    for c in _FACTS:     # missing values inside present columns (an object column keeps its dtype)
        facts[c] = facts[c].astype(object).where(facts[c].notna(), _DEFAULTS[c])
    return facts.astype({"flops": "int64", "bytes_read": "int64", "bytes_written": "int64", "dtype": str,
                         "shapes": str, "name": str, "causal": bool, "transfer": str, "strided": bool,
                         "device": str, "collective": str, "collective_bytes": "int64", "group_size": "int64"})


def device_times(ops: pd.DataFrame, gpu: GPU, *, tf32=None) -> pd.DataFrame:
    """Per op of `ops`: op_class (str), kernels (int64), device_ns (int64, modeled duration on `gpu`) and
    roofline_ns (int64, the naive roofline), in the order of `ops`. Ops whose optional ``device`` column
    says "cpu" ran on the host: 0 ns, class "none". Without a ``causal`` column, an imported trace's
    ``concrete_inputs`` say which attention ops are causal, and its ``input_strides`` which operands are
    not contiguous (`op_facts`). `tf32` as in `model_op` (None: PyTorch's defaults for `gpu`'s vendor).
    Computed once per distinct signature."""
    tf32_matmul, tf32_conv = tf32_flags(gpu, tf32)
    resolved = {"matmul": tf32_matmul, "conv": tf32_conv}
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(op_facts(ops)))
    comms = "collective" in ops.columns     # the trace says which ops communicate
    rows = []
    for name, flops, br, bw, dtype, shapes, causal, transfer, strided, device, coll, coll_bytes, group in uniques:
        if device.lower().startswith("cpu"):
            rows.append(("none", 0, 0.0, 0.0))
            continue
        if comms and (coll or name.startswith(_COMM_PREFIXES) or name == "record_param_comms"):
            rows.append(communication_op(gpu, name, coll, coll_bytes, group) + (0.0,))
            continue
        cls, kernels, ns = model_op(gpu, name, int(flops), int(br), int(bw), dtype, shapes, tf32=resolved,
                                    causal=bool(causal), transfer=transfer, strided=bool(strided))
        on_tf32 = tf32_conv if base_name(name) in CONV else tf32_matmul
        rows.append((cls, kernels, ns, roofline_op(gpu, int(flops), int(br) + int(bw), dtype, tf32=on_tf32)))
    if not rows:
        return pd.DataFrame({"op_class": pd.Series(dtype=object), "kernels": pd.Series(dtype=np.int64),
                             "device_ns": pd.Series(dtype=np.int64), "roofline_ns": pd.Series(dtype=np.int64)})
    cls, kernels, ns, roof = (np.asarray(x) for x in zip(*rows))
    return pd.DataFrame({"op_class": cls.astype(object)[codes], "kernels": kernels.astype(np.int64)[codes],
                         "device_ns": np.rint(ns).astype(np.int64)[codes],
                         "roofline_ns": np.rint(roof).astype(np.int64)[codes]}, index=ops.index)


__all__ = ["CLASSES", "GEMM_TILES", "MODEL_NAME", "MULTI_KERNEL", "SPLIT_K", "base_name", "device_times",
           "model_op", "op_class", "roofline_op", "parse_shapes", "has_cost_facts", "split_parts", "op_facts", "DTYPE_TO_KEY"]
