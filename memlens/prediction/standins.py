"""Stand-in values for reading a fake tensor's data inside a prediction.

Fake tensors hold no values, so ``loss.item()``, ``float(t)``, ``bool(t)``, ``t.tolist()`` and ``torch.equal``
(ATen's ``_local_scalar_dense`` and ``equal``) cannot be answered; FakeTensorMode raises
``DataDependentOutputException``. Nearly every training script logs its loss and checks for NaN, so a
prediction answers those reads with stand-ins and the code's control flow follows them:

- the value of a healthy run: ``isnan``/``isinf`` give False, ``isfinite`` gives True, and ``any``/``all``/
  ``logical_not`` and comparisons carry such a value on (the stand-in of their inputs, computed);
- a constant the code made (``torch.zeros``, ``torch.full``: GradScaler's ``found_inf`` starts at 0.0);
- shapes that depend on values (``nonzero``, ``masked_select``, indexing with a boolean mask, ``x[mask]``)
  count a true stand-in as every element true and a false one as none: a healthy run's mask
  (``labels != -100``) selects everything, the upper bound of its memory;
- otherwise 1.0 for floating point (finite, nonzero: ``math.log`` and division by it work), 1 for integers,
  False for booleans.

A value is carried on the tensor with the tensor's version, so an in-place change (``count += 1``) drops it
back to the default. Which source lines read a stand-in is kept (`StandIns.lines`): a prediction reports them,
since a script whose memory depends on those values (a size taken from ``.item()``) is predicted on them.
"""
from __future__ import annotations

import operator
import os
import sys
from collections import Counter

import torch

aten = torch.ops.aten
LOCAL_SCALAR_DENSE = aten._local_scalar_dense.default
EQUAL = aten.equal.default
# ops whose output's shape depends on values: answered with the stand-in count of true elements (`shaped`)
NONZERO = aten.nonzero.default
MASKED_SELECT = aten.masked_select.default
INDEX = aten.index.Tensor
INDEX_PUT = frozenset({aten.index_put.default, aten.index_put_.default})
VALUE_SHAPED_OPS = frozenset({NONZERO, MASKED_SELECT, INDEX}) | INDEX_PUT

_HEALTH = {aten.isnan.default: False, aten.isinf.default: False, aten.isposinf.default: False,
           aten.isneginf.default: False, aten.isfinite.default: True}
_PASS_ON = {aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims,
            aten.clone.default, aten.detach.default, aten.alias.default, aten._to_copy.default,
            aten.view.default, aten.reshape.default, aten.squeeze.default, aten.unsqueeze.default,
            aten.expand.default, aten.select.int, aten.max.default, aten.min.default, aten.abs.default}
_NOT = {aten.logical_not.default, aten.bitwise_not.default}
_COMPARE = {}
for _name, _fn in (("eq", operator.eq), ("ne", operator.ne), ("gt", operator.gt), ("ge", operator.ge),
                   ("lt", operator.lt), ("le", operator.le)):
    for _overload in ("Scalar", "Tensor"):
        _COMPARE[getattr(getattr(aten, _name), _overload)] = _fn
# arithmetic on values: computed when an input carries one (``isfinite`` runs as ``(x == x) * (|x| != inf)``)
_ARITHMETIC = {aten.mul.Tensor: operator.mul, aten.mul.Scalar: operator.mul, aten.add.Tensor: operator.add,
               aten.sub.Tensor: operator.sub, aten.bitwise_and.Tensor: operator.and_,
               aten.bitwise_or.Tensor: operator.or_, aten.logical_and.default: lambda a, b: bool(a and b),
               aten.logical_or.default: lambda a, b: bool(a or b)}
_CONSTANT = {aten.zeros.default: lambda a: 0, aten.zeros_like.default: lambda a: 0,
             aten.ones.default: lambda a: 1, aten.ones_like.default: lambda a: 1,
             aten.full.default: lambda a: a[1], aten.full_like.default: lambda a: a[1],
             aten.scalar_tensor.default: lambda a: a[0], aten.fill_.Scalar: lambda a: a[1],
             aten.zero_.default: lambda a: 0}
# ops that leave their second argument's value as a healthy run has it (GradScaler's found_inf stays 0.0)
_KEEPS_FLAG = {aten._amp_foreach_non_finite_check_and_unscale_.default: 1}
VALUE_OPS = (frozenset(_HEALTH) | _PASS_ON | _NOT | frozenset(_COMPARE) | frozenset(_ARITHMETIC) | frozenset(_CONSTANT)
             | frozenset(_KEEPS_FLAG))

_ATTR = "_memlens_standin"      # (value, tensor version) on a fake tensor
_SKIP_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _version(t) -> int:
    try:
        return t._version
    except RuntimeError:     # an inference tensor has no version counter
        return -1


def _tag(t, value) -> None:
    if isinstance(t, torch.Tensor):
        try:
            setattr(t, _ATTR, (value, _version(t)))
        except (AttributeError, RuntimeError):
            pass


def _carries(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _ATTR, None) is not None


def standin(t):
    """The stand-in value of fake tensor `t` (every element alike), as a Python scalar of its dtype."""
    if not isinstance(t, torch.Tensor):
        return t
    tagged = getattr(t, _ATTR, None)
    if tagged is not None and tagged[1] == _version(t):
        value = tagged[0]
    elif t.dtype is torch.bool:
        value = False
    elif t.dtype.is_floating_point or t.dtype.is_complex:
        value = 1.0
    else:
        value = 1
    if t.dtype is torch.bool:
        return bool(value)
    if t.dtype.is_floating_point:
        return float(value)
    if t.dtype.is_complex:
        return complex(value)
    return int(value)


def carry(func, args, out) -> None:
    """After `func` (one of `VALUE_OPS`) ran on fake tensors: give its output the stand-in a healthy run's
    values give it."""
    if func in _KEEPS_FLAG:     # the flag keeps the value it had (no inf found), whatever its version now
        flag = args[_KEEPS_FLAG[func]]
        _tag(flag, getattr(flag, _ATTR, (0.0,))[0])
        return
    if func in _HEALTH:
        value = _HEALTH[func]
    elif func in _NOT:
        value = not standin(args[0])
    elif func in _COMPARE:
        value = _COMPARE[func](standin(args[0]), standin(args[1]))
    elif func in _CONSTANT:
        value = _CONSTANT[func](args)
        if isinstance(value, torch.Tensor):
            return
        if func is aten.fill_.Scalar or func is aten.zero_.default:
            out = args[0]
    elif func in _ARITHMETIC:
        if not (_carries(args[0]) or _carries(args[1])):
            return      # model arithmetic on plain values: nothing to carry (and no cost on the hot path)
        value = _ARITHMETIC[func](standin(args[0]), standin(args[1]))
    else:
        if not _carries(args[0]):
            return
        value = standin(args[0])
    if isinstance(out, (tuple, list)):
        for o in out:
            _tag(o, value)
    else:
        _tag(out, value)


class StandIns:
    """The stand-in reads of one prediction: `lines` counts them per source line (``"train.py:14"``)."""

    def __init__(self):
        self.lines: Counter = Counter()

    def read(self, func, args):
        """Answer ``_local_scalar_dense`` (a tensor's one value) or ``equal`` with a stand-in; note the
        user's line that asked."""
        self.lines[_user_line()] += 1
        if func is EQUAL:
            return tuple(args[0].shape) == tuple(args[1].shape)
        return standin(args[0])

    def shape(self, func, args, kwargs, mode):
        """Run an op whose output shape depends on values (`needs_shape`) on its stand-in shape under `mode`
        (the prediction's dispatch mode, so that what it allocates is recorded); note the user's line."""
        self.lines[_user_line()] += 1
        with mode:
            return shaped(func, args, kwargs)


def _unknown(t) -> bool:
    """A fake tensor whose values FakeTensorMode does not know (it keeps those of small real constants)."""
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor) and t.constant is None


def _has_mask(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) and _unknown(i)
               for i in indices)


def _nonzero(mask):
    """``nonzero(mask)`` on the stand-in: (every element or none, mask.dim()) int64 indices."""
    count = mask.numel() if standin(mask) else 0
    return torch.empty((count, mask.dim()), dtype=torch.long, device=mask.device)


def _long_indices(indices) -> list:
    """Boolean masks among `indices` replaced by the columns of their stand-in ``nonzero``, as ATen's
    ``expandTensors`` does before indexing."""
    out = []
    for i in indices:
        if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
            nz = _nonzero(i)
            out += [nz.select(1, j) for j in range(i.dim())]
        else:
            out.append(i)
    return out


def needs_shape(func, args) -> bool:
    """Whether `func` on `args` has an output shape that depends on values (see `shaped`)."""
    if func is NONZERO:
        return _unknown(args[0])
    if func is MASKED_SELECT:
        return _unknown(args[1])
    return (func is INDEX or func in INDEX_PUT) and len(args) > 1 and _has_mask(args[1])


def shaped(func, args, kwargs):
    """Run a `needs_shape` op on its stand-in shape (called under the prediction's dispatch mode, so that
    what it allocates is recorded)."""
    if func is NONZERO:
        return _nonzero(args[0])
    if func is MASKED_SELECT:
        self, mask = args[0], args[1]
        shape = torch.broadcast_shapes(self.shape, mask.shape)
        count = (torch.Size(shape).numel() if standin(mask) else 0)
        return torch.empty((count,), dtype=self.dtype, device=self.device)
    return func(args[0], _long_indices(args[1]), *args[2:], **(kwargs or {}))


def _user_line() -> str:
    """``file:line`` of the innermost frame outside torch and memlens (the script's line that read a value);
    ``(backward)`` for a backward node that autograd's device thread runs."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_SKIP_DIRS) and not name.startswith("<frozen"):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    import threading      # no Python frame of the user's: autograd's engine thread runs a backward node
    return "(backward)" if threading.current_thread() is not threading.main_thread() else "(no source line)"


def note(lines: Counter) -> str | None:
    """The sentence a prediction states once about its stand-in reads, or None when there were none."""
    if not lines:
        return None
    shown = ", ".join(f"{line} ({n}x)" if n > 1 else line for line, n in lines.most_common(8))
    more = f" and {len(lines) - 8} more lines" if len(lines) > 8 else ""
    return (f"fake tensors hold no values: {sum(lines.values())} reads of a tensor's value (.item(), float(), "
            f"bool(), .tolist(), shapes of x[mask] and nonzero) used stand-ins (a healthy run's: no NaN or inf; else 1.0, 1 or False) at "
            f"{shown}{more}; control flow followed them, and memory that depends on those values is predicted "
            "on the stand-ins")
