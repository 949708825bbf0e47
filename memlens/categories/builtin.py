"""memlens's own categories written as rules, where rules can say them.

`DEFAULT_RULES` is the rule set memlens applies when the user gives none: every block keeps the category
memlens's importer or recorder gave it. `FRAME_RULES` writes, in the user's rule format, the built-in snapshot
rules that only read frames (`memlens.io.snapshot.story` rules 3, 3k and 4: a cuBLAS / cuDNN workspace, a
key/value cache, a gradient made under autograd's AccumulateGrad) and ends with ``@builtin`` for the rest: categorising a snapshot with it
gives every block the category memlens gives it. The other built-in rules need what a regex cannot say (how
long a block lives against its phase, the sizes of parameters, what released a block alive before recording);
the README's "Your own categories" table says how each maps onto the rule fields.
"""
from __future__ import annotations

# the phases before these rules in the built-in order: a block made in the optimizer step or zero_grad is
# decided there first
_NOT_OPTIMIZER = r"^(?!optimizer_step$|zero_grad$)"

DEFAULT_RULES = ({"category": "@builtin"},)

FRAME_RULES = (
    {"category": "workspace", "function": r"cublas|cudnn|CUDABlasHandle|getCurrentCUDABlasHandle|cublasLt|workspace",
     "phase": _NOT_OPTIMIZER},
    # one Python frame ("file.py:line function") named for a key/value cache
    {"category": "kv_cache", "frame": r"\.py:-?\d+ .*(?i:kv_?caches?|past_key_values)", "phase": _NOT_OPTIMIZER},
    {"category": "gradient", "function": r"AccumulateGrad", "phase": _NOT_OPTIMIZER},
    {"category": "@builtin"},
)
