"""A faster cache key for FakeTensorMode's dispatch cache (the largest per-op cost of a prediction).

FakeTensorMode caches each op's output metadata under a key made from the op and its arguments' metadata.
torch builds that key in Python through dataclasses and generic recursion (`_prep_args_for_hash`,
`extract_tensor_metadata`, `TensorMetadata._flatten_into`): on the cs336 forward about 0.3 ms of the
~0.6 ms an op costs under fake tensors. This module builds an equivalent key directly: for every fake
tensor argument the same facts torch's key holds (dtype, shape, strides, device, layout, storage offset,
storage bytes, requires_grad, conj/neg bits, inference flag; the memory format torch adds follows from
shape and strides), for other arguments their type and value, plus the same global state (default dtype,
default device, inference mode). Everything after the key (validation, what is cached, how outputs are
rebuilt from an entry: views, in-place results, fresh tensors) stays torch's own code. Whatever this
key builder does not know (SymInts, callables, graph modules, sparse tensors, nested containers other than
list/tuple) falls back to torch's key builder, and the cases torch refuses to cache (constants, non-fake
tensors, fake tensors of another mode) raise torch's own bypass exception, so behaviour is unchanged.

Keys start with a marker object, so they never collide with keys torch builds for other FakeTensorModes
(the cache dict is shared by the class).
"""
from __future__ import annotations

import types

import torch
from torch._subclasses.fake_tensor import (
    FakeTensor, _BypassDispatchCache, _DispatchCacheKey,
)

_MARK = object()     # first element of every key built here
_SCALAR_TYPES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
                           torch.layout})
_STRIDED = torch.strided
_SIZE = torch.Size       # a shape passed as an argument (``x.view(y.shape)``): a tuple, typed as torch types it
Tensor = torch.Tensor


class _Unknown(Exception):
    """An argument this key builder does not handle: use torch's."""


def _flatten(mode, out: list, seq) -> None:
    append = out.append
    for a in seq:
        tp = type(a)
        if tp is FakeTensor:
            if a.fake_mode is not mode:
                raise _BypassDispatchCache("not our fake")
            if a.constant is not None:
                raise _BypassDispatchCache("constant attribute")
            if a.layout is not _STRIDED:
                raise _Unknown
            append(a.dtype); append(a.shape); append(a.stride()); append(a.fake_device)
            append(a.storage_offset()); append(a.untyped_storage().nbytes()); append(a.requires_grad)
            append(a.is_conj()); append(a.is_neg()); append(a.is_inference())
        elif tp in _SCALAR_TYPES:
            append(tp); append(a)
        elif tp is list or tp is tuple or tp is _SIZE:
            append(tp); append(len(a))
            _flatten(mode, out, a)
        elif isinstance(a, Tensor):
            if isinstance(a, FakeTensor):      # a subclass of FakeTensor: torch's way
                raise _Unknown
            raise _BypassDispatchCache("non-fake tensor")
        else:
            raise _Unknown


def install(mode) -> None:
    """Give this FakeTensorMode instance the faster key builder (torch's stays as the fallback)."""
    original = mode._cache_key
    get_default_dtype = torch.get_default_dtype
    get_default_device = torch._C._get_default_device
    inference = torch.is_inference_mode_enabled
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    def _cache_key(self, state, func, args, kwargs):
        if self.shape_env is not None or get_proxy_mode() is not None:
            return original(state, func, args, kwargs)
        values = [_MARK, func, get_default_dtype(), get_default_device(), inference()]
        try:
            if args:
                _flatten(self, values, args)
            if kwargs:
                for name, value in kwargs.items():
                    values.append(name)
                    _flatten(self, values, (value,))
        except _Unknown:
            return original(state, func, args, kwargs)
        return _DispatchCacheKey(tuple(values))

    mode._cache_key = types.MethodType(_cache_key, mode)
