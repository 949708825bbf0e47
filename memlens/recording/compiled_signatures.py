"""How a signature the compiled recorder logged becomes the ``(op, args, kwargs, out)`` that
`memlens.recording.costs.op_costs` reads.

`decode_signature` gives each tensor as ``("tensor", ScalarType code, shape)``
and a wrapped Python number as ``("scalar", ...)``; here tensors become ``(shape, dtype name)`` and the
schema's keyword-only arguments go back to keywords, as a Python call passes them.
"""
from __future__ import annotations

import struct

from memlens.opfacts.dtypes import SCALAR_TYPE_NAMES
from memlens.opfacts.flops import resolve_op


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
    `decode_signature` (tensors as ("tensor", ScalarType code, shape))."""
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


# Cost facts per distinct signature, kept for the process: a signature's bytes (the op's name, then each
# argument's dtype code and shape, or its scalar value) determine its facts, and a notebook records the same
# step again and again; computing them (schema lookups, flop formulas) costs ~50-100 us per signature.
_FACTS_BY_SIGNATURE: dict = {}
_FACTS_CACHE_LIMIT = 1 << 16     # signatures kept at most (~200 bytes each); the cache restarts past it


# The same facts by signature with float scalars left out, for ops without a flop formula: their facts read
# tensors only (bytes, dtype, shapes), and an optimizer's float arguments change every step (AdamW's step size
# in addcdiv_), which made ~10 new signatures per recorded step of a small GPT (~0.5 ms of its close)
_FACTS_BY_SHAPES: dict = {}
_SHAPES_ONLY: dict = {}          # op name -> facts read tensors only (no flop formula)


def signature_facts(signatures: list, op_names: list, decode) -> list:
    """The `CostFacts` of each compiled-recorder signature (raw bytes, in signature-number order).
    `decode(i)` gives signature i as `decode_signature` does; it is called only for signatures this
    process has not computed facts for yet (the key is the op's name and the bytes after the name word,
    so recordings with other op numberings share entries; for an op whose facts read tensors only, a
    signature that differs from a known one in float arguments alone takes that one's facts)."""
    from memlens.opfacts.costs import op_costs
    cache = _FACTS_BY_SIGNATURE
    if len(cache) > _FACTS_CACHE_LIMIT:
        cache.clear()
    if len(_FACTS_BY_SHAPES) > _FACTS_CACHE_LIMIT:
        _FACTS_BY_SHAPES.clear()
    rows = []
    for i, raw in enumerate(signatures):
        key = (op_names[int.from_bytes(raw[:8], "little", signed=True)], raw[8:])
        facts = cache.get(key)
        if facts is None:
            decoded = decode(i)
            shapes_key = (key[0], _without_floats(decoded[1:])) if _shapes_only(key[0]) else None
            facts = _FACTS_BY_SHAPES.get(shapes_key) if shapes_key is not None else None
            if facts is None:
                facts = op_costs(*compiled_record(*decoded))
                if shapes_key is not None:
                    _FACTS_BY_SHAPES[shapes_key] = facts
            cache[key] = facts
        rows.append(facts)
    return rows


def _shapes_only(name: str) -> bool:
    """Whether an op's cost facts read its tensors only: it has no flop formula (a formula may read any
    argument)."""
    known = _SHAPES_ONLY.get(name)
    if known is None:
        from memlens.opfacts.flops import _flop_function, op_name
        func = resolve_op(name)
        known = _SHAPES_ONLY[name] = func is not None and _flop_function(func, op_name(func)) is None
    return known


def _without_floats(value):
    """A decoded signature value, hashable, with every float replaced by one marker."""
    if isinstance(value, float):
        return float
    if isinstance(value, (list, tuple)):
        return tuple(_without_floats(v) for v in value)
    return value


_T, _L, _W, _I, _D, _B, _N, _BAR = (ord(c) for c in "TLWIDBN|")
_WORD, _DOUBLE = struct.Struct("<q"), struct.Struct("<d")


def decode_signature(raw: bytes, op_names: list) -> tuple:
    """Decode one signature from recorder.cpp into (op name, inputs, outputs)."""
    # Python ints, not numpy scalars: a signature is tens of words read one by one (~3x faster)
    words = struct.unpack(f"<{len(raw) // 8}q", raw)

    def read(w, i):
        tag = w[i]
        if tag == _T:
            dtype, ndim = w[i + 1], w[i + 2]
            if ndim < 0:
                return ("tensor", dtype, None), i + 3
            return ("tensor", dtype, w[i + 3:i + 3 + ndim]), i + 3 + ndim
        if tag == _L:
            k = w[i + 1]
            items, j = [], i + 2
            for _ in range(k):
                item, j = read(w, j)
                items.append(item)
            return items, j
        if tag == _W:       # a Python number wrapped as a 0-d tensor by the binding
            return ("scalar", w[i + 1]), i + 2
        if tag == _I:
            return w[i + 1], i + 2
        if tag == _D:       # the double's bits, stored in an int64 word
            return _DOUBLE.unpack(_WORD.pack(w[i + 1]))[0], i + 2
        if tag == _B:
            return bool(w[i + 1]), i + 2
        if tag == _N:
            return None, i + 1
        return "?", i + 1

    name = op_names[words[0]]
    inputs, outputs, i, side = [], [], 1, 0
    while i < len(words):
        if side == 0 and words[i] == _BAR:
            side, i = 1, i + 1
            continue
        item, i = read(words, i)
        (outputs if side else inputs).append(item)
    return name, inputs, outputs
