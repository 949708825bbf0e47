"""A convolution's result shape and flops from its input, weight and scalar arguments, for the backend ops
that torch cannot run on meta tensors (``aten::miopen_convolution``, ``aten::cudnn_convolution`` ...), so a
profile logs them without a result and the flop registry has no formula for some of them.

Shapes (PyTorch's ``Conv`` documentation): for each spatial dimension,
``out = floor((in + 2 padding - dilation (kernel - 1) - 1) / stride) + 1``; transposed,
``out = (in - 1) stride - 2 padding + dilation (kernel - 1) + output_padding + 1``. The batch is the input's;
the channels are ``weight[0]`` (``weight[1] x groups`` transposed). Flops as torch's ``conv_flop_count``:
``2 x N x C_out x out pixels x C_in / groups x kernel taps`` (transposed: input pixels in place of output
ones). Arguments are found by their schema names, whatever their order (``miopen_convolution`` takes
``padding`` before ``stride``, ``convolution`` after); missing ones take the defaults (stride 1, padding 0,
dilation 1, groups 1, not transposed).
"""
from __future__ import annotations

import math

from memlens.opfacts.signatures import is_tensor_meta

_INPUT_NAMES = ("input", "self")
_DEFAULTS = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "transposed": False, "output_padding": 0}


def is_forward_convolution(name: str) -> bool:
    """An ATen forward convolution (``aten::miopen_convolution``, ``aten::convolution`` ...), not its
    backward."""
    return "convolution" in name and "backward" not in name


def _per_dim(value, n: int) -> list[int]:
    if isinstance(value, (list, tuple)):
        values = [int(v) for v in value]
        return values * n if len(values) == 1 else values
    return [int(value)] * n


def conv_output_shape(x: tuple, w: tuple, stride=1, padding=0, dilation=1, groups=1, transposed=False,
                      output_padding=0) -> tuple | None:
    """Result shape of a convolution of input `x` ``[N, C_in, *spatial]`` by weight `w` ``[C_out, C_in /
    groups, *kernel]`` (transposed: ``[C_in, C_out / groups, *kernel]``); scalars or per-dimension lists.
    None when the shapes do not fit (ranks differ, a size would be < 1, padding given as a string other than
    "valid" / "same")."""
    x, w = tuple(int(v) for v in x), tuple(int(v) for v in w)
    if len(x) < 3 or len(w) != len(x):
        return None
    n = len(x) - 2
    if isinstance(padding, str):
        if padding == "same" and not transposed:
            return (x[0], w[0]) + x[2:]
        if padding != "valid":
            return None
        padding = 0
    stride, padding, dilation = _per_dim(stride, n), _per_dim(padding, n), _per_dim(dilation, n)
    output_padding = _per_dim(output_padding, n)
    if min(len(stride), len(padding), len(dilation), len(output_padding)) != n or min(stride) < 1:
        return None
    spatial = []
    for i in range(n):
        size, k = x[2 + i], w[2 + i]
        if transposed:
            out = (size - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k - 1) + output_padding[i] + 1
        else:
            out = (size + 2 * padding[i] - dilation[i] * (k - 1) - 1) // stride[i] + 1
        if out < 1:
            return None
        spatial.append(out)
    channels = w[1] * int(groups) if transposed else w[0]
    return (x[0], channels) + tuple(spatial)


def conv_flops(x: tuple, w: tuple, out: tuple, transposed: bool = False) -> int:
    """``2 x N x (output pixels, or input pixels when transposed) x prod(weight)``: torch's count."""
    pixels = math.prod(x[2:]) if transposed else math.prod(out[2:])
    return 2 * int(x[0]) * int(pixels) * math.prod(int(v) for v in w)


def conv_arguments(names: list, args: tuple, kwargs: dict) -> dict | None:
    """``{"input": (shape, dtype), "weight": (shape, dtype), "stride", "padding", ...}`` of a convolution
    call whose schema argument names are `names` (positional `args`, keyword `kwargs` as signatures:
    tensors ``(shape, dtype)``); None when input or weight is not a tensor."""
    given = dict(zip(names, args))
    given.update(kwargs or {})
    x = next((given[k] for k in _INPUT_NAMES if k in given), None)
    w = given.get("weight")
    if not (is_tensor_meta(x) and is_tensor_meta(w)):
        return None
    found = {"input": x, "weight": w}
    for key, default in _DEFAULTS.items():
        value = given.get(key)
        found[key] = default if value is None else value
    return found


def infer_conv_result(names: list, args: tuple, kwargs: dict):
    """The result ``(shape, dtype)`` of a forward convolution call (its schema's argument `names`, its
    signature `args` / `kwargs`), or None when it cannot be worked out."""
    found = conv_arguments(names, args, kwargs)
    if found is None:
        return None
    x, w = found["input"], found["weight"]
    try:
        shape = conv_output_shape(tuple(x[0]), tuple(w[0]), found["stride"], found["padding"], found["dilation"],
                                  found["groups"], bool(found["transposed"]), found["output_padding"])
    except (TypeError, ValueError):
        return None
    return None if shape is None else (shape, x[1])
