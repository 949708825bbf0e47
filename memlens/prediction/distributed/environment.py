"""The world one predicted rank runs in: torch's fake process group plus what fake `cuda` tensors need for it.

Inside `rank_world(rank, world_size, session)` (entered inside a `memlens.predict` block):

- ``torch.distributed`` is initialised with torch's ``fake`` backend (``FakeProcessGroup``, registered by
  ``torch.testing._internal.distributed.fake_pg``): collectives return at once and move no data; tensors
  keep their shapes, so FSDP2's all-gather outputs and reduce-scatter inputs are allocated as in a real run.
  The user's own ``init_process_group`` (any backend) and ``destroy_process_group`` are no-ops inside;
  ``RANK``/``WORLD_SIZE`` say this rank, ``LOCAL_RANK`` is 0: each rank is modelled on its own GPU, seen as
  ``cuda:0`` (as with one visible device per process).
- ``DeviceMesh`` runs outside FakeTensorMode: it keeps its rank map as a real CPU tensor and reads it with
  ``tolist()``, which a fake tensor cannot answer. Meshes hold no GPU memory.
- ``torch.cuda.Stream`` / ``Event`` / ``current_stream`` / ``stream``: a CPU build has none; FSDP2 uses them
  for its all-gather and reduce-scatter streams. They become torch's device-generic ``torch.Stream`` and
  ``torch.Event`` on the fake-CUDA shim's guard (no-op synchronisation); ``with torch.cuda.stream(s)``
  switches the shim's current stream, which `streams.py` notes per block for the allocator replay's pools.
- FSDP2 frees and re-allocates unsharded parameters with ``UntypedStorage.resize_`` (``free_storage`` /
  ``alloc_storage`` in ``_fsdp_param``), which no dispatch mode sees; the patched versions tell the
  recorder, so a resharded parameter's bytes are freed and its next all-gather allocates them again.
- ``DistributedDataParallel``: its C++ constructor reads parameter data (``_verify_params_across_processes``
  and the broadcast of module states), which fake tensors do not have, so its ``__init__``/``forward`` are
  replaced by `memlens.prediction.distributed.ddp` (the module runs as is; DDP's gradient buckets are
  allocated explicitly).
- DTensor's sharding propagation infers each new op's output shape on global-shape fake tensors; those
  ops are not recorded (`memlens.prediction.session.shape_inference_only`).
- ``torch.distributed.pipelining``: torch's schedules run; the stages' shape-agreement vote (which reads a
  received value) is replaced by `memlens.prediction.distributed.pipeline`.
- Async sends (``isend``, ``batch_isend_irecv``, the pipeline schedules' ``P2POp``): the work keeps the sent
  tensor alive until it is waited, as NCCL does (`memlens.prediction.distributed.p2p`).
- Random ops on DTensors (``nn.init.normal_`` on a sharded parameter): DTensor's RNG operator and the CUDA
  generator's Philox offsets run as on a GPU (`memlens.prediction.distributed.rng`).
Everything is restored on exit.
"""
from __future__ import annotations

import contextlib
import functools
import os
from time import perf_counter_ns

import torch

from memlens.prediction.patches import AttributePatches

_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _unfaked(fn):
    """`fn` run with every dispatch mode (FakeTensorMode, the recorder) off: DeviceMesh's CPU bookkeeping."""
    from torch.utils._python_dispatch import _disable_current_modes

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with _disable_current_modes():
            return fn(*args, **kwargs)
    return call


_Patches = AttributePatches      # (the name this module's helpers are annotated with)


def _mesh_init(init):
    """DeviceMesh.__init__ given a fake rank map: ``init_device_mesh`` imported by name before the prediction
    (so not the patched one) made its identity map ``torch.arange(n)`` under FakeTensorMode; make it real."""
    def __init__(self, *args, **kwargs):
        from torch._subclasses.fake_tensor import FakeTensor
        rank_map = kwargs.get("_rank_map")
        if isinstance(rank_map, FakeTensor):
            kwargs["_rank_map"] = torch.arange(rank_map.numel(), dtype=rank_map.dtype)
        init(self, *args, **kwargs)
    return __init__


def _patch_device_mesh(patches: _Patches) -> None:
    from torch.distributed import device_mesh as dm
    for name, value in list(vars(dm.DeviceMesh).items()):
        if name.startswith("__") and name not in ("__init__", "__getitem__", "__eq__", "__hash__"):
            continue
        if name == "__init__":
            patches.set(dm.DeviceMesh, name, _unfaked(_mesh_init(value)))
            continue
        if isinstance(value, property):
            patches.set(dm.DeviceMesh, name, property(_unfaked(value.fget)))
        elif isinstance(value, staticmethod):
            patches.set(dm.DeviceMesh, name, staticmethod(_unfaked(value.__func__)))
        elif isinstance(value, classmethod):
            patches.set(dm.DeviceMesh, name, classmethod(_unfaked(value.__func__)))
        elif callable(value) and not isinstance(value, type):
            patches.set(dm.DeviceMesh, name, _unfaked(value))
    unfaked_init = _unfaked(dm.init_device_mesh)
    patches.set(dm, "init_device_mesh", unfaked_init)
    import torch.distributed.tensor as dtensor
    if hasattr(dtensor, "init_device_mesh"):
        patches.set(dtensor, "init_device_mesh", unfaked_init)
    from torch.distributed.fsdp._fully_shard import _fsdp_init
    patches.set(_fsdp_init, "init_device_mesh", unfaked_init)


def _patch_streams(patches: _Patches) -> None:
    cuda = torch.cuda

    def stream(device=None, priority=0, **kwargs):
        return torch.Stream(device="cuda", priority=priority)

    def event(enable_timing=False, blocking=False, interprocess=False, **kwargs):
        return torch.Event(device="cuda", enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)

    @contextlib.contextmanager
    def stream_context(s):
        if s is None:
            yield
            return
        with s:
            yield

    patches.set(cuda, "Stream", stream)
    patches.set(cuda, "Event", event)
    patches.set(cuda, "current_stream", lambda device=None: torch.accelerator.current_stream())
    patches.set(cuda, "default_stream", lambda device=None: torch.Stream(stream_id=0, device_index=0, device_type=1))
    patches.set(cuda, "stream", stream_context)
    patches.set(cuda, "set_stream", lambda s: torch.accelerator.set_stream(s))


def storage_freed(session, storage) -> None:
    """The recorder learns that `storage` lost its bytes (``resize_(0)``) now: its block ends."""
    if session is None or not session.active:
        return
    with session.lock:
        bid = session._live.pop(id(storage), None)
        if bid is None:
            return
        for ref_id, (_, b, _) in list(session._refs.items()):
            if b == bid:
                del session._refs[ref_id]
                break
        session.live_cuda_bytes -= session._cuda_sizes.pop(bid, 0)
        session._frees_extend((bid, perf_counter_ns()))


def storage_allocated(session, storage, device) -> None:
    """The recorder learns that `storage` (on fake `device`) got new bytes now: a new block, made by the
    next op (FSDP2 copies the all-gathered values into it)."""
    if session is None or not session.active:
        return
    with session.lock:
        if id(storage) in session._live:
            return
        session._fake_device[id(storage)] = device
        session._discover(storage, session.n_ops, perf_counter_ns(), False)


def _patch_fsdp_storage(patches: _Patches, session) -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    def alloc_storage(tensor):
        size = tensor.numel() * tensor.itemsize
        storage = tensor.untyped_storage()
        if storage.size() != size:
            if storage.size():
                storage_freed(session, storage)
            storage.resize_(size)
            storage_allocated(session, storage, tensor.device)

    def free_storage(tensor):
        storage = tensor.untyped_storage()
        if storage.size() != 0:
            storage_freed(session, storage)
            storage.resize_(0)

    patches.set(_fsdp_param, "alloc_storage", alloc_storage)
    patches.set(_fsdp_param, "free_storage", free_storage)


def _patch_sharding_propagation(patches: _Patches) -> None:
    """DTensor's shape inference (global-shape fake tensors, run once per new op signature) is not recorded:
    the recorder now sees what DTensor's dispatch runs (`memlens.prediction.session`), and this part of it
    allocates nothing on a real GPU."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    from memlens.prediction.session import shape_inference_only
    infer = ShardingPropagator.__dict__["_propagate_tensor_meta_non_cached"]

    def _propagate_tensor_meta_non_cached(self, op_schema):
        with shape_inference_only():
            return infer(self, op_schema)
    patches.set(ShardingPropagator, "_propagate_tensor_meta_non_cached", _propagate_tensor_meta_non_cached)


def _patch_strategy_sightings(patches: _Patches, seen: set) -> None:
    """Note which sharding strategies the user's code used: FSDP2 (an FSDP parameter group was made),
    DDP (a DistributedDataParallel was made), ZeRO (a ZeroRedundancyOptimizer was made)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    def sighted(cls, name):
        init = cls.__init__

        def __init__(self, *args, **kwargs):
            seen.add(name)
            init(self, *args, **kwargs)
        patches.set(cls, "__init__", __init__)

    sighted(_fsdp_param_group.FSDPParamGroup, "fsdp2")
    sighted(DDP, "ddp")
    sighted(ZeroRedundancyOptimizer, "zero")


@contextlib.contextmanager
def rank_world(rank: int, world_size: int, session=None, notes: list | None = None, seen: set | None = None,
               stages: list | None = None):
    """Run the body as rank `rank` of `world_size` on torch's fake process group (see the module docstring).
    `session`: the prediction's recording session (told about FSDP2's storage frees); `notes` collects what
    the user's code asked for that was replaced (backends requested); `seen` collects the strategies the
    code used ("fsdp2", "ddp", "zero", "pp"); `stages` the pipeline stage index of each ``PipelineStage``
    the rank builds (`pipeline`)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore   # registers the "fake" backend

    from memlens.prediction.distributed import ddp, p2p, pipeline, rng
    if dist.is_initialized():
        raise RuntimeError("a distributed prediction needs torch.distributed uninitialised at its start "
                           "(the prediction initialises the fake process group per rank)")
    saved_env = {k: os.environ.get(k) for k in _ENV_KEYS}
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    notes = notes if notes is not None else []
    real_init, real_destroy = dist.init_process_group, dist.destroy_process_group
    real_init(backend="fake", store=FakeStore(), rank=rank, world_size=world_size)
    patches = _Patches()
    try:
        def init_process_group(backend=None, *args, **kwargs):
            notes.append(f"init_process_group(backend={backend!r}) ran on the fake backend")

        patches.set(dist, "init_process_group", init_process_group)
        patches.set(dist, "destroy_process_group", lambda group=None: None)
        import torch.distributed.distributed_c10d as c10d
        patches.set(c10d, "init_process_group", init_process_group)
        patches.set(c10d, "destroy_process_group", lambda group=None: None)
        _patch_device_mesh(patches)
        _patch_streams(patches)
        _patch_fsdp_storage(patches, session)
        _patch_sharding_propagation(patches)
        ddp.patch(patches, session)
        p2p.patch(patches)
        seen = seen if seen is not None else set()
        _patch_strategy_sightings(patches, seen)
        pipeline.patch(patches, seen, stages if stages is not None else [], notes, session)
        from memlens.prediction.session import _PredictMode
        rng.patch(patches, _PredictMode)
        yield
    finally:
        patches.restore()
        real_destroy()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
