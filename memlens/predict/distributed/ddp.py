"""`DistributedDataParallel` under prediction: the module runs as is, DDP's gradient buckets are modelled.

Why modelled: DDP's constructor reads parameter data in C++ (it checks shapes across ranks with
``_verify_params_across_processes`` and broadcasts the module's states), and its C++ ``Reducer`` owns the
buckets; fake tensors have no data, so the real constructor fails. What DDP allocates on the GPU, and what
this model allocates (through the recorder, so the allocator replay sees them):

- gradient buckets: the parameters that need gradients are grouped as DDP's constructor groups them,
  with torch's own functions (`bucket_limits`, `bucket_assignment`): in torch 2.13, unless
  ``find_unused_parameters=True`` (without ``static_graph``), one bucket per dtype and device holds them
  all; otherwise buckets of ``bucket_cap_mb`` MiB (first bucket 1 MiB with the default cap). Each bucket
  is one flat tensor of its parameters' dtype, allocated at construction and alive as long as the DDP
  module (the Reducer's ``bucket.gradients``): the bucket bytes equal the trainable parameters' bytes.
- gradients: with ``gradient_as_bucket_view=False`` (the default) gradients are ordinary tensors and are
  copied into their bucket view when ready; with True, each gradient is replaced by its view of the bucket
  once accumulated (its own storage freed), as the Reducer does.

Not modelled: the all-reduce itself (in place on the bucket, NCCL's own buffers are counted in
`memlens.predict.distributed.nccl`), DDP's bucket rebuild after the first iteration (the same bytes
regrouped into ``bucket_cap_mb`` buckets in gradient-ready order; the old buckets are freed after the new
ones are made, a transient this model leaves out), ``find_unused_parameters`` bookkeeping, buffer broadcasts (no new memory).
"""
from __future__ import annotations

import weakref

import torch

def bucket_limits(bucket_cap_mb, static_graph: bool, find_unused_parameters: bool) -> list[int]:
    """The byte limits DDP's constructor buckets with (torch's own ``_BucketCapacityConfig``): in torch
    2.13, without ``find_unused_parameters`` (or with ``static_graph``) one bucket per dtype and device
    holds every parameter until the first iteration's rebuild."""
    from torch.nn.parallel import distributed as ddp_module
    config = ddp_module._BucketCapacityConfig.create(bucket_cap_mb, None, False)
    return config.compute_bucket_size_limits(static_graph=static_graph,
                                             find_unused_parameters=find_unused_parameters)[0]


def bucket_assignment(params: list, limits: list[int]) -> list[list[int]]:
    """Indices into `params` per bucket: torch's C++ ``_compute_bucket_assignment_by_size`` (it reads only
    sizes, dtypes and devices, which fake tensors have)."""
    indices, _ = torch.distributed._compute_bucket_assignment_by_size(params, limits, [False] * len(params))
    return [list(b) for b in indices]


def _modelled_init(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                   process_group=None, bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                   gradient_as_bucket_view=False, static_graph=False, **kwargs):
    torch.nn.Module.__init__(self)
    self.module = module
    self.device_ids = device_ids
    self.require_backward_grad_sync = True
    self.require_forward_param_sync = True
    self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
    params = [p for p in module.parameters() if p.requires_grad]
    buckets = []
    views = {}
    limits = bucket_limits(bucket_cap_mb, bool(static_graph), bool(find_unused_parameters))
    for idx in bucket_assignment(params, limits):
        numel = sum(params[i].numel() for i in idx)
        flat = torch.zeros(numel, dtype=params[idx[0]].dtype, device=params[idx[0]].device)
        buckets.append(flat)
        offset = 0
        for i in idx:
            n = params[i].numel()
            views[id(params[i])] = flat[offset:offset + n].view(params[i].shape)
            offset += n
    # a plain attribute (not a buffer): the Reducer's buckets are not in the module's state_dict
    object.__setattr__(self, "_memlens_buckets", buckets)
    as_view = self.gradient_as_bucket_view
    owner = weakref.ref(self)     # the hooks live on the parameters: no cycle back to this module

    def ready(p):
        view = views.get(id(p))
        ddp = owner()
        if view is None or p.grad is None or ddp is None or not ddp.require_backward_grad_sync:
            return
        if as_view:
            if p.grad is not view:
                view.copy_(p.grad)
                p.grad = view
        else:
            view.copy_(p.grad)       # into the bucket for the all-reduce; copied back after it
            p.grad.copy_(view)

    hooks = [p.register_post_accumulate_grad_hook(ready) for p in params]
    object.__setattr__(self, "_memlens_hooks", hooks)


def _modelled_forward(self, *args, **kwargs):
    return self.module(*args, **kwargs)


def bucket_bytes(ddp_module) -> list[int]:
    """Bytes of each modelled bucket of a `DistributedDataParallel` built under prediction."""
    return [b.numel() * b.element_size() for b in getattr(ddp_module, "_memlens_buckets", [])]


def patch(patches) -> None:
    """Replace DDP's constructor and forward on the class itself (so a class imported before the
    prediction is covered too); `patches` restores them."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    patches.set(DDP, "__init__", _modelled_init)
    patches.set(DDP, "forward", _modelled_forward)
