"""Which ATen op a name means (`resolve_op`), and how many floating-point operations one call of it does
(`count_flops`).

Flops come from PyTorch's own formulas (`torch.utils.flop_counter.flop_registry`, the numbers
`FlopCounterMode` reports; a multiply-add is 2): matmul, convolution and attention ops. Every other op
counts 0: its cost on a GPU is memory traffic and launches, not arithmetic.
"""
from __future__ import annotations

from memlens.opfacts.signatures import is_tensor_meta

# CPU spellings of ops that torch's registry knows under their CUDA name (same argument layout)
_FLOP_ALIASES = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_fused_attention_overrideable": "_scaled_dot_product_flash_attention",
    "aten::mkldnn_convolution": "convolution_overrideable",
}
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


def op_name(func) -> str:
    """The schema name of an `OpOverload` (``"aten::addmm"``); its text when it has no schema."""
    schema = getattr(func, "_schema", None)
    return schema.name if schema is not None else str(func)


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
    if is_tensor_meta(value):
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
    name = op_name(func)
    fn = _flop_function(func, name)
    if fn is None:
        return 0
    try:
        value = fn(*_as_shapes(tuple(args)), out_val=_as_shapes(out), **{k: _as_shapes(v) for k, v in
                                                                        (kwargs or {}).items()})
        return max(int(value), 0)
    except Exception:  # a formula that cannot read these arguments: no flops rather than a failed trace
        return 0
