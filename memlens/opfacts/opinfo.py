"""What an ATen op does to its tensor arguments, read once per op overload from its schema and cached.

- VIEW ops (a return aliases an input without writing it: ``view``, ``t``, ``expand``, ``detach``,
  ``as_strided``, ``split`` ...) touch no bytes: no accesses at all.
- METADATA ops read only the shape/dtype of their inputs (``empty_like``, ``new_zeros``, ``sym_size``
  ...): inputs are not read, fresh outputs are written.
- Everything else reads its tensor inputs and writes its fresh outputs; arguments annotated
  ``Tensor(a!)`` (in-place ``self``, ``out=``) are writes.
"""
from __future__ import annotations

from typing import NamedTuple

NORMAL, VIEW, METADATA = 0, 1, 2

# Ops that read no tensor bytes although their schema does not say so.
_METADATA_NAMES = frozenset({
    "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset",
    "aten::size", "aten::stride", "aten::numel", "aten::dim", "aten::storage_offset",
    "aten::is_same_size", "aten::_has_compatible_shallow_copy_type", "aten::is_contiguous",
    "aten::empty_like", "aten::empty_strided", "aten::empty", "aten::new_empty",
    "aten::new_empty_strided", "aten::new_zeros", "aten::new_ones", "aten::new_full",
    "aten::zeros_like", "aten::ones_like", "aten::full_like", "aten::rand_like", "aten::randn_like",
    "aten::randint_like", "aten::resize_as_", "aten::record_stream",
})

# Ops whose schema omits a mutation: batch norm updates running_mean/var (args 3 and 4) when its
# `training` argument (index 5; None = always) is true.
SCHEMA_OMITTED_WRITES = {
    "aten::native_batch_norm": ((3, 4), 5),
    "aten::cudnn_batch_norm": ((3, 4), 5),
    "aten::miopen_batch_norm": ((3, 4), 5),
    "aten::_batch_norm_with_update": ((3, 4), None),
}


# Ops that can give their `self` a new allocation under the same storage (realloc in place).
RESIZING_NAMES = frozenset({"aten::resize_", "aten::resize_as_", "aten::set_", "aten::_resize_output_"})


class OpInfo(NamedTuple):
    """Cached facts about one op overload."""

    name: str                    # "aten::mm" (profiler spelling, no overload)
    kind: int                    # NORMAL, VIEW or METADATA
    pos_writes: tuple            # per positional argument: True when written; () when none is
    kw_writes: frozenset         # keyword argument names that are written (out=, ...)
    write_if_arg: int = -1       # >= 0: pos_writes apply only when this positional argument is true
    resizes: bool = False        # may swap `self`'s allocation (resize_, set_): checked after the op


def classify(func) -> OpInfo:
    """Read `func`'s schema into an OpInfo (works for any OpOverload; unknown shapes -> NORMAL)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return OpInfo(str(func), NORMAL, (), frozenset())
    name = schema.name
    pos, kw = [], set()
    for arg in schema.arguments:
        written = bool(arg.alias_info is not None and arg.alias_info.is_write)
        if arg.kwarg_only:
            if written:
                kw.add(arg.name)
        else:
            pos.append(written)
    omitted, condition = SCHEMA_OMITTED_WRITES.get(name, ((), None))
    for i in omitted:
        if i < len(pos):
            pos[i] = True
    any_write = any(pos) or bool(kw)
    aliases_input = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    if aliases_input and not any_write:
        kind = VIEW
    elif name in _METADATA_NAMES:
        kind = METADATA
    else:
        kind = NORMAL
    return OpInfo(name, kind, tuple(pos) if any(pos) else (), frozenset(kw),
                  -1 if condition is None else condition, name in RESIZING_NAMES)


_CLASSIFIED: dict[int, tuple] = {}


def classify_cached(func) -> OpInfo:
    """`classify`, remembered for the process (op overloads are immortal, so `id` is a stable key)."""
    hit = _CLASSIFIED.get(id(func))
    if hit is not None and hit[0] is func:
        return hit[1]
    info = classify(func)
    _CLASSIFIED[id(func)] = (func, info)
    return info
