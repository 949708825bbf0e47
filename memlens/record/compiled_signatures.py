"""How a signature the compiled recorder logged becomes the ``(op, args, kwargs, out)`` that
`memlens.record.costs.op_costs` reads.

`memlens.record.compiled.decode_signature` gives each tensor as ``("tensor", ScalarType code, shape)``
and a wrapped Python number as ``("scalar", ...)``; here tensors become ``(shape, dtype name)`` and the
schema's keyword-only arguments go back to keywords, as a Python call passes them.
"""
from __future__ import annotations

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
