"""The fake-CUDA environment a prediction runs in: FakeTensorMode plus the patches ordinary code needs.

Inside, `cuda` tensors are fake (shapes, dtypes and strides only, no memory, no compute) and the
`torch.cuda` functions that scripts call report one device of the modelled GPU. What is patched, and why:

- ``torch.cuda.is_available`` / ``device_count`` / ``current_device`` / ``get_device_capability`` /
  ``get_device_name`` / ``synchronize`` / ``set_device`` / memory-stat and snapshot functions: on a CPU build
  they raise or say "no GPU", and ``torch.autocast("cuda")`` silently disables itself unless
  ``is_available()`` is true.
- ``nn.init.trunc_normal_`` (and friends that call ``.item()``): a data-dependent ``.item()`` cannot run on
  fake tensors; the patched version fills in place (``uniform_``), allocating what the real one allocates
  (nothing).
- ``nn.Module._apply`` (``.to()``, ``.cuda()``, ``.half()``): torch swaps fake parameters with
  ``swap_tensors``, which fails ("Couldn't swap ... weakref"); the patch sets ``param.data`` and the fake
  device instead, so parameters keep their identity (an optimizer built before ``.to()`` still sees them),
  and the old storage is freed as in a real run.
- ``F.scaled_dot_product_attention``: picks the fused kernel CUDA would pick (flash / memory-efficient)
  instead of the CPU build's math fallback (see `_predicted_sdpa`).
- ``torch.optim``'s foreach eligibility: fake tensors count as plain tensors, so optimizers take CUDA's
  default foreach path as a real run does (not the per-parameter loop).
- ops with a fused CPU/CUDA kernel and a decomposition for other backends (``silu_backward``) stay whole, as
  on CUDA (see `_fused_backward_kernels_stay_whole`).
- ``torch.backends.mha`` fast path off: ``nn.TransformerEncoder`` in inference with a padding mask would build
  nested tensors, which fake tensors cannot hold; the regular path predicts the padded batch (an upper bound).
- ``torch.save``: writes the checkpoint's structure without the bytes (see `_save_without_data`).
- ``Tensor.__format__``: ``f"{loss:.4f}"`` formats a one-value fake tensor by its stand-in value (see `_format_fake`).
- torch's warning on reading a FakeTensor's data pointer (``copy.deepcopy`` of a module reads it) is ignored;
  that message only. ``copy.deepcopy`` of a fake tensor keeps it in the prediction's mode (see `__deepcopy__`).
Everything is restored on exit.
"""
from __future__ import annotations

import contextlib

import torch

from memlens.prediction.patches import AttributePatches


def _no_grad_fill(tensor, *args, **kwargs):
    with torch.no_grad():
        return tensor.uniform_(-1.0, 1.0)


def _fake_apply(self, fn, recurse=True):
    """`nn.Module._apply` for fake parameters: `.data =` plus the fake device (see module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensor
    if recurse:
        for module in self.children():
            module._apply(fn)
    for key, param in self._parameters.items():
        if param is None:
            continue
        with torch.no_grad():
            applied = fn(param)
        if applied is param:
            pass
        elif isinstance(param, FakeTensor) and isinstance(applied, FakeTensor):
            param.data = applied
            param.fake_device = applied.fake_device
        else:
            self._parameters[key] = torch.nn.Parameter(applied, param.requires_grad)
            param = self._parameters[key]
        if param.grad is not None:
            with torch.no_grad():
                grad_applied = fn(param.grad)
            if isinstance(grad_applied, FakeTensor) and isinstance(param.grad, FakeTensor):
                param.grad.data = grad_applied
                param.grad.fake_device = grad_applied.fake_device
            else:
                param.grad = grad_applied
    for key, buf in self._buffers.items():
        if buf is not None:
            self._buffers[key] = fn(buf)
    return self


def _save_without_data(original):
    """`torch.save` for fake tensors: the checkpoint a real run writes (same objects, shapes, dtypes, file
    size) with its storage bytes left as empty space (torch's ``skip_data``; loads as zeros). Plain torch
    cannot pickle fake tensors, so a training script that saves a checkpoint would otherwise fail. A real
    save copies device storages to the host, allocating nothing on the GPU; so does this."""
    def save(obj, f, *args, **kwargs):
        with torch.serialization.skip_data(materialize_fake_tensors=True):
            return original(obj, f, *args, **kwargs)
    return save


def _format_fake(original):
    """``Tensor.__format__`` that formats a one-value fake tensor by its value, as it does a real one
    (``f"{loss:.4f}"``); torch's formats only plain tensors by value and hands others to ``object``, which
    refuses a format spec. The value is the prediction's stand-in (`memlens.prediction.standins`)."""
    def format_(self, format_spec):
        from torch._subclasses.fake_tensor import FakeTensor
        if isinstance(self, FakeTensor) and self.dim() == 0:
            return self.item().__format__(format_spec)
        return original(self, format_spec)
    return format_


def _predicted_sdpa(original, capability: tuple[int, int]):
    """`F.scaled_dot_product_attention` choosing the fused CUDA kernel a real run would choose.

    On a CPU build the fused kernels do not exist, so fake `cuda` inputs fall back to the math path, which
    materialises the (batch, heads, q, k) scores (and keeps them for backward): gigabytes a real GPU never
    allocates. torch's CUDA selection (``sdp_utils.cpp``), simplified: flash attention for fp16/bf16 on
    sm80+ without an explicit mask and head dim <= 256 and a multiple of 8; else memory-efficient attention
    (any float dtype, masks allowed, head dim a multiple of 8, or 4 in fp32); else math. Both fused ops have
    meta kernels and autograd formulas, so forward and backward allocate what the real kernels allocate
    (output, logsumexp; their backward's gradients).

    Grouped-query attention (``enable_gqa=True``, fewer key/value heads than query heads): CUDA's flash kernel
    takes the key/value heads as they are (``check_batch_size_and_num_heads_dense<true>`` in its constraints),
    so nothing is repeated and no scores are materialised; its backward's extra buffers for the group sums
    are added in `memlens.prediction.session`. The memory-efficient kernel does not accept grouped heads
    (``<false>``), so fp32 or masked GQA takes the math path on CUDA too (key/value repeated, scores kept),
    which is what the prediction runs. (A CPU run differs: CPU flash attention accepts grouped heads in fp32.)
    """
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        from torch._subclasses.fake_tensor import FakeTensor
        if (isinstance(query, FakeTensor) and query.device.type == "cuda" and query.dim() == 4
                and key.dim() == 4 and value.dim() == 4 and key.shape[-1] == query.shape[-1] == value.shape[-1]):
            d = query.shape[-1]
            half = query.dtype in (torch.float16, torch.bfloat16)
            heads, kv_heads = query.shape[-3], key.shape[-3]
            same_heads = heads == kv_heads == value.shape[-3]
            grouped = bool(enable_gqa) and kv_heads == value.shape[-3] and kv_heads > 0 and heads % kv_heads == 0
            if (half and attn_mask is None and capability >= (8, 0) and d % 8 == 0 and d <= 256
                    and (same_heads or grouped)):
                return torch.ops.aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False, scale=scale)[0]
            if (same_heads and query.dtype.is_floating_point and d % (8 if half else 4) == 0
                    and capability >= (5, 0)):
                needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
                return torch.ops.aten._scaled_dot_product_efficient_attention(
                    query, key, value, attn_mask, needs_lse, dropout_p, is_causal, scale=scale)[0]
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)
    return sdpa


class _Patches(AttributePatches):
    """Attribute patches applied on enter and restored on exit (nested predictions are refused), and other
    changes undone on exit."""

    def __init__(self, gpu_name: str, capability: tuple[int, int], total_memory: int | None):
        super().__init__()
        self.gpu_name = gpu_name
        self.capability = capability
        self.total_memory = total_memory
        self._undo: list = []

    def apply(self) -> None:
        cuda = torch.cuda
        props = _DeviceProperties(self.gpu_name, self.capability, self.total_memory)
        self.set(cuda, "is_available", lambda: True)
        self.set(cuda, "device_count", lambda: 1)
        self.set(cuda, "current_device", lambda: 0)
        self.set(cuda, "set_device", lambda device: None)
        self.set(cuda, "synchronize", lambda device=None: None)
        self.set(cuda, "get_device_capability", lambda device=None: self.capability)
        self.set(cuda, "get_device_name", lambda device=None: self.gpu_name)
        self.set(cuda, "get_device_properties", lambda device=None: props)
        self.set(cuda, "is_bf16_supported", lambda including_emulation=True: self.capability >= (8, 0))
        self.set(cuda, "empty_cache", lambda: None)
        for name in ("reset_peak_memory_stats", "reset_accumulated_memory_stats", "reset_max_memory_allocated"):
            self.set(cuda, name, lambda device=None: None)
        self.set(cuda.memory, "_record_memory_history", lambda *a, **k: None)
        self.set(cuda.memory, "_dump_snapshot", lambda *a, **k: None)
        nvtx = cuda.nvtx
        self.set(nvtx, "range_push", lambda msg: 0)
        self.set(nvtx, "range_pop", lambda: 0)
        self.set(nvtx, "mark", lambda msg: None)
        self.set(nvtx, "range", _null_range)
        init = torch.nn.init
        for name in ("trunc_normal_",):
            self.set(init, name, _no_grad_fill)
        self.set(torch.nn.Module, "_apply", _fake_apply)
        self.set(torch, "save", _save_without_data(torch.save))
        self.set(torch.Tensor, "__format__", _format_fake(torch.Tensor.__format__))
        # nn.TransformerEncoder's inference fast path packs padded batches into nested tensors, which fake
        # tensors cannot hold (torch falls back to a real CUDA kernel); the regular path keeps the padding
        import torch.backends.mha as mha
        self.set(mha, "_is_fastpath_enabled", False)
        F = torch.nn.functional
        self.set(F, "scaled_dot_product_attention", _predicted_sdpa(F.scaled_dot_product_attention, self.capability))
        # optimizers choose foreach (CUDA's default) only for plain tensor types; a real run's parameters are
        # plain, so fake ones must count as plain too, or AdamW & co. take the per-parameter path, whose
        # temporaries differ (foreach allocates one intermediate per parameter at once)
        from torch._subclasses.fake_tensor import FakeTensor
        from torch.optim import optimizer as _optimizer
        types = _optimizer._foreach_supported_types
        if FakeTensor not in types:
            types.append(FakeTensor)
            self._undo.append(lambda: types.remove(FakeTensor) if FakeTensor in types else None)

        self._undo.append(_hide_fake_data_ptr_warning())
        self._undo.append(_fused_backward_kernels_stay_whole())

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()
        super().restore()


# torch warns whenever a fake tensor's data pointer is read (``copy.deepcopy`` of a parameter reads it, as do
# some libraries); inside a prediction every tensor is fake by design, so the warning says nothing to the user
_FAKE_DATA_PTR_WARNING = r"Accessing the data pointer of FakeTensor is deprecated"


_FUSED_WITH_FALLBACK: list[str] | None = None


def _cuda_kernel_missing_on_this_build(*args, **kwargs):
    raise RuntimeError("memlens.predict: a CPU-only torch has no CUDA kernels (only fake cuda tensors reach here)")


def _fused_backward_kernels_stay_whole():
    """On a CPU build, ops with a CPU kernel and a CompositeImplicitAutograd fallback (``silu_backward``,
    ``mish_backward``) have no CUDA kernel, so autograd takes the fallback for fake `cuda` tensors and runs
    the decomposition: five or six temporaries the size of the input where CUDA runs one fused kernel. A
    placeholder CUDA registration makes the dispatcher treat them as CUDA would (FakeTensorMode then sizes
    the one output); it is never called, since fake tensors stop at the Python key. Removed on exit."""
    global _FUSED_WITH_FALLBACK
    from memlens.prediction import shim
    if shim.torch_has_cuda_build():
        return lambda: None
    if _FUSED_WITH_FALLBACK is None:   # the op table is fixed once torch is loaded: look it up once (~60 ms)
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        _FUSED_WITH_FALLBACK = [name[len("aten::"):] for name in torch._C._dispatch_get_all_op_names()
                                if name.startswith("aten::") and has(name, "CPU")
                                and has(name, "CompositeImplicitAutograd") and not has(name, "CUDA")]
    lib = torch.library.Library("aten", "IMPL")
    for name in _FUSED_WITH_FALLBACK:
        lib.impl(name, _cuda_kernel_missing_on_this_build, "CUDA")
    return lib._destroy


def _hide_fake_data_ptr_warning():
    """Ignore torch's FakeTensor data-pointer warning (that message only) until the returned undo is called;
    filters the user adds meanwhile are kept."""
    import warnings
    warnings.filterwarnings("ignore", message=_FAKE_DATA_PTR_WARNING, category=UserWarning)
    entry = warnings.filters[0]

    def undo() -> None:
        try:
            warnings.filters.remove(entry)
        except ValueError:
            return
        mutated = getattr(warnings, "_filters_mutated", None)   # drops the per-call-site decisions cached
        if mutated is not None:
            mutated()
    return undo


@contextlib.contextmanager
def _null_range(*args, **kwargs):
    yield


class _DeviceProperties:
    """What ``torch.cuda.get_device_properties`` reports for the modelled GPU."""

    def __init__(self, name: str, capability: tuple[int, int], total_memory: int | None):
        self.name = name
        self.major, self.minor = capability
        self.total_memory = total_memory or 0
        self.multi_processor_count = 0

    def __repr__(self) -> str:
        return f"_DeviceProperties(name={self.name!r}, major={self.major}, minor={self.minor}, " \
               f"total_memory={self.total_memory})"


def _predict_mode_class():
    from torch._subclasses.fake_tensor import FakeTensorMode

    class PredictFakeTensorMode(FakeTensorMode):
        """FakeTensorMode that never runs real CUDA ops. Constant propagation (a small tensor made with
        ``torch.tensor(...)`` keeps its real CPU value) runs ops on the real values; moving such a tensor to
        ``cuda`` (BatchNorm's ``num_batches_tracked`` under ``model.cuda()``) would then run a real CUDA
        copy, which a CPU-only build cannot. torch skips that propagation when no CUDA device is available;
        under the shim one is reported, so this mode says what is true: there is no device to initialise."""

        @property
        def avoid_device_init(self) -> bool:
            return True

        def __deepcopy__(self, memo):
            # ``copy.deepcopy`` of a fake tensor copies its ``__dict__``, which holds this mode: a copy would
            # drag along the patched ``torch.cuda`` module (TypeError: cannot pickle 'module' object) and
            # give the copied tensor a second mode. The copy of a fake tensor belongs to the same mode.
            return self

    return PredictFakeTensorMode


@contextlib.contextmanager
def fake_cuda(gpu_name: str = "H100", capability: tuple[int, int] = (9, 0), total_memory: int | None = None,
              fast_cache_key: bool = True):
    """FakeTensorMode with a working fake `cuda` device and the patches above; yields the mode.
    `fast_cache_key`: build FakeTensorMode's dispatch-cache keys with `memlens.prediction.fastkey` (same
    cache, same entries, a cheaper key); False leaves FakeTensorMode exactly as torch ships it."""
    from memlens.prediction import shim
    shim.require()
    _PredictFakeTensorMode = _predict_mode_class()
    patches = _Patches(gpu_name, capability, total_memory)
    mode = _PredictFakeTensorMode(allow_non_fake_inputs=True)
    if fast_cache_key:
        from memlens.prediction import fastkey
        fastkey.install(mode)
    mode.memlens_patches = patches     # a prediction adds its own (memory-stat answers) and restores them
    shim.set_enabled(True)
    patches.apply()
    try:
        with mode:
            yield mode
    finally:
        patches.restore()
        shim.set_enabled(False)
