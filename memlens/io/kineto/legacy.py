"""Cost facts of 2021-era Kineto ops whose scalar arguments were not logged.

Traces of torch <= 1.10 (capitalised ``Operator`` / ``Kernel`` categories) log ``Input Dims`` and ``Input type``
but no ``Concrete Inputs``: a convolution's stride and padding and a pooling window are unknown, so the op
cannot run on meta tensors and its result shape (hence its flops and bytes written) stays unknown. Some of
these ops (``aten::cudnn_convolution_backward`` and its ``_input`` / ``_weight`` children) no longer exist in
torch at all. They are the bulk of a CNN's device time, so they are rebuilt here from shapes alone:

- ``aten::cudnn_convolution(input, weight, ...)``: the output is the first input of a later op on the same
  thread shaped ``[N, K, P, Q]`` (batch of the input, output channels of the weight: the op that consumes
  the conv's result, a batch norm or an add); stride and padding follow from input, weight and output
  sizes (`conv_params`). Priced as ``aten::convolution``, the op a dispatch recorder sees.
- ``aten::cudnn_convolution_backward(input, grad_output, weight, ...)``: grad_output is the forward's
  output, so stride and padding follow the same way. Priced as ``aten::convolution_backward`` with the
  output mask given by the children the trace logged (``_input``: grad of the input, ``_weight``: grad of
  the weight; the first layer computes no input grad). The children alone are priced with their one grad.
- ``aten::max_pool2d_with_indices(input, ...)``: the output is found like a conv's (channels kept); the
  window is taken as 3x3 (ResNet's stem, the one max-pool of the torchvision CNNs), stride and padding
  inferred from the sizes. Its backward logs grad_output and the input, so its result is the input's shape.

Sizes are element counts per dimension; `memlens.opfacts.costs.op_costs` turns the rebuilt call into flops
and bytes. Imports nothing from `memlens.recording` (the importer stays independent of the recorder).
"""
from __future__ import annotations

import numpy as np

from memlens.opfacts.costs import op_costs
from memlens.opfacts.dtypes import dtype_name

CONV = "aten::cudnn_convolution"
CONV_BACKWARD = "aten::cudnn_convolution_backward"
GRAD_INPUT, GRAD_WEIGHT = CONV_BACKWARD + "_input", CONV_BACKWARD + "_weight"
POOL, POOL_BACKWARD = "aten::max_pool2d_with_indices", "aten::max_pool2d_with_indices_backward"
LEGACY_OPS = frozenset({CONV, CONV_BACKWARD, GRAD_INPUT, GRAD_WEIGHT, POOL, POOL_BACKWARD})
POOL_WINDOW = (3, 3)   # not logged; the torchvision CNNs' max-pool (ResNet stem: 3x3, stride 2, pad 1)
LOOKAHEAD = 40          # later ops searched for a result's consumer (a conv's is the next op or two)


def conv_params(x, w, out) -> tuple[list, list]:
    """(stride, padding) per spatial dimension of a 2-D convolution (or pooling window `w[2:]`) from the
    sizes of its input `x` [N, C, H, W], weight `w` [K, C, R, S] and output `out` [N, K, P, Q].
    P = (H + 2 pad - R) // stride + 1, so stride = round(H / P) and pad = ((P - 1) stride + R - H + 1) // 2
    (rounded up: cuDNN pads symmetrically, and an odd remainder is the floor division dropping a row)."""
    stride, pad = [], []
    for i in (2, 3):
        s = max(1, round(x[i] / max(out[i], 1)))
        stride.append(s)
        pad.append(max(0, ((out[i] - 1) * s + w[i] - x[i] + 1) // 2))
    return stride, pad


def consumer_input(later_first_inputs, n: int, c: int):
    """The first 4-D size [n, c, h, w] among the first inputs of the ops after an op (its result, as the
    op that consumes it logged it); None when none of them has that batch and channel count."""
    for dims in later_first_inputs:
        if isinstance(dims, list) and dims and isinstance(dims[0], list) and len(dims[0]) == 4 \
                and dims[0][0] == n and dims[0][1] == c:
            return tuple(dims[0])
    return None


def _tensor(dims, types, i):
    """(shape, dtype name) of argument i when it is a 4-D tensor, else None."""
    if i < len(dims) and i < len(types) and isinstance(dims[i], list) and len(dims[i]) == 4 \
            and all(type(d) is int for d in dims[i]) and dtype_name(types[i]):
        return tuple(dims[i]), dtype_name(types[i])
    return None


def legacy_call(name: str, dims, types, later=(), parent=None, children=()):
    """(op name, positional args, results) that price a 2021-era op, with tensors as (shape, dtype name);
    None when the shapes do not tell. `dims` / `types`: the op's ``Input Dims`` / ``Input type``; `later`:
    the ``Input Dims`` of the ops after it on its thread, in order; `parent`: (dims, types) of the op around
    it (a backward child's arguments are its parent's); `children`: the names of the ops nested in it."""
    if name == CONV:
        x, w = _tensor(dims, types, 0), _tensor(dims, types, 1)
        out = x and w and consumer_input(later, x[0][0], w[0][0])
        if not out:
            return None
        stride, pad = conv_params(x[0], w[0], out)
        return "aten::convolution", [x, w, None, stride, pad, [1, 1], False, [0, 0], 1], (out, x[1])
    if name in (CONV_BACKWARD, GRAD_INPUT, GRAD_WEIGHT):
        # the children log (sizes, grad_output, weight or input): their parent has all three tensors
        pdims, ptypes = (dims, types) if name == CONV_BACKWARD else (parent or ([], []))
        x, go, w = (_tensor(pdims, ptypes, i) for i in range(3))
        if not (x and go and w):
            return None
        if name == CONV_BACKWARD:
            mask = [GRAD_INPUT in children, GRAD_WEIGHT in children, False]
            if not any(mask):
                return None
        else:
            mask = [name == GRAD_INPUT, name == GRAD_WEIGHT, False]
        stride, pad = conv_params(x[0], w[0], go[0])
        out = (x if mask[0] else None, w if mask[1] else None, None)
        return "aten::convolution_backward", [go, x, w, None, stride, pad, [1, 1], False, [0, 0], 1, mask], out
    if name == POOL:
        x = _tensor(dims, types, 0)
        out = x and consumer_input(later, x[0][0], x[0][1])
        if not out:
            return None
        stride, pad = conv_params(x[0], (0, 0, *POOL_WINDOW), out)
        return name, [x, list(POOL_WINDOW), stride, pad, [1, 1], False], ((out, x[1]), (out, "int64"))
    if name == POOL_BACKWARD:
        go, x = _tensor(dims, types, 0), _tensor(dims, types, 1)
        if not (go and x):
            return None
        stride, pad = conv_params(x[0], (0, 0, *POOL_WINDOW), go[0])
        return name, [go, x, list(POOL_WINDOW), stride, pad, [1, 1], False, (go[0], "int64")], x
    return None


def legacy_facts(candidates, names, op_args, parent: np.ndarray, thread: np.ndarray,
                 start: np.ndarray, end: np.ndarray) -> dict:
    """{op index: `memlens.opfacts.costs.CostFacts`} for the ops in `candidates` (indices of `LEGACY_OPS`
    ops the signature match could not price) that `legacy_call` can rebuild. `op_args`: the ops' ``args``
    dicts; `parent`: the innermost op around each (-1 at top level); `thread`, `start`, `end`: each op's
    thread code and times (any one unit), to find the ops after it on its thread."""
    candidates = [int(i) for i in candidates]
    if not candidates:
        return {}

    def logged(i, key):
        a = op_args[i]
        return a.get(key) if type(a) is dict else None
    # the ops of each thread by start time: the consumers of a result are the ops that start after its op ends
    order = np.lexsort((start, thread))
    sorted_thread, sorted_start = thread[order], start[order]
    children: dict = {}
    for i in np.flatnonzero(np.isin(parent, candidates)):
        children.setdefault(int(parent[i]), set()).add(names[i])
    out = {}
    for i in candidates:
        lo = np.searchsorted(sorted_thread, thread[i], "left")
        hi = np.searchsorted(sorted_thread, thread[i], "right")
        first = lo + np.searchsorted(sorted_start[lo:hi], end[i], "left")
        later = (logged(j, "Input Dims") for j in order[first:min(first + LOOKAHEAD, hi)])
        p = int(parent[i])
        around = (logged(p, "Input Dims") or [], logged(p, "Input type") or []) if p >= 0 else None
        call = legacy_call(names[i], logged(i, "Input Dims") or [], logged(i, "Input type") or [], later,
                           around, children.get(i, ()))
        if call is None:
            continue
        try:
            out[i] = op_costs(*call[:2], None, call[2])
        except Exception:   # noqa: BLE001 (a rebuilt call no tensor can have: the op keeps no facts)
            continue
    return out


__all__ = ["LEGACY_OPS", "LOOKAHEAD", "conv_params", "consumer_input", "legacy_call", "legacy_facts"]
