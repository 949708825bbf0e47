"""ZeRO stage 2 (Rajbhandari et al. 2020), written with torch's own collectives: parameters replicated,
gradients reduced into this rank's shard as backward makes them, optimizer state for that shard only.

torch has no ZeRO-2 (``ZeroRedundancyOptimizer`` is stage 1; FSDP2 without resharding keeps sharded
parameters between steps, which is stage 3's state), so `zero2_optimizer` builds one the way DeepSpeed's
stage 2 lays out memory:

- the trainable parameters are flattened, in ``model.parameters()`` order, into one buffer padded to a multiple
  of the world size N, and each parameter becomes a view of it (every rank keeps all of them: Psi elements);
- rank r owns elements ``[r S, (r + 1) S)`` of that buffer, S = ceil(Psi / N); the optimizer (the user's class,
  the model's dtype, no fp32 master copy, as every other strategy row) steps on that slice only, so its state is
  S elements per state tensor, and the slice's ``.grad`` is the rank's gradient shard (S elements);
- backward: when a parameter's gradient is accumulated, it is summed over the ranks (``all_reduce`` in place,
  which allocates nothing, stands for DeepSpeed's per-partition reduce), averaged, the part inside this rank's
  slice is added to the gradient shard, and the full gradient is freed at once;
- after the optimizer step the updated slices are all-gathered into the buffer in place.

Held between steps, in bytes with b bytes per element (b = 4 for fp32, Adam's two states): parameters b Psi,
gradients b Psi / N, optimizer state 2 b Psi / N (the paper's 2 Psi + (2 + 12) Psi / N counts the mixed-precision
fp32 master copy and fp16 gradients, which this row does not keep). Not modelled: DeepSpeed's gradient bucket
(``reduce_bucket_size`` elements gathered before each reduce), so the backward transient is one full gradient at
a time here.
"""
from __future__ import annotations

import math


def zero2_optimizer(model, optimizer_class, optimizer_kwargs: dict):
    """Make `model` (on its device) a ZeRO-2 replica on this rank (see the module docstring) and return
    `optimizer_class` over this rank's slice of the flat parameter buffer. Needs ``torch.distributed``
    initialised; `model`'s trainable parameters must share one dtype."""
    import torch
    import torch.distributed as dist

    from memlens.errors import InputError
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise InputError("zero2: the model has no trainable parameters")
    if len({p.dtype for p in params}) != 1:
        raise InputError("zero2: the model's trainable parameters have several dtypes "
                         f"({sorted(str(d) for d in {p.dtype for p in params})}); one flat buffer needs one")
    world, rank = dist.get_world_size(), dist.get_rank()
    total = sum(p.numel() for p in params)
    shard = math.ceil(total / world)
    with torch.no_grad():
        flat = torch.zeros(shard * world, dtype=params[0].dtype, device=params[0].device)
        offsets, at = [], 0
        for p in params:
            flat[at:at + p.numel()].copy_(p.reshape(-1))
            p.data = flat[at:at + p.numel()].view_as(p)     # the parameter's old storage is freed
            offsets.append(at)
            at += p.numel()
        local = flat[rank * shard:(rank + 1) * shard]
    lo, hi = rank * shard, (rank + 1) * shard

    def reduce_into_shard(start):
        def hook(param):
            grad = param.grad
            dist.all_reduce(grad)
            grad.div_(world)
            if local.grad is None:      # at the first gradient after zero_grad() on every rank alike
                local.grad = torch.zeros_like(local)
            a, b = max(start, lo), min(start + grad.numel(), hi)
            if a < b:
                local.grad[a - lo:b - lo].add_(grad.reshape(-1)[a - start:b - start])
            param.grad = None               # the full gradient is not kept
        return hook

    for p, start in zip(params, offsets):
        p.register_post_accumulate_grad_hook(reduce_into_shard(start))
    optimizer = optimizer_class([local], **optimizer_kwargs)

    # torch 2.13 renamed all_gather_into_tensor (now deprecated, with a warning) to all_gather_single
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def gather_slices(opt, args, kwargs):
        with torch.no_grad():
            all_gather(flat, local)
    optimizer.register_step_post_hook(gather_slices)
    return optimizer
