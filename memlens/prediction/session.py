"""The recording session under prediction: memlens's recorder, taught that fake tensors live on `cuda`.

Fake tensors (FakeTensorMode) keep their bytes nowhere: their storage is a `meta` storage, which the plain
recorder skips. Here a meta storage of a fake tensor is a block on the device the fake tensor claims
(``cuda:0``), with no address (the caching-allocator simulator gives it one). Fake tensors on the CPU
(a ``torch.tensor(1.0)`` step counter, a CPU-built model before ``.to("cuda")``) are blocks on ``cpu``.
"""
from __future__ import annotations

import contextlib
from threading import get_ident as _get_ident
from threading import local as _thread_local
from weakref import ref as _weakref

import torch

from memlens.prediction.scratch.flash import flash_backward_facts
from memlens.prediction.scratch.index_put import index_put_sort_facts
from memlens.prediction.scratch.reduce import reduce_facts, reduce_op_table
from memlens.prediction.standins import (EQUAL, LOCAL_SCALAR_DENSE, VALUE_OPS, VALUE_SHAPED_OPS, StandIns, carry,
                                     needs_shape)
from memlens.recording.session import Session, _RecordingMode, _inner_tensors

Tensor = torch.Tensor
_PRIM_DEVICE = torch.ops.prim.device.default
_COMPOSITE: dict[int, bool] = {}     # id(OpOverload) -> has a CompositeImplicitAutograd kernel
_WRAPPER_TYPES: dict[type, bool] = {}   # tensor type -> is a traceable wrapper subclass (DTensor)
try:
    _WAIT_TENSOR = torch.ops._c10d_functional.wait_tensor.default
except (AttributeError, RuntimeError):     # a torch built without distributed
    _WAIT_TENSOR = None
_SHAPE_INFERENCE = _thread_local()      # .depth > 0 while DTensor's sharding propagation infers shapes


def _is_wrapper_type(kind: type) -> bool:
    wrapper = _WRAPPER_TYPES.get(kind)
    if wrapper is None:   # once per tensor type: a failed attribute look-up per tensor costs
        wrapper = _WRAPPER_TYPES[kind] = kind is not Tensor and hasattr(kind, "__tensor_flatten__")
    return wrapper


def _holds_wrapper(args) -> bool:
    """Whether `args` (a tuple/list, nested) holds a wrapper-subclass tensor (a DTensor)."""
    for a in args:
        if isinstance(a, Tensor):
            if type(a) is not Tensor and _is_wrapper_type(type(a)):
                return True
        elif type(a) is list or type(a) is tuple:
            if _holds_wrapper(a):
                return True
    return False


@contextlib.contextmanager
def shape_inference_only():
    """Ops run inside are not recorded: DTensor's sharding propagation runs each new op once on global-shape
    fake tensors to learn its output's shape and stride (``_propagate_tensor_meta_non_cached``); a real run
    does that on meta-like fake tensors too, allocating nothing on the GPU."""
    _SHAPE_INFERENCE.depth = getattr(_SHAPE_INFERENCE, "depth", 0) + 1
    try:
        yield
    finally:
        _SHAPE_INFERENCE.depth -= 1


try:
    _SHARD_DIM_ALLTOALL = torch.ops._dtensor.shard_dim_alltoall.default
except (AttributeError, RuntimeError):
    _SHARD_DIM_ALLTOALL = None


def _shard_dim_alltoall_as_cuda(input, gather_dim, shard_dim, group):
    """``_dtensor::shard_dim_alltoall`` (DTensor's Shard(i) -> Shard(j) redistribution) allocating what its
    C++ kernel allocates (``Functional.cpp``): the input's shards made contiguous along dim 0 (a copy unless
    `shard_dim` is 0), the receive buffer (the input's size), and the received shards moved to `gather_dim`
    (a copy unless it is 0; else the output is the receive buffer). Its fake kernel makes only the output."""
    import torch.distributed.distributed_c10d as c10d
    pg = c10d._resolve_process_group(group) if isinstance(group, str) else group
    n = pg.size()
    sizes = list(input.shape)
    out_sizes = list(input.shape)
    sizes[shard_dim] //= n
    sizes.insert(shard_dim, n)
    contiguous = input.view(sizes).movedim(shard_dim, 0).contiguous()
    received = torch.empty_like(contiguous)
    out_sizes[shard_dim] //= n
    out_sizes[gather_dim] *= n
    return received.movedim(0, gather_dim).contiguous().view(out_sizes)


_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default


def _flash_group_buffers(args) -> list[tuple]:
    """The shapes of the buffers CUDA's flash-attention backward allocates for grouped-query attention:
    ``dk_expanded`` and ``dv_expanded``, (batch, key length, query heads, head dim) in the query's dtype, filled
    per query head and then summed into the key/value heads' gradients (``mha_bwd``, ``flash_api.cpp``).
    Its fake kernel makes only the gradients. Empty when the heads are not grouped."""
    query, key = args[1], args[2]
    if not isinstance(query, Tensor) or query.dim() != 4 or key.shape[-3] == query.shape[-3]:
        return []
    shape = (query.shape[0], key.shape[-2], query.shape[-3], key.shape[-1])
    return [shape, shape]


def _holds_values_unknown(args) -> bool:
    """Whether `args` holds a fake tensor whose values are not known (FakeTensorMode keeps the values of small
    constants it made from real data, ``torch.tensor(3.0)``, and answers reads of those itself)."""
    from torch._subclasses.fake_tensor import FakeTensor
    return any(isinstance(a, FakeTensor) and a.constant is None for a in args)


def _wait_tensor_call(tensor):
    """``_c10d_functional::wait_tensor`` as CUDA runs it: it waits for the collective and returns `tensor`
    itself (``Functional.cpp``). Its fake (meta) kernel returns ``empty_like``, a second block the size of
    every collective's output that a real run never allocates."""
    return tensor


def _all_contiguous(args) -> bool:
    for a in args:
        if isinstance(a, Tensor):
            if not a.is_contiguous():
                return False
        elif type(a) is list or type(a) is tuple:
            if not _all_contiguous(a):
                return False
    return True


def _is_composite(func) -> bool:
    """Whether a CUDA run executes `func` as its decomposition: a CompositeImplicitAutograd kernel and no
    backend kernel. ``silu_backward`` and ``mish_backward`` have both (one fused kernel on CPU and CUDA; the
    decomposition serves other backends), so they stay whole. On a CPU build the CUDA kernels cannot be
    asked about; the CPU kernel stands for them."""
    try:
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        return bool(has(func.name(), "CompositeImplicitAutograd")) and not has(func.name(), "CPU")
    except Exception:
        return False


class _PredictMode(_RecordingMode):
    """The recorder's dispatch mode, decomposing composite ops first.

    Under ``inference_mode`` (no Autograd key) composite ops such as ``einsum``, ``reshape`` and ``to``
    reach dispatch modes whole; FakeTensorMode then decomposes them inside itself, so the copies they make
    (``einsum`` making a transposed operand contiguous, ``reshape`` copying) would be invisible. A real CUDA
    run executes the decomposition op by op, so the prediction does too.

    Ops on DTensors are handed on to DTensor's dispatch, whose local ops come back here (see below); two
    kernels whose fake versions allocate less than CUDA's are run as CUDA allocates: DTensor's
    ``shard_dim_alltoall`` and the flash-attention backward with grouped key/value heads.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _PRIM_DEVICE:     # autograd asks fake tensors their device ~100k times a step: no memory
            return func(*args, **(kwargs or {}))
        if getattr(_SHAPE_INFERENCE, "depth", 0):
            return func(*args, **(kwargs or {}))
        if (func is LOCAL_SCALAR_DENSE or func is EQUAL) and _holds_values_unknown(args):
            return self.session.standins.read(func, args)     # .item(), bool(), .tolist(): memlens.prediction.standins
        if func in VALUE_SHAPED_OPS and needs_shape(func, args):     # x[mask], nonzero, masked_select
            return self.session.standins.shape(func, args, kwargs, self)
        if func in VALUE_OPS:
            out = self._dispatch(func, types, args, kwargs)
            carry(func, args, out)
            return out
        return self._dispatch(func, types, args, kwargs)

    def _dispatch(self, func, types, args, kwargs):
        # An op on DTensors: let DTensor's own dispatch run first (NotImplemented hands the op on to the
        # subclass), so that what it runs on the local tensors comes back here op by op, as a real GPU runs
        # it: the local op on the local shapes and, between them, the redistributions of inputs that the
        # sharding strategy asks for (all-gathers, all-reduces, their copies), which are neither the op's
        # inputs nor its outputs. Recorded at the DTensor level, those temporaries would be missed and the
        # op's cost taken at the global shapes.
        if self.session.active and (_holds_wrapper(args) or (kwargs and _holds_wrapper(tuple(kwargs.values())))):
            return NotImplemented
        if func is _SHARD_DIM_ALLTOALL and self.session.active:
            with self:
                return _shard_dim_alltoall_as_cuda(*args, **(kwargs or {}))
        if func is _FLASH_BACKWARD and self.session.active:
            grads = super().__torch_dispatch__(func, types, args, kwargs)
            with self:      # allocated after the gradients, freed when the group sums are done
                buffers = [torch.empty(shape, dtype=args[1].dtype, device=args[1].device)
                           for shape in _flash_group_buffers(args)]
            del buffers
            return grads
        composite = _COMPOSITE.get(id(func))
        if composite is None:
            composite = _COMPOSITE[id(func)] = _is_composite(func)
        # Decomposing is slow (the inner ops miss FakeTensorMode's cache); the copies worth seeing come from
        # operands that are not contiguous, so composites of contiguous tensors run whole. Their outputs
        # are seen either way.
        if composite and self.session.active and not _all_contiguous(args):
            with self:
                out = func.decompose(*args, **(kwargs or {}))
            if out is not NotImplemented:
                return out
        return super().__torch_dispatch__(func, types, args, kwargs)


_TO_DTYPE = torch.ops.aten.to.dtype
# ops whose CUDA kernel may take the sorted-accumulate path with its own temporaries (memlens.prediction.scratch.index_put)
_INDEX_PUT_OPS = frozenset({torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
                            torch.ops.aten._index_put_impl_.default, torch.ops.aten._unsafe_index_put.default})
# ops whose CUDA kernel may need a global reduction buffer (memlens.prediction.scratch.reduce.reduce_global_bytes)
_REDUCE_OPS = frozenset(reduce_op_table())
_SCRATCH_OPS = _INDEX_PUT_OPS | _REDUCE_OPS | {_FLASH_BACKWARD}     # the last: memlens.prediction.scratch.flash


def _to_dtype_call(run):
    """``aten::to.dtype`` as ATen runs it: when nothing changes (same dtype, no copy, memory format kept) it
    returns `self` itself. Under ``inference_mode`` this composite reaches the dispatch modes whole and
    FakeTensorMode would take its uncached slow path for what is a no-op (cs336 inference: 589 calls)."""
    def call(self, dtype, non_blocking=False, copy=False, memory_format=None):
        if not copy and self.dtype == dtype and (memory_format is None or memory_format == torch.preserve_format):
            return self
        return run(self, dtype, non_blocking, copy, memory_format)
    return call


class _WrapperSubclassOp(Exception):
    """An op on a wrapper subclass (DTensor): recorded by the careful path, which looks inside."""


class PredictSession(Session):
    """A `Session` that records fake tensors' storages as blocks on their fake device."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._mode = _PredictMode(self)
        self.standins = StandIns()      # reads of fake tensors' values answered with stand-ins
        self._fake_device: dict[int, torch.device] = {}   # id(storage) -> device, for storages not yet seen
        self._cuda_sizes: dict[int, int] = {}   # block_id -> bytes, live cuda blocks (for memory_allocated())
        self.live_cuda_bytes = 0
        self.peak_cuda_bytes = 0
        self.op_threads: list[int] = []   # per op: the thread that ran it (the cuBLAS workspace is per thread)
        self.index_put_facts: dict[int, tuple] = {}   # op index -> scratch_index_put.index_put_sort_facts
        self.reduce_facts: dict[int, tuple] = {}      # op index -> scratch_reduce.reduce_facts (reductions)
        self.flash_facts: dict[int, tuple] = {}       # op index -> scratch_flash.flash_backward_facts

    def learn_op(self, func) -> tuple:
        entry = super().learn_op(func)
        if func is _TO_DTYPE:
            entry = entry[:5] + (_to_dtype_call(entry[5]),) + entry[6:]
            self._op_cache[id(func)] = entry
        elif func is _WAIT_TENSOR:
            entry = entry[:5] + (_wait_tensor_call,) + entry[6:]
            self._op_cache[id(func)] = entry
        return entry

    def _note_devices(self, value) -> bool:
        """Remember the fake device of every tensor in `value` whose storage is new to the session. True
        when `value` holds a wrapper subclass (a DTensor under FSDP2 or tensor parallelism): its memory is
        in its inner tensors, which the recorder's careful path records (`on_op` sends the op there)."""
        if isinstance(value, Tensor):
            if _is_wrapper_type(type(value)):
                for x in _inner_tensors(value):
                    self._note_devices(x)
                return True
            st = value.untyped_storage()
            key = id(st)
            if key not in self._live:
                self._fake_device[key] = value.device
        elif type(value) is list or type(value) is tuple:
            wrapped = False
            for v in value:
                wrapped = self._note_devices(v) or wrapped
            return wrapped
        return False

    def on_op(self, entry, args, kwargs, out, start, end) -> None:
        wrapped = self._note_devices(out)
        wrapped = self._note_devices(args) or wrapped
        if kwargs:
            wrapped = self._note_devices(tuple(kwargs.values())) or wrapped
        self.op_threads.append(_get_ident())
        if wrapped:     # the fast path would see the wrapper's empty storage: take the careful path
            raise _WrapperSubclassOp(entry[6])
        if entry[6] in _SCRATCH_OPS:
            if entry[6] in _INDEX_PUT_OPS:
                facts = index_put_sort_facts(entry[6], args, kwargs)
                if facts is not None:
                    self.index_put_facts[len(self.op_threads) - 1] = facts
            elif entry[6] is _FLASH_BACKWARD:
                facts = flash_backward_facts(args)
                if facts is not None:
                    self.flash_facts[len(self.op_threads) - 1] = facts
            else:
                facts = reduce_facts(entry[6], args, kwargs)
                if facts is not None:
                    self.reduce_facts[len(self.op_threads) - 1] = facts
        super().on_op(entry, args, kwargs, out, start, end)

    def on_op_carefully(self, entry, args, kwargs, out, start, end) -> None:
        # on_op appended this op's thread before it raised; the careful path records the op again
        if self.op_threads and len(self.op_threads) > len(self.buf.ops.data) // self.buf.OPS_WIDTH:
            self.op_threads.pop()
        self._note_devices(out)
        self._note_devices(args)
        if kwargs:
            self._note_devices(tuple(kwargs.values()))
        self.op_threads.append(_get_ident())
        super().on_op_carefully(entry, args, kwargs, out, start, end)

    def _mark_locked(self, tensor, category: int, module_idx: int) -> None:
        if self._note_devices(tensor):      # a DTensor parameter, gradient or state: its local tensor
            for inner in _inner_tensors(tensor):
                super()._mark_locked(inner, category, module_idx)
            return
        super()._mark_locked(tensor, category, module_idx)

    def _discover(self, st, op: int, t: int, before: bool) -> int:
        if st.device.type != "meta":
            return super()._discover(st, op, t, before)
        size = st.nbytes()
        device = self._fake_device.pop(id(st), None)
        if size == 0 or device is None or device.type == "meta":
            return -1
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", 0)
        bid = self._new_block(st, device, 0, size, op, t, before)
        if device.type == "cuda":
            self._cuda_sizes[bid] = size
            self.live_cuda_bytes += size
            if self.live_cuda_bytes > self.peak_cuda_bytes:
                self.peak_cuda_bytes = self.live_cuda_bytes
        return bid

    def _on_free(self, ref) -> None:
        entry = self._refs.get(id(ref))
        if entry is not None:
            size = self._cuda_sizes.pop(entry[1], 0)
            self.live_cuda_bytes -= size
        super()._on_free(ref)
