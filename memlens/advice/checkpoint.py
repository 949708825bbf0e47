"""What to do with a module's saved activations: checkpoint or offload it (`wrap`), and what each candidate
module would take off the peak and cost in time, read from a predicted trace (`module_costs`).

Three modes per module:
- ``"full"``: torch's ``checkpoint_wrapper`` (non-reentrant ``torch.utils.checkpoint``): the module keeps
  only its inputs from forward to backward and runs its forward again in backward.
- ``"selective"``: the same wrapper with ``context_fn`` built by
  ``torch.utils.checkpoint.create_selective_checkpoint_contexts``: the outputs of the matrix products and
  attention kernels (`SAVED_OP_NAMES`, expensive to recompute) are kept, every other op is recomputed.
- ``"offload"``: the planned saved tensors of the module (large, idle from their last forward use to their
  first backward use) move to host memory and come back at a planned point in backward; planned by
  `memlens.advice.offload_plan`, enacted by `memlens.advice.offload` (not by `wrap`, which only checks
  that an offloaded module is not inside a checkpointed one, nor contains one).
"""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("full", "selective", "offload")

# recorded op names whose outputs selective checkpointing keeps (the GEMMs and the attention kernels)
SAVED_OP_NAMES = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                  "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                  "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_attention_math",
                  "aten::convolution", "aten::_convolution")


def _saved_ops():
    """The aten overload packets of `SAVED_OP_NAMES` that this torch has."""
    import torch
    out = []
    for name in SAVED_OP_NAMES:
        packet = getattr(torch.ops.aten, name.split("::", 1)[1], None)
        if packet is not None:
            out.append(packet)
    return out


def selective_policy(ctx, op, *args, **kwargs):
    """``create_selective_checkpoint_contexts`` policy: keep GEMM and attention outputs, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy
    packet = getattr(op, "overloadpacket", op)
    return CheckpointPolicy.MUST_SAVE if packet in _saved_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    """The ``context_fn`` of selective checkpointing (a fresh pair of contexts per checkpointed call)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    return create_selective_checkpoint_contexts(selective_policy)


class CannotWrap(ValueError):
    """A module the checkpointing policy cannot wrap; the message names it and says why."""


def wrap(model, choices: dict[str, str]):
    """Wrap the modules of `model` named in `choices` (``named_modules`` names -> ``"full"`` or
    ``"selective"``) with torch's ``checkpoint_wrapper`` in place; returns `model`. ``"offload"`` names are
    left to `memlens.advice.offload.install` (their planned tensors). Raises `CannotWrap` naming a module
    that is missing, is the model itself, or is already checkpointed, or an offloaded module inside a
    checkpointed one or around one (checkpointing would recompute the saves the offload counts)."""
    import functools

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl, CheckpointWrapper,
                                                                             checkpoint_wrapper)
    modules = dict(model.named_modules())
    for name, mode in choices.items():
        if mode not in MODES:
            raise CannotWrap(f"module {name!r}: checkpoint mode {mode!r} is not one of {', '.join(MODES)}")
        if name == "":
            raise CannotWrap("the model itself cannot be checkpointed here: its outputs feed the loss outside "
                             "any module; choose its blocks")
        if name not in modules:
            raise CannotWrap(f"module {name!r} is not in the model (its named_modules() do not include it)")
        if isinstance(modules[name], CheckpointWrapper) or getattr(modules[name], "_memlens_offload", False):
            raise CannotWrap(f"module {name!r} is already wrapped (checkpointed or offloaded)")
    for off in (n for n, m in choices.items() if m == "offload"):
        for name in (n for n, m in choices.items() if m != "offload"):
            if off.startswith(name + ".") or name.startswith(off + "."):
                raise CannotWrap(f"module {off!r} is offloaded and {name!r} checkpointed, one inside the other: "
                                 "checkpointing recomputes the saves the offload plan counts")
    for name, mode in sorted(choices.items(), key=lambda kv: -kv[0].count(".")):
        if mode == "offload":
            continue
        parent_name, _, child = name.rpartition(".")
        parent = modules[parent_name]
        extra = {"context_fn": selective_context} if mode == "selective" else {}
        wrapped = checkpoint_wrapper(modules[name], checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                     checkpoint_fn=functools.partial(_checkpoint, **extra))
        setattr(parent, child, wrapped)
    return model


def _checkpoint(fn, *args, **kwargs):
    from torch.utils.checkpoint import checkpoint
    return checkpoint(fn, *args, use_reentrant=False, **kwargs)


@dataclass(frozen=True)
class ModuleCost:
    """One candidate module's checkpointing options, estimated from the baseline's predicted trace: bytes of
    its forward's activations alive at the peak that each mode frees (`full_bytes`, `selective_bytes`,
    `offload_bytes`) and the modeled GPU time each mode adds: the forward ops run again (`full_ns`,
    `selective_ns`), the copies back from the host that end after their use (`offload_ns`, the stall of
    the planned tensors, `memlens.advice.offload_plan`; 0 bytes where nothing is planned)."""

    name: str
    full_bytes: int
    full_ns: int
    selective_bytes: int
    selective_ns: int
    offload_bytes: int = 0
    offload_ns: int = 0

    def option(self, mode: str) -> tuple[int, int]:
        """(bytes freed, added ns) of `mode`."""
        return {"full": (self.full_bytes, self.full_ns), "selective": (self.selective_bytes, self.selective_ns),
                "offload": (self.offload_bytes, self.offload_ns)}[mode]


def _root_prefix(paths: set, candidates: list[str]) -> str:
    """The prefix the recorder put before the model's own module names (the class name of the module the
    step called, and a wrapper's attribute: ``DistributedDataParallel.module``): the shortest path that ends
    in a candidate's name, without that name."""
    for name in candidates:
        found = sorted((p for p in paths if p.endswith("." + name)), key=len)
        if found:
            return found[0][:-len(name) - 1]
    return ""


def module_costs(trace, candidates: list[str], root: str | None = None, from_op: int = 0) -> list[ModuleCost]:
    """`ModuleCost` of each candidate (``named_modules`` names) from a predicted trace whose module paths
    start with `root` (default: what the recorder put before the model's names, `_root_prefix`).
    A module's saved activations are the ``cuda:0`` blocks allocated by its forward ops and still allocated
    at the allocated peak; the one allocated last (its output, which the next module keeps) is not counted
    as freed (offload: 0 bytes here; the advisor fills it from the offload plan). `from_op`: the op id where
    the step to read begins (a steady-state prediction's last step; the forward ops of the steps before it
    are not counted again)."""
    import numpy as np
    ops = trace.ops
    fwd = ops[ops["phase"] == "forward"] if "phase" in ops.columns else ops
    fwd = fwd[fwd["op_id"] >= from_op]
    if root is None:
        root = _root_prefix(set(fwd["module"].unique()), candidates)
    b = trace.blocks
    b = b[(b["device"] == "cuda:0") & b["alloc_op_id"].notna()]
    t_peak = _peak_time(trace)
    alive = (b["alloc_ns"] <= t_peak) & (b["free_ns"].isna() | (b["free_ns"] > t_peak))
    fwd_ids = set(fwd["op_id"].tolist())
    b = b[alive & b["alloc_op_id"].isin(fwd_ids)]
    op_name = ops.set_index("op_id")["name"]
    dur = (fwd["device_ns"] if "device_ns" in fwd.columns else fwd["end_ns"] - fwd["start_ns"]).to_numpy()
    saved = fwd["name"].isin(SAVED_OP_NAMES).to_numpy()
    fwd_op_id = fwd["op_id"].to_numpy()
    out = []
    for name in candidates:
        path = f"{root}.{name}" if name else root
        in_fwd = ((fwd["module"] == path) | fwd["module"].str.startswith(path + ".")).to_numpy()
        mine = b[(b["module"] == path) | b["module"].str.startswith(path + ".")]
        if len(mine):
            mine = mine.sort_values("alloc_ns", kind="stable").iloc[:-1]   # its output stays saved
        # non-reentrant checkpointing stops recomputing once every saved tensor is back: ops past the
        # last one that made a saved activation are not run again
        last = int(mine["alloc_op_id"].max()) if len(mine) else -1
        in_fwd = in_fwd & (fwd_op_id <= last)
        sizes = mine["size"].to_numpy(dtype=np.int64)
        by_saved_op = mine["alloc_op_id"].map(op_name).isin(SAVED_OP_NAMES).to_numpy()
        out.append(ModuleCost(name, int(sizes.sum()), int(dur[in_fwd].sum()),
                              int(sizes[~by_saved_op].sum()), int(dur[in_fwd & ~saved].sum())))
    return out


def _peak_time(trace) -> int:
    """Trace time (ns) at which the allocated ``cuda:0`` bytes first reach their maximum."""
    import numpy as np
    b = trace.blocks
    b = b[(b["device"] == "cuda:0") & b["alloc_ns"].notna()]
    t = np.concatenate([b["alloc_ns"].to_numpy(dtype=np.int64),
                        b["free_ns"].dropna().to_numpy(dtype=np.int64)])
    d = np.concatenate([b["size"].to_numpy(dtype=np.int64),
                        -b.loc[b["free_ns"].notna(), "size"].to_numpy(dtype=np.int64)])
    if not len(t):
        return 0
    order = np.lexsort((d, t))     # at one time, frees (negative) first
    level = np.cumsum(d[order])
    return int(t[order][int(np.argmax(level))])
