"""Activation offload as planned: a ``torch.autograd.graph.saved_tensors_hooks`` pair that moves exactly the
planned saved tensors to host memory and brings each back at its planned point in backward (`OffloadHooks`),
and the census hooks that name every saved tensor so that a plan can be made (`SaveCensus`).

A saved tensor is named by the module whose forward saves it (a ``named_modules`` name), the order of the
save among that module's saves in one forward call, and its shape and dtype: the same names on every step and
in every process that runs the same model on the same shapes (never an ``id()`` or an address).

How one planned tensor travels, on CUDA: at the save (pack) a pinned host buffer is filled by a
``non_blocking`` copy on a side stream that first waits for the compute stream; the device tensor is handed to
that stream (``record_stream``), so its block is freed once the forward drops it (after its last forward use)
and is not reused before the copy has read it. When backward reaches the planned module (a hook on the
gradient of that module's output, which torch computes just before the module's own backward ops), a device
buffer is allocated and filled from the host on a second side stream; the unpack makes the compute stream
wait for that copy's event. Without CUDA streams (a CPU build, or a prediction's fake CUDA) the copies are
synchronous, and on the CPU the host buffer is a separate allocation, so the original block is freed as on a
GPU. An unpack whose prefetch did not happen copies synchronously then (`OffloadHooks.late` counts them).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass


@dataclass(frozen=True)
class OffloadTensor:
    """One planned saved tensor: `module` (``named_modules`` name whose forward saves it), `index` (the
    0-based order of the save among that module's saves in one forward call), `shape`, `dtype` (``str`` of the
    torch dtype), `size` (bytes of its block), `prefetch_at` (``named_modules`` name of the module at whose
    backward start it is brought back; ``""`` = the model's output, the start of backward), and, read from
    the planning trace: `made_by` (the op that allocated it), `last_use` (the forward op after which it
    leaves the device), `first_use` (the backward op that reads it back) and `stall_ns` (modeled ns that op
    waits for the copy back over the GPU's host link, 0 when the prefetch is early enough)."""

    module: str
    index: int
    shape: tuple
    dtype: str
    size: int
    prefetch_at: str = ""
    made_by: str = ""
    last_use: str = ""
    first_use: str = ""
    stall_ns: int = 0


class _Packed:
    """What autograd keeps for one offloaded tensor: the host copy and, once prefetched, the device copy."""

    __slots__ = ("host", "device", "dtype", "ready_out", "back", "ready_in", "__weakref__")

    def __init__(self, host, device, dtype, ready_out):
        self.host, self.device, self.dtype, self.ready_out = host, device, dtype, ready_out
        self.back, self.ready_in = None, None


def _streams(device):
    """(copy-out stream, copy-in stream) on a CUDA `device`; (None, None) where CUDA streams do not exist (a
    CPU tensor, a CPU build, a prediction's fake CUDA): the copies are synchronous there."""
    import torch
    if device.type != "cuda":
        return None, None
    try:
        return torch.cuda.Stream(device), torch.cuda.Stream(device)
    except (RuntimeError, AssertionError, TypeError):
        return None, None


class _ModuleHooks:
    """Shared plumbing: wrap an owner module's forward so that its saves go through `pack`/`unpack` with a
    per-call save counter (reset at each call of that module's forward)."""

    attribute = "_memlens_offload"

    def _wrap_owner(self, name: str, module) -> None:
        import torch
        forward = module.forward
        hooks = self

        def counted(*args, **kwargs):
            hooks._count[name] = 0
            with torch.autograd.graph.saved_tensors_hooks(lambda t: hooks._pack(name, t), hooks._unpack):
                return forward(*args, **kwargs)
        own = module.__dict__.get("forward")      # a forward set on the instance before (else the class's)
        module.forward = counted
        setattr(module, self.attribute, True)
        self._owners.append((module, own))

    def remove(self) -> None:
        """Undo `install`: the owners' forwards and every hook handle are restored."""
        for module, own in self._owners:
            if own is None:
                del module.forward
            else:
                module.forward = own
            if hasattr(module, self.attribute):
                delattr(module, self.attribute)
        for handle in self._handles:
            handle.remove()
        self._owners, self._handles = [], []


class OffloadHooks(_ModuleHooks):
    """Offload exactly `tensors` (`OffloadTensor` rows of a plan) of a model and prefetch each at its planned
    module's backward. ``OffloadHooks(tensors).install(model)`` returns the hooks (``remove()`` undoes it).
    Counters, in tensors: `offloaded` (packs copied to the host), `prefetched` (copies back started at the
    planned point), `late` (unpacks that found no prefetched copy and copied synchronously)."""

    def __init__(self, tensors):
        self.tensors = tuple(tensors)
        self._planned = {(t.module, t.index): t for t in self.tensors}
        self._count: dict = {}
        self._waiting: dict = {}           # prefetch module name -> weak refs to packed tensors
        self._owners, self._handles = [], []
        self._stream_of: dict = {}
        self._matched: set = set()
        self.offloaded = self.prefetched = self.late = 0

    def unmatched(self) -> list:
        """The planned `OffloadTensor` rows that no save has matched (module, order, shape, dtype) so far."""
        return [t for t in self.tensors if (t.module, t.index) not in self._matched]

    def install(self, model):
        """Install on `model` in place; returns self. Raises `memlens.advice.checkpoint.CannotWrap` naming a
        planned module missing from the model or already offloaded."""
        from memlens.advice.checkpoint import CannotWrap
        owners = sorted({t.module for t in self.tensors})
        points = sorted({t.prefetch_at for t in self.tensors})
        modules = {name: _find(model, name) for name in owners + points}
        for name, module in modules.items():
            if module is None:
                raise CannotWrap(f"module {name!r} is not in the model (its named_modules() do not include it)")
        for name in owners:
            if getattr(modules[name], self.attribute, False):
                raise CannotWrap(f"module {name!r} is already wrapped (checkpointed or offloaded)")
        for name in owners:
            self._wrap_owner(name, modules[name])
        for name in points:
            self._handles.append(modules[name].register_forward_hook(self._arm(name)))
        return self

    # ---- forward: save -------------------------------------------------------------------------------------
    def _pack(self, owner: str, tensor):
        index = self._count.get(owner, 0)
        self._count[owner] = index + 1
        plan = self._planned.get((owner, index))
        if plan is None or tuple(tensor.shape) != tuple(plan.shape) or str(tensor.dtype) != plan.dtype:
            return tensor
        packed = self._offload(tensor)
        self._matched.add((owner, index))
        waiting = self._waiting.setdefault(plan.prefetch_at, [])
        if len(waiting) >= 4 * len(self._planned):     # forwards without a backward: drop the dead entries
            waiting[:] = [ref for ref in waiting if ref() is not None]
        waiting.append(weakref.ref(packed))
        self.offloaded += 1
        return packed

    def _offload(self, tensor):
        import torch
        out_stream, _ = self._streams(tensor.device)
        pin = tensor.device.type == "cuda" and torch.cuda.is_available()
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
        if out_stream is None:
            host.copy_(tensor)         # synchronous; on the CPU a separate block, so the original is freed
            return _Packed(host, tensor.device, tensor.dtype, None)
        out_stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(out_stream):
            host.copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()
            done.record(out_stream)
        tensor.record_stream(out_stream)   # its block is not reused before the copy has read it
        return _Packed(host, tensor.device, tensor.dtype, done)

    # ---- backward: prefetch at the planned module, unpack at the use ---------------------------------------
    def _arm(self, name: str):
        """Forward hook of a prefetch module: hook the gradient of its output, which backward computes just
        before that module's own backward ops."""
        def armed(module, args, output):
            tensor = _first_grad_tensor(output)
            if tensor is not None:
                tensor.register_hook(lambda grad: self._prefetch(name))
        return armed

    def _prefetch(self, name: str) -> None:
        for ref in self._waiting.pop(name, []):
            packed = ref()
            if packed is not None and packed.back is None:
                self._copy_back(packed)
                self.prefetched += 1

    def _copy_back(self, packed: _Packed) -> None:
        import torch
        _, in_stream = self._streams(packed.device)
        if in_stream is None:
            packed.back = packed.host.to(packed.device, copy=True)   # a new block, at this point
            return
        with torch.cuda.stream(in_stream):
            if packed.ready_out is not None:
                in_stream.wait_event(packed.ready_out)
            packed.back = torch.empty(packed.host.shape, dtype=packed.dtype, device=packed.device)
            packed.back.copy_(packed.host, non_blocking=True)
            packed.ready_in = torch.cuda.Event()
            packed.ready_in.record(in_stream)

    def _unpack(self, packed):
        if not isinstance(packed, _Packed):
            return packed
        if packed.back is None:               # the planned prefetch did not run: copy now
            self.late += 1
            self._copy_back(packed)
        back, packed.back = packed.back, None  # the next unpack (retain_graph) copies again from the host
        if packed.ready_in is not None:
            import torch
            compute = torch.cuda.current_stream(packed.device)
            compute.wait_event(packed.ready_in)
            back.record_stream(compute)
            packed.ready_in = None
        return back

    def _streams(self, device):
        key = str(device)
        if key not in self._stream_of:
            self._stream_of[key] = _streams(device)
        return self._stream_of[key]


def _find(model, name: str):
    """The submodule `name` of `model` (``named_modules`` names of the model as planned: a checkpoint wrapper
    put around a module since is looked through); None when there is none."""
    module = model
    for part in name.split(".") if name else []:
        module = getattr(module, "_checkpoint_wrapped_module", module)
        module = module._modules.get(part)
        if module is None:
            return None
    return module


def _first_grad_tensor(output):
    """The first tensor requiring grad in a module's output (a tensor, or nested tuples/lists/dicts)."""
    import torch
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    for item in items:
        found = _first_grad_tensor(item)
        if found is not None:
            return found
    return None


CENSUS_MARKER = "aten::nansum"   # the op each census save runs on a 1-element view of the saved tensor


class SaveCensus(_ModuleHooks):
    """Name every tensor the forwards of `owners` (``named_modules`` names) save, for planning: each save
    appends ``(module, index, shape, dtype, nbytes, call)`` to `saves` (`call`: the how-many-th forward of the
    model's root this was) and, for a floating-point tensor, runs `CENSUS_MARKER` on a one-element view of it,
    so that a recording or prediction shows which block each save holds (that op's read access) in save order.
    Saved tensors are returned unchanged."""

    def __init__(self, owners):
        self.owners = tuple(owners)
        self.saves: list = []
        self.calls = 0
        self._count: dict = {}
        self._owners, self._handles = [], []

    def install(self, model):
        """Install on `model` in place; returns self."""
        for name in self.owners:     # found through a checkpoint wrapper put around a sibling since
            self._wrap_owner(name, _find(model, name))
        self._handles.append(model.register_forward_pre_hook(self._new_call))
        return self

    def _new_call(self, module, args):
        self.calls += 1

    def _pack(self, owner: str, tensor):
        import torch
        index = self._count.get(owner, 0)
        self._count[owner] = index + 1
        marked = tensor.is_floating_point() and tensor.numel() > 0
        self.saves.append((owner, index, tuple(tensor.shape), str(tensor.dtype),
                           int(tensor.untyped_storage().nbytes()), self.calls, marked))
        if marked:
            with torch.no_grad():
                torch.nansum(tensor.detach().as_strided((1,), (1,)))
        return tensor

    @staticmethod
    def _unpack(tensor):
        return tensor

    def last_call(self) -> list:
        """The marked saves of the last forward of the model's root, in save order."""
        return [s for s in self.saves if s[5] == self.calls and s[6]]


def install(model, tensors) -> OffloadHooks:
    """``OffloadHooks(tensors).install(model)``: offload exactly `tensors` of `model` (in place)."""
    return OffloadHooks(tensors).install(model)
