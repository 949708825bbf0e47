"""Per-op cost facts: flops, bytes read and written, the dominant compute dtype and a compact shapes
string, computed from an op's name and the shapes/dtypes of its tensor arguments and results.

Nothing here needs the tensors themselves, so a recorder can log only *signatures* while it runs
(op, each tensor argument as ``(shape, dtype)``, the few scalar arguments, the results' shapes) and
compute the facts later, once per distinct signature (`CostCache`). The Python recorder does this; a
compiled recorder can do the same from whatever it logged (dtypes may be `torch.dtype`, their names
``"bfloat16"``/``"torch.bfloat16"`` or Kineto's ``"c10::BFloat16"``/``"float"``/``"long int"``).

What the numbers mean:
- ``flops``: floating-point operations (a multiply-add is 2) of matmul, convolution and attention ops,
  from PyTorch's own formulas (`torch.utils.flop_counter.flop_registry`, the numbers `FlopCounterMode`
  reports); 0 for every other op, whose cost on a GPU is memory traffic and launches, not arithmetic.
- ``bytes_read``: bytes of the tensor arguments the op reads (element count x element size of each
  tensor as passed, i.e. what a kernel streams; a view of a big storage counts the view's elements).
  ``out=`` arguments are not read; view ops and metadata ops (``empty_like``, ``sym_size`` ...) read 0.
- ``bytes_written``: bytes of the arguments the schema marks as written (in-place ``self``, ``out=``,
  batch norm's running stats) plus the results that are fresh tensors (not aliases of an input).
  View ops and allocation-only ops (``empty``, ``empty_like`` ...) write 0.
- ``dtype``: the dtype of the largest floating-point tensor argument (by bytes); else of the largest
  result; else of the largest argument. Empty for ops without tensors.
- ``shapes``: ``"bf16[141,512],bf16[512,512]->bf16[141,512]"`` (arguments, then results; lists of
  more than 3 tensors are shortened to the first 3 and a count).

The pieces: dtype spellings in `memlens.opfacts.dtypes`, signatures and their tensors in
`memlens.opfacts.signatures`, op resolution and flops in `memlens.opfacts.flops`; the names they export are
importable from here too. This package sits below both producers of traces: the recorder
(`memlens.recording`, which re-exports it as `memlens.recording.costs`) and the Kineto importer
(`memlens.io.kineto.facts`) compute the same facts with it.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from memlens.opfacts.convshape import conv_arguments, conv_flops, infer_conv_result, is_forward_convolution
from memlens.opfacts.dtypes import SCALAR_TYPE_NAMES, dtype_name, is_floating, itemsize
from memlens.opfacts.flops import count_flops, resolve_op
from memlens.opfacts.opinfo import METADATA, VIEW, classify
from memlens.opfacts.signatures import (TensorMeta, is_tensor_meta, results_of, shapes_string, signature_args,
                                       signature_value, tensor_metas, tensor_nbytes)

# re-exported: callers import these from here (the recorder session, the trace builder, tests)
__all__ = ["COLUMNS", "CostCache", "CostFacts", "SCALAR_TYPE_NAMES", "TensorMeta", "count_flops",
           "dtype_name", "facts_columns", "facts_frame", "facts_table", "itemsize", "op_costs", "per_op_columns",
           "resolve_op", "shapes_string", "signature_args", "signature_value"]

COLUMNS = ("flops", "bytes_read", "bytes_written", "dtype", "shapes")


class CostFacts(NamedTuple):
    """The cost facts of one op call (flops; bytes; dtype name; shapes string)."""

    flops: int
    bytes_read: int
    bytes_written: int
    dtype: str
    shapes: str


# Metadata ops that allocate without writing a byte (no kernel runs)
_ALLOC_ONLY = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
    "aten::resize_", "aten::resize_as_", "aten::set_", "aten::record_stream",
})


class _OpFacts(NamedTuple):
    name: str
    kind: int
    pos_writes: tuple
    kw_writes: frozenset
    fresh_returns: tuple      # per result: True when it is a new tensor, not an alias of an input


_OP_FACTS: dict = {}


def _op_facts(func) -> _OpFacts:
    key = id(func)
    hit = _OP_FACTS.get(key)
    if hit is not None and hit[0] is func:
        return hit[1]
    info = classify(func)
    schema = getattr(func, "_schema", None)
    fresh = tuple(r.alias_info is None for r in schema.returns) if schema is not None else ()
    facts = _OpFacts(info.name, info.kind, info.pos_writes, info.kw_writes, fresh)
    _OP_FACTS[key] = (func, facts)
    return facts


def op_costs(op, args, kwargs=None, out=None) -> CostFacts:
    """Cost facts of one op call.

    Args:
        op: an `OpOverload`, a packet, or a name (``"aten::addmm"``, ``"aten::add.Tensor"``).
        args: positional arguments with tensors as ``(shape, dtype)`` (or `TensorMeta`); lists of them
            for list arguments; scalars as themselves (conv's ``transposed``, ``stride`` ...).
        kwargs: keyword arguments, same form (``out=`` tensors are written, not read).
        out: the result(s): one tensor meta, or a tuple/list of them (None when the op returns nothing).
    Returns `CostFacts` (flops; bytes_read / bytes_written in bytes; dtype name; shapes string).
    """
    kwargs = kwargs or {}
    func = resolve_op(op)
    if func is None:
        name, kind, pos_writes, kw_writes, fresh = str(op), 0, (), frozenset(), ()
    else:
        name, kind, pos_writes, kw_writes, fresh = _op_facts(func)
    if out is None and func is not None and is_forward_convolution(name):
        # backend convolutions have no meta kernel, so a profile logs them without a result: work it out
        out = infer_conv_result([a.name for a in func._schema.arguments], tuple(args), kwargs)
    shapes = shapes_string(args, kwargs, out)
    read_kwargs = tuple(v for k, v in kwargs.items() if k not in kw_writes)
    arg_metas = tensor_metas(tuple(args), []) + tensor_metas(read_kwargs, [])
    outs = results_of(out)
    dtype = _dominant_dtype(arg_metas, tensor_metas(tuple(outs), []))
    if kind == VIEW:
        return CostFacts(0, 0, 0, dtype, shapes)
    # bytes written: schema-written arguments, plus fresh results (in-place results alias `self`)
    written = 0
    for i, w in enumerate(pos_writes):
        if w and i < len(args):
            written += sum(tensor_nbytes(m) for m in tensor_metas(args[i], []))
    for k in kw_writes:
        if k in kwargs:
            written += sum(tensor_nbytes(m) for m in tensor_metas(kwargs[k], []))
    for i, o in enumerate(outs):
        if i >= len(fresh) and func is not None:
            break
        if func is None or fresh[i]:
            written += sum(tensor_nbytes(m) for m in tensor_metas(o, []))
    if kind == METADATA:
        return CostFacts(0, 0, 0 if name in _ALLOC_ONLY else written, dtype, shapes)
    if name in _ALLOC_ONLY:
        return CostFacts(0, 0, 0, dtype, shapes)
    read = sum(tensor_nbytes(m) for m in arg_metas)
    # out= arguments are written, never read; written positional args (in-place self) are also read
    flops = count_flops(func if func is not None else op, args, kwargs, out)
    if flops == 0 and func is not None and out is not None and is_forward_convolution(name):
        flops = _convolution_flops(func, args, kwargs, out)     # a backend op the flop registry lacks
    return CostFacts(flops, read, written, dtype, shapes)


def _convolution_flops(func, args, kwargs, out) -> int:
    found = conv_arguments([a.name for a in func._schema.arguments], tuple(args), kwargs)
    result = results_of(out)
    if found is None or not result or not is_tensor_meta(result[0]):
        return 0
    return conv_flops(tuple(found["input"][0]), tuple(found["weight"][0]), tuple(result[0][0]),
                      bool(found["transposed"]))


def _dominant_dtype(arg_metas: list, out_metas: list) -> str:
    def largest(metas, floating_only):
        best, best_bytes = "", -1
        for m in metas:
            name = dtype_name(m[1])
            if floating_only and not is_floating(name):
                continue
            b = tensor_nbytes(m)
            if b > best_bytes:
                best, best_bytes = name, b
        return best
    return largest(arg_metas, True) or largest(out_metas, False) or largest(arg_metas, False)


# ---- deduplicated facts for a whole recording ---------------------------------------------------------
class CostCache:
    """Signatures seen during a recording, each stored once; facts computed once per signature.

    The recorder calls `index(key, op, args, kwargs, out)` per op (cheap: a dict lookup) and keeps the
    returned integer; `facts()` computes the table, one row per signature, at the end.
    """

    def __init__(self):
        self._index: dict = {}
        self.records: list = []      # (op, args, kwargs, out) per signature, in first-seen order

    def __len__(self) -> int:
        return len(self.records)

    def index(self, key, op, args, kwargs, out) -> int:
        """Integer of signature `key` (any hashable that determines the facts), adding it when new."""
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.records)
            self.records.append((op, args, kwargs, out))
        return i

    def facts(self) -> pd.DataFrame:
        """One row per signature: the `COLUMNS` (flops, bytes_read, bytes_written int64; dtype, shapes str)."""
        return facts_table(self.records)


def facts_table(records) -> pd.DataFrame:
    """Cost facts of many calls: `records` is a sequence of ``(op, args, kwargs, out)`` (see `op_costs`).
    Returns a DataFrame with one row per record and the columns of `COLUMNS`."""
    return facts_frame([op_costs(op, args, kwargs, out) for op, args, kwargs, out in records])


def facts_frame(rows) -> pd.DataFrame:
    """The `facts_table` DataFrame of `CostFacts` rows already computed (one row per call, in order)."""
    if not rows:
        return pd.DataFrame({"flops": pd.Series(dtype="int64"), "bytes_read": pd.Series(dtype="int64"),
                             "bytes_written": pd.Series(dtype="int64"), "dtype": pd.Series(dtype=object),
                             "shapes": pd.Series(dtype=object)})
    return pd.DataFrame(facts_columns(rows))


def facts_columns(rows) -> dict:
    """`CostFacts` rows as columns: {flops, bytes_read, bytes_written: int64 arrays; dtype, shapes: object
    arrays}, one value per row (the arrays `facts_frame` holds, without building a frame)."""
    if not rows:
        return {"flops": np.empty(0, np.int64), "bytes_read": np.empty(0, np.int64),
                "bytes_written": np.empty(0, np.int64), "dtype": np.empty(0, object), "shapes": np.empty(0, object)}
    flops, read, written, dtype, shapes = zip(*rows)
    return {"flops": np.asarray(flops, dtype=np.int64), "bytes_read": np.asarray(read, dtype=np.int64),
            "bytes_written": np.asarray(written, dtype=np.int64), "dtype": np.asarray(dtype, dtype=object),
            "shapes": np.asarray(shapes, dtype=object)}


def per_op_columns(facts, signature_index: np.ndarray) -> dict:
    """The op-table columns for ops whose signature numbers are `signature_index` (-1: no signature,
    e.g. a view op: zeros and empty strings). `facts`: the `facts_table` DataFrame or `facts_columns`."""
    n = len(signature_index)
    idx = np.asarray(signature_index, dtype=np.int64)
    has = idx >= 0
    safe = np.where(has, idx, 0)
    n_facts = len(facts["flops"])
    out = {}
    for col in ("flops", "bytes_read", "bytes_written"):
        values = np.asarray(facts[col], dtype=np.int64) if n_facts else np.zeros(1, np.int64)
        out[col] = np.where(has, values[safe] if n_facts else 0, 0).astype(np.int64)
    for col in ("dtype", "shapes"):
        values = np.asarray(facts[col], dtype=object) if n_facts else np.asarray([""], dtype=object)
        out[col] = np.where(has, values[safe] if n_facts else "", "").astype(object) if n else \
            np.empty(0, dtype=object)
    return out
