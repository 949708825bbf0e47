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
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from memlens.record.opinfo import METADATA, VIEW, classify

COLUMNS = ("flops", "bytes_read", "bytes_written", "dtype", "shapes")


class TensorMeta(NamedTuple):
    """A tensor as a cost signature sees it: its shape (sizes) and dtype."""

    shape: tuple
    dtype: Any


class CostFacts(NamedTuple):
    """The cost facts of one op call (flops; bytes; dtype name; shapes string)."""

    flops: int
    bytes_read: int
    bytes_written: int
    dtype: str
    shapes: str


# ---- dtypes ------------------------------------------------------------------------------------
# canonical name -> (bytes per element, short name, is floating point)
_DTYPES = {
    "float64": (8, "f64", True), "float32": (4, "f32", True), "float16": (2, "f16", True),
    "bfloat16": (2, "bf16", True), "float8_e4m3fn": (1, "f8e4m3", True), "float8_e5m2": (1, "f8e5m2", True),
    "float8_e4m3fnuz": (1, "f8e4m3", True), "float8_e5m2fnuz": (1, "f8e5m2", True),
    "float8_e8m0fnu": (1, "f8e8m0", True), "float4_e2m1fn_x2": (1, "f4x2", True),
    "complex128": (16, "c128", True), "complex64": (8, "c64", True), "complex32": (4, "c32", True),
    "int64": (8, "i64", False), "int32": (4, "i32", False), "int16": (2, "i16", False),
    "int8": (1, "i8", False), "uint8": (1, "u8", False), "uint16": (2, "u16", False),
    "uint32": (4, "u32", False), "uint64": (8, "u64", False), "bool": (1, "b8", False),
    "quint8": (1, "qu8", False), "qint8": (1, "qi8", False), "qint32": (4, "qi32", False),
}
# other spellings (Kineto's "Input type", C++ names) -> canonical
_ALIASES = {
    "float": "float32", "double": "float64", "half": "float16", "c10::half": "float16",
    "c10::bfloat16": "bfloat16", "long int": "int64", "long": "int64", "int": "int32",
    "short int": "int16", "short": "int16", "signed char": "int8", "unsigned char": "uint8",
    "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
    "c10::float8_e4m3fn": "float8_e4m3fn", "c10::float8_e5m2": "float8_e5m2",
    "c10::float8_e4m3fnuz": "float8_e4m3fnuz", "c10::float8_e5m2fnuz": "float8_e5m2fnuz",
    "long long": "int64", "unsigned int": "uint32",
}
_DTYPE_CACHE: dict = {}


def dtype_name(dtype) -> str:
    """Canonical dtype name (``"bfloat16"``) of a `torch.dtype` or a spelling of one; ``""`` if unknown."""
    hit = _DTYPE_CACHE.get(dtype)
    if hit is not None:
        return hit
    s = str(dtype).strip()
    low = s.lower()
    if low.startswith("torch."):
        low = low[6:]
    name = low if low in _DTYPES else _ALIASES.get(low, "")
    try:
        _DTYPE_CACHE[dtype] = name
    except TypeError:
        pass
    return name


def itemsize(dtype) -> int:
    """Bytes per element of `dtype` (0 when unknown)."""
    return _DTYPES.get(dtype_name(dtype), (0, "", False))[0]


# ---- signatures: what the recorder logs per op ------------------------------------------------------
_TENSOR: list = []


def _tensor_type():
    """torch.Tensor, imported on first use (the dtype helpers above work without torch)."""
    if not _TENSOR:
        import torch
        _TENSOR.append(torch.Tensor)
    return _TENSOR[0]


def signature_value(value):
    """A hashable stand-in for one argument or result: a tensor -> ``(shape, dtype)`` (torch.Size and
    torch.dtype, both hashable), a list/tuple -> a tuple of those, a scalar -> itself, anything else
    unhashable -> its type name. Cheap: this runs once per op in the recorder."""
    if isinstance(value, _tensor_type()):
        return (value.shape, value.dtype)
    t = type(value)
    if t is list or t is tuple:
        return tuple([signature_value(v) for v in value])
    if t is int or t is float or t is bool or t is str or value is None:
        return value
    try:
        hash(value)
        return value
    except TypeError:
        return t.__name__


_SCALAR_TYPES = frozenset({int, float, bool, str, type(None)})


def signature_args(values) -> tuple:
    """`signature_value` of each item of a tuple of arguments, without a call per tensor (the
    recorder's hot path: ~1.5 us for an op with 3 tensor arguments)."""
    tensor, scalars = _tensor_type(), _SCALAR_TYPES
    return tuple([(a.shape, a.dtype) if isinstance(a, tensor) else
                  (a if type(a) in scalars else signature_value(a)) for a in values])


def _is_tensor_meta(x) -> bool:
    if isinstance(x, TensorMeta):
        return True
    if type(x) is not tuple or len(x) != 2:
        return False
    shape, dtype = x
    if not isinstance(shape, tuple) or not all(type(d) is int for d in shape):
        return False
    import torch
    return isinstance(dtype, torch.dtype) or (isinstance(dtype, str) and dtype_name(dtype) != "")


def _tensors(value, out: list) -> list:
    """Flatten the tensor metas inside `value` (a meta, or nested lists/tuples) into `out`."""
    if _is_tensor_meta(value):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, out)
    return out


def _nbytes(meta) -> int:
    n = 1
    for d in meta[0]:
        n *= max(int(d), 0)
    return n * itemsize(meta[1])


def _fmt_tensor(meta) -> str:
    short = _DTYPES.get(dtype_name(meta[1]), (0, "?", False))[1]
    return f"{short}[{','.join(str(int(d)) for d in meta[0])}]"


def _fmt(value) -> str | None:
    """Compact text of the tensors in one argument; None when it holds none."""
    if _is_tensor_meta(value):
        return _fmt_tensor(value)
    if isinstance(value, (list, tuple)):
        metas = _tensors(value, [])
        if not metas:
            return None
        head = ",".join(_fmt_tensor(m) for m in metas[:3])
        more = f",...+{len(metas) - 3}" if len(metas) > 3 else ""
        return f"[{head}{more}]"
    return None


def shapes_string(args, kwargs, out) -> str:
    """``"bf16[141,512],bf16[512,512]->bf16[141,512]"``: tensor arguments, then tensor results."""
    parts = [p for p in (_fmt(a) for a in list(args) + list((kwargs or {}).values())) if p]
    outs = out if isinstance(out, (list, tuple)) and not _is_tensor_meta(out) else (out,)
    res = [p for p in (_fmt(o) for o in outs) if p]
    return ",".join(parts) + ("->" + ",".join(res) if res else "")


# ---- op resolution -----------------------------------------------------------------------------
# CPU spellings of ops that torch's registry knows under their CUDA name (same argument layout)
_FLOP_ALIASES = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_fused_attention_overrideable": "_scaled_dot_product_flash_attention",
    "aten::mkldnn_convolution": "convolution_overrideable",
}
# Metadata ops that allocate without writing a byte (no kernel runs)
_ALLOC_ONLY = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
    "aten::resize_", "aten::resize_as_", "aten::set_", "aten::record_stream",
})
_RESOLVED: dict = {}


def resolve_op(op):
    """The `OpOverload` for `op`: an OpOverload (returned as is), an OpOverloadPacket (its default), or
    a name ``"aten::mm"`` / ``"aten::add.Tensor"`` / ``"aten.add.Tensor"``; None when unknown."""
    if not isinstance(op, str):
        if hasattr(op, "_overloadpacket"):
            return op
        default = getattr(op, "default", None)
        return default if default is not None else None
    hit = _RESOLVED.get(op, False)
    if hit is not False:
        return hit
    import torch
    text = op.replace("::", ".")
    ns, _, rest = text.partition(".")
    name, _, overload = rest.partition(".")
    found = None
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        found = getattr(packet, overload or "default", None)
        if found is None and not overload:
            overloads = packet.overloads()
            found = getattr(packet, overloads[0]) if overloads else None
    except (AttributeError, RuntimeError):
        found = None
    _RESOLVED[op] = found
    return found


def _flop_function(func, name: str):
    from torch.utils.flop_counter import flop_registry
    packet = getattr(func, "_overloadpacket", None)
    fn = flop_registry.get(packet) if packet is not None else None
    if fn is None and name in _FLOP_ALIASES:
        import torch
        fn = flop_registry.get(getattr(torch.ops.aten, _FLOP_ALIASES[name], None))
    return fn


def _as_shapes(value):
    """Signature value -> what flop formulas expect: tensors as torch.Size, lists kept."""
    import torch
    if _is_tensor_meta(value):
        return torch.Size(int(d) for d in value[0])
    if isinstance(value, (list, tuple)):
        items = [_as_shapes(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def count_flops(op, args, kwargs=None, out=None) -> int:
    """Flops of one call from torch's flop registry (0 when the op is not in it or its formula fails)."""
    func = resolve_op(op)
    if func is None:
        return 0
    name = _op_name(func)
    fn = _flop_function(func, name)
    if fn is None:
        return 0
    try:
        value = fn(*_as_shapes(tuple(args)), out_val=_as_shapes(out), **{k: _as_shapes(v) for k, v in
                                                                        (kwargs or {}).items()})
        return max(int(value), 0)
    except Exception:  # a formula that cannot read these arguments: no flops rather than a failed trace
        return 0


def _op_name(func) -> str:
    schema = getattr(func, "_schema", None)
    return schema.name if schema is not None else str(func)


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
    shapes = shapes_string(args, kwargs, out)
    arg_metas = _tensors(tuple(args), []) + _tensors(tuple(v for k, v in kwargs.items() if k not in kw_writes), [])
    outs = out if isinstance(out, (list, tuple)) and not _is_tensor_meta(out) else (out,)
    dtype = _dominant_dtype(arg_metas, _tensors(tuple(outs), []))
    if kind == VIEW:
        return CostFacts(0, 0, 0, dtype, shapes)
    # bytes written: schema-written arguments, plus fresh results (in-place results alias `self`)
    written = 0
    for i, w in enumerate(pos_writes):
        if w and i < len(args):
            written += sum(_nbytes(m) for m in _tensors(args[i], []))
    for k in kw_writes:
        if k in kwargs:
            written += sum(_nbytes(m) for m in _tensors(kwargs[k], []))
    for i, o in enumerate(outs):
        if i >= len(fresh) and func is not None:
            break
        if func is None or fresh[i]:
            written += sum(_nbytes(m) for m in _tensors(o, []))
    if kind == METADATA:
        return CostFacts(0, 0, 0 if name in _ALLOC_ONLY else written, dtype, shapes)
    if name in _ALLOC_ONLY:
        return CostFacts(0, 0, 0, dtype, shapes)
    read = sum(_nbytes(m) for m in arg_metas)
    # out= arguments are written, never read; written positional args (in-place self) are also read
    flops = count_flops(func if func is not None else op, args, kwargs, out)
    return CostFacts(flops, read, written, dtype, shapes)


def _dominant_dtype(arg_metas: list, out_metas: list) -> str:
    def largest(metas, floating_only):
        best, best_bytes = "", -1
        for m in metas:
            name = dtype_name(m[1])
            if floating_only and not _DTYPES.get(name, (0, "", False))[2]:
                continue
            b = _nbytes(m)
            if b > best_bytes:
                best, best_bytes = name, b
        return best
    return largest(arg_metas, True) or largest(out_metas, False) or largest(arg_metas, False)


# ---- signatures logged by the compiled recorder -------------------------------------------------------
# c10::ScalarType in enum order (c10/core/ScalarType.h): the dtype codes recorder.cpp writes
SCALAR_TYPE_NAMES = (
    "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex32", "complex64",
    "complex128", "bool", "qint8", "quint8", "qint32", "bfloat16", "quint4x2", "quint2x4", "bits1x8", "bits2x4",
    "bits4x2", "bits8", "bits16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz",
    "uint16", "uint32", "uint64",
)


def _from_compiled(value):
    """One decoded compiled-recorder value -> the signature form `op_costs` reads."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "tensor":
        code, shape = value[1], value[2]
        name = SCALAR_TYPE_NAMES[code] if 0 <= code < len(SCALAR_TYPE_NAMES) else ""
        return None if shape is None else (tuple(shape), name)
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "scalar":
        return 1                        # a Python number wrapped as a 0-d tensor: a scalar argument
    if isinstance(value, list):
        return tuple(_from_compiled(v) for v in value)
    return value


def compiled_record(name: str, inputs: list, outputs: list) -> tuple:
    """``(op, args, kwargs, out)`` for `facts_table` from one signature decoded by
    `memlens.record.compiled.decode_signature` (tensors as ("tensor", ScalarType code, shape))."""
    values = [_from_compiled(v) for v in inputs]
    outs = tuple(_from_compiled(v) for v in outputs)
    # the compiled recorder logs every schema argument in order; keyword-only ones (addmm's beta/alpha,
    # out=) go back to keywords, as a Python call passes them
    func = resolve_op(name)
    schema = getattr(func, "_schema", None)
    kwargs = {}
    if schema is not None and len(schema.arguments) == len(values):
        positional = []
        for arg, value in zip(schema.arguments, values):
            if arg.kwarg_only:
                kwargs[arg.name] = value
            else:
                positional.append(value)
        values = positional
    return name, tuple(values), kwargs, (outs[0] if len(outs) == 1 else outs)


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
    rows = [op_costs(op, args, kwargs, out) for op, args, kwargs, out in records]
    if not rows:
        return pd.DataFrame({"flops": pd.Series(dtype="int64"), "bytes_read": pd.Series(dtype="int64"),
                             "bytes_written": pd.Series(dtype="int64"), "dtype": pd.Series(dtype=object),
                             "shapes": pd.Series(dtype=object)})
    flops, read, written, dtype, shapes = zip(*rows)
    return pd.DataFrame({"flops": np.asarray(flops, dtype=np.int64), "bytes_read": np.asarray(read, dtype=np.int64),
                         "bytes_written": np.asarray(written, dtype=np.int64),
                         "dtype": np.asarray(dtype, dtype=object), "shapes": np.asarray(shapes, dtype=object)})


def per_op_columns(facts: pd.DataFrame, signature_index: np.ndarray) -> dict:
    """The op-table columns for ops whose signature numbers are `signature_index` (-1: no signature,
    e.g. a view op: zeros and empty strings)."""
    n = len(signature_index)
    idx = np.asarray(signature_index, dtype=np.int64)
    has = idx >= 0
    safe = np.where(has, idx, 0)
    out = {}
    for col in ("flops", "bytes_read", "bytes_written"):
        values = facts[col].to_numpy(dtype=np.int64) if len(facts) else np.zeros(1, np.int64)
        out[col] = np.where(has, values[safe] if len(facts) else 0, 0).astype(np.int64)
    for col in ("dtype", "shapes"):
        values = facts[col].to_numpy(dtype=object) if len(facts) else np.asarray([""], dtype=object)
        out[col] = np.where(has, values[safe] if len(facts) else "", "").astype(object) if n else \
            np.empty(0, dtype=object)
    return out
