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

- when each bucket is all-reduced (for the step time, `steptime`): each gradient-ready hook notes the
  recording's op count (the gradient and its copy into the bucket are the ops before it), and a callback
  queued on autograd's engine, as the Reducer queues its ``finalize_backward``, notes where the backward
  pass ended. `communication_record` gives these per backward pass ("round"); `all_reduce_rounds` turns
  them into (bucket bytes, ready position) in the Reducer's bucket order. DDP rebuilds its buckets after the
  first iteration (when ``static_graph`` or not ``find_unused_parameters``) in the order gradients became
  ready, with limits ``[first_bucket_bytes_cap, bucket_bytes_cap]`` (1 MiB, 25 MiB by default): the rebuilt
  assignment is computed here with torch's function from the first pass's ready order and used for the
  timing of later passes.

- the rebuild's memory: at the next forward with gradients enabled the construction buckets are replaced by
  the rebuilt ones, as the Reducer's ``initialize_buckets`` does (torch/csrc/distributed/c10d/reducer.cpp):
  it clears the old buckets, then allocates the new ones in the rebuilt order. With separate gradients
  (``gradient_as_bucket_view=False``) or gradients set to None, the old buckets are freed before the new
  ones exist (no transient); with ``gradient_as_bucket_view=True`` and gradients kept (accumulation, or
  ``zero_grad(set_to_none=False)``) each gradient still views its old bucket until it is copied into its
  new view, so old and new buckets are alive together (one extra copy of the trainable parameters' bytes
  at most), then the old ones are freed. The steady state holds the rebuilt buckets (the same bytes).

Not modelled: the all-reduce's memory (in place on the bucket, NCCL's own buffers are counted in
`memlens.prediction.distributed.nccl`), ``find_unused_parameters`` bookkeeping, buffer broadcasts (no new
memory).
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


def rebuild_limits(bucket_cap_mb, bucket_cap_mb_list=None) -> list[int]:
    """The byte limits DDP's Reducer rebuilds its buckets with after the first iteration: the first bucket's
    cap then the bucket cap (torch's ``_BucketCapacityConfig``: 1 MiB then 25 MiB by default), or the
    per-bucket caps of ``bucket_cap_mb_list``."""
    from torch.nn.parallel import distributed as ddp_module
    config = ddp_module._BucketCapacityConfig.create(bucket_cap_mb, bucket_cap_mb_list, False)
    if config.has_custom_per_bucket_caps:
        return list(config.per_bucket_bytes_caps)
    return [config.first_bucket_bytes_cap, config.bucket_bytes_cap]


def _modelled_init(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                   process_group=None, bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                   gradient_as_bucket_view=False, static_graph=False, _memlens_session=None, **kwargs):
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
    # torch reverses the assignment for its Reducer (the last parameters' gradients are ready first)
    assignment = list(reversed(bucket_assignment(params, limits)))
    for idx in assignment:
        for i, view in _bucket_views(params, idx, buckets):
            views[id(params[i])] = view
    # a plain attribute (not a buffer): the Reducer's buckets are not in the module's state_dict
    object.__setattr__(self, "_memlens_buckets", buckets)
    as_view = self.gradient_as_bucket_view
    owner = weakref.ref(self)     # the hooks live on the parameters: no cycle back to this module
    index = {id(p): i for i, p in enumerate(params)}
    record = {"param_bytes": [p.numel() * p.element_size() for p in params], "buckets": assignment,
              "rebuilds": bool(static_graph) or not bool(find_unused_parameters), "rebuilt_buckets": None,
              "rounds": []}
    rebuilt_limits = rebuild_limits(bucket_cap_mb, kwargs.get("bucket_cap_mb_list"))
    if _memlens_session is not None:
        _records(_memlens_session).append(record)
    open_round: dict = {}

    def close_round():
        """autograd's engine runs this when the backward pass ends (the Reducer's finalize_backward)."""
        rnd = {"ready": [[i, pos] for i, pos in sorted(open_round.pop("ready", {}).items())],
               "end": _op_count(_memlens_session)}
        record["rounds"].append(rnd)
        if record["rebuilds"] and record["rebuilt_buckets"] is None and rnd["ready"]:
            order = [i for i, _ in sorted(rnd["ready"], key=lambda x: (x[1], x[0]))]
            record["rebuilt_buckets"] = [list(b) for b in torch.distributed._compute_bucket_assignment_by_size(
                [params[i] for i in order], rebuilt_limits, [False] * len(order), order)[0]]

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
        if "ready" not in open_round:
            open_round["ready"] = {}
            torch.autograd.Variable._execution_engine.queue_callback(close_round)
        open_round["ready"][index[id(p)]] = _op_count(_memlens_session)

    hooks = [p.register_post_accumulate_grad_hook(ready) for p in params]
    object.__setattr__(self, "_memlens_hooks", hooks)

    def rebuild() -> bool:
        """The Reducer's ``rebuild_buckets`` (DDP's forward calls it, with gradients enabled, once a backward
        pass gave the ready order): ``initialize_buckets`` first clears its buckets, then allocates the new
        ones in the rebuilt order; with ``gradient_as_bucket_view`` each defined gradient is copied into its
        new view and re-pointed there. An old bucket's storage is freed when nothing holds it any more: at the
        clear when the gradients are separate tensors or None, else when its last gradient is re-pointed."""
        order = record["rebuilt_buckets"]
        if order is None or record.get("rebuilt"):
            return False
        record["rebuilt"] = True
        buckets.clear()
        views.clear()
        for idx in order:
            for i, view in _bucket_views(params, idx, buckets):
                views[id(params[i])] = view
                if as_view and params[i].grad is not None:
                    view.copy_(params[i].grad)
                    params[i].grad = view
        return True
    object.__setattr__(self, "_memlens_rebuild", rebuild)


def _bucket_views(params, idx, buckets):
    """Allocate one flat bucket for the parameters `idx` (appended to `buckets`, as DDP's Reducer makes it)
    and yield each parameter's index with its view into it, in bucket order."""
    numel = sum(params[i].numel() for i in idx)
    flat = torch.zeros(numel, dtype=params[idx[0]].dtype, device=params[idx[0]].device)
    buckets.append(flat)
    offset = 0
    for i in idx:
        n = params[i].numel()
        yield i, flat[offset:offset + n].view(params[i].shape)
        offset += n


def _modelled_forward(self, *args, **kwargs):
    if torch.is_grad_enabled():      # where DDP's ``_pre_forward`` rebuilds, before the forward's activations
        self._memlens_rebuild()
    return self.module(*args, **kwargs)


def bucket_bytes(ddp_module) -> list[int]:
    """Bytes of each modelled bucket of a `DistributedDataParallel` built under prediction."""
    return [b.numel() * b.element_size() for b in getattr(ddp_module, "_memlens_buckets", [])]


def _records(session) -> list:
    """The DDP communication records kept beside `session` (one per DDP module built under it)."""
    if not hasattr(session, "memlens_ddp"):
        session.memlens_ddp = []
    return session.memlens_ddp


def _op_count(session) -> int:
    """How many ops the recording holds so far (the next op's id); 0 without a session."""
    return int(session.n_ops) if session is not None else 0


def communication_record(session) -> list[dict]:
    """Per DDP module built under `session`: ``param_bytes`` (bytes per parameter needing a gradient, in
    ``module.parameters()`` order), ``buckets`` (parameter indices per bucket, in the Reducer's order),
    ``rebuilt_buckets`` (the same after the first iteration's rebuild, None without one), ``rounds`` (per
    backward pass with gradient sync: ``ready`` = [parameter index, op count when its gradient was in its
    bucket] and ``end`` = op count when the backward pass ended). Plain lists and ints (JSON-safe)."""
    return [dict(r) for r in getattr(session, "memlens_ddp", [])]


def all_reduce_rounds(record: dict) -> list[dict]:
    """Per backward pass of one DDP record: ``end`` (op count at the end of backward) and ``buckets``, a list
    of (bytes, ready op count) in the Reducer's bucket order. A bucket is ready when its last gradient is
    (the largest op count of its parameters); a bucket with a parameter that had no gradient in that pass
    is ready at the end of backward. Passes after the first use the rebuilt buckets when DDP rebuilds."""
    out = []
    for k, rnd in enumerate(record["rounds"]):
        if not rnd["ready"]:
            continue
        ready = dict((int(i), int(pos)) for i, pos in rnd["ready"])
        rebuilt = record.get("rebuilt_buckets")
        buckets = rebuilt if k > 0 and rebuilt else record["buckets"]
        end = int(rnd["end"])
        out.append({"end": end, "buckets": [(sum(record["param_bytes"][i] for i in b),
                                             max(ready.get(i, end) for i in b)) for b in buckets]})
    return out


def patch(patches, session=None) -> None:
    """Replace DDP's constructor and forward on the class itself (so a class imported before the
    prediction is covered too); `patches` restores them. `session`: the recording session, whose op count
    dates each gradient's readiness (`communication_record`)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def init(self, module, *args, **kwargs):
        _modelled_init(self, module, *args, _memlens_session=session, **kwargs)
    patches.set(DDP, "__init__", init)
    patches.set(DDP, "forward", _modelled_forward)
