"""Whether a fused attention call masks causally, from its scalar arguments: the cost model prices a causal
flash-attention kernel by the key blocks each query block visits (about half), so a recorder or importer that
keeps an op's scalar arguments must say which calls were causal (PyTorch's schemas: ``is_causal``; the
memory-efficient kernels take ``custom_mask_type``, 1 = causal from the top left, 2 = from the bottom right)."""
from __future__ import annotations

# position of the causal flag among each fused attention op's schema arguments
CAUSAL_ARG = {"aten::_scaled_dot_product_flash_attention": 4, "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
              "aten::_scaled_dot_product_efficient_attention": 6, "aten::_scaled_dot_product_cudnn_attention": 6,
              "aten::_flash_attention_forward": 8, "aten::scaled_dot_product_attention": 5,
              "aten::_flash_attention_backward": 11, "aten::_scaled_dot_product_flash_attention_backward": 11,
              "aten::_scaled_dot_product_efficient_attention_backward": 11,
              "aten::_efficient_attention_forward": 9, "aten::_efficient_attention_backward": 14}


def causal_value(value) -> bool:
    """Whether one logged causal-flag value asks for a causal mask: True, or mask type 1 or 2."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value in (1, 2)
    return str(value).strip() in ("True", "true", "1", "2")


def causal_call(op, args, kwargs=None) -> bool:
    """Whether the call ``op(*args, **kwargs)`` of a fused attention op masks causally (False for any other
    op). `op`: an `OpOverload` or its name; `args` / `kwargs` as a recorder logs them (scalars as
    themselves), the flag found positionally or by its schema name."""
    from memlens.opfacts.flops import op_name, resolve_op
    func = resolve_op(op)
    name = op_name(func) if func is not None else str(op)
    pos = CAUSAL_ARG.get(name)
    if pos is None:
        return False
    if len(args) > pos:
        return causal_value(args[pos])
    schema = getattr(func, "_schema", None)
    if schema is None or not kwargs:
        return False
    key = schema.arguments[pos].name
    return key in kwargs and causal_value(kwargs[key])
