"""`memlens.advise`: changes that make a training step fit a GPU, each verified by predicting the step with
it applied (`advisor`), ranked (`result`), applicable to a model and printable as code (`plan`)."""
from memlens.advise.advisor import AdviceFailed, advise
from memlens.advise.checkpoint import CannotWrap
from memlens.advise.plan import Plan, apply
from memlens.advise.result import Advice

__all__ = ["advise", "apply", "Advice", "Plan", "AdviceFailed", "CannotWrap"]


import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    """``memlens.advise`` is both this package and the function (as ``memlens.predict`` is): importing the
    package binds it as ``memlens.advise``, so calling the package calls `advise`."""

    def __call__(self, *args, **kwargs):
        return advise(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
