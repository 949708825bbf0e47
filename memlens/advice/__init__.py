"""`memlens.advise`: changes that make a training step fit a GPU, each verified by predicting the step with
it applied (`advisor`; `entry` takes a step function, a script or a trace), ranked (`result`), applicable to a
model and printable as code (`plan`); checkpointing in `checkpoint`, the planned activation offload in
`offload_plan` (what moves, when it returns; `offload_only` gives the offload-only plan) and `offload` (the hooks that enact it)."""
from memlens.advice.advisor import AdviceFailed, offload_only
from memlens.advice.entry import advise
from memlens.advice.checkpoint import CannotWrap
from memlens.advice.plan import Plan, apply
from memlens.advice.result import Advice

__all__ = ["advise", "apply", "offload_only", "Advice", "Plan", "AdviceFailed", "CannotWrap"]
