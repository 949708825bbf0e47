"""How an op call is logged as a *signature* while recording, and how a signature's tensors are read back.

A signature stands in for the call's arguments and results without the tensors: each tensor becomes
``(shape, dtype)`` (a `TensorMeta`, or a plain 2-tuple), lists of them tuples, scalars themselves. The
recorder logs one per op (`signature_args`, `signature_value`: its hot path); the cost facts
(`memlens.opfacts.costs`) read the tensors back (`tensor_metas`, `tensor_nbytes`, `shapes_string`).
"""
from __future__ import annotations

from typing import Any, NamedTuple

from memlens.opfacts.dtypes import dtype_name, itemsize, short_dtype_name


class TensorMeta(NamedTuple):
    """A tensor as a cost signature sees it: its shape (sizes) and dtype."""

    shape: tuple
    dtype: Any


_TENSOR: list = []


def _tensor_type():
    """torch.Tensor, imported on first use (importing this module needs no torch)."""
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


def is_tensor_meta(x) -> bool:
    """Whether `x` is one tensor of a signature: a `TensorMeta`, or a ``(shape of ints, dtype)`` pair whose
    dtype is a `torch.dtype` or a known spelling of one."""
    if isinstance(x, TensorMeta):
        return True
    if type(x) is not tuple or len(x) != 2:
        return False
    shape, dtype = x
    if not isinstance(shape, tuple) or not all(type(d) is int for d in shape):
        return False
    import torch
    return isinstance(dtype, torch.dtype) or (isinstance(dtype, str) and dtype_name(dtype) != "")


def tensor_metas(value, out: list) -> list:
    """Flatten the tensor metas inside `value` (a meta, or nested lists/tuples) into `out`."""
    if is_tensor_meta(value):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            tensor_metas(v, out)
    return out


def tensor_nbytes(meta) -> int:
    """Bytes of one tensor meta: element count x element size (0 for an unknown dtype)."""
    n = 1
    for d in meta[0]:
        n *= max(int(d), 0)
    return n * itemsize(meta[1])


def _fmt_tensor(meta) -> str:
    return f"{short_dtype_name(meta[1])}[{','.join(str(int(d)) for d in meta[0])}]"


def _fmt(value) -> str | None:
    """Compact text of the tensors in one argument; None when it holds none."""
    if is_tensor_meta(value):
        return _fmt_tensor(value)
    if isinstance(value, (list, tuple)):
        metas = tensor_metas(value, [])
        if not metas:
            return None
        head = ",".join(_fmt_tensor(m) for m in metas[:3])
        more = f",...+{len(metas) - 3}" if len(metas) > 3 else ""
        return f"[{head}{more}]"
    return None


def results_of(out) -> tuple:
    """The results of a signature's `out` as a tuple: one tensor meta (or None) -> a 1-tuple, a
    list/tuple of results as it is."""
    return out if isinstance(out, (list, tuple)) and not is_tensor_meta(out) else (out,)


def shapes_string(args, kwargs, out) -> str:
    """``"bf16[141,512],bf16[512,512]->bf16[141,512]"``: tensor arguments, then tensor results."""
    parts = [p for p in (_fmt(a) for a in list(args) + list((kwargs or {}).values())) if p]
    res = [p for p in (_fmt(o) for o in results_of(out)) if p]
    return ",".join(parts) + ("->" + ",".join(res) if res else "")
