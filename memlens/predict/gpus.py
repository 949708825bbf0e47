"""What fake tensors never see, per GPU: the numbers the prediction adds explicitly.

Each figure is overridable (``memlens.predict(..., overrides={...})``). Sources:
- cuBLAS workspace: torch 2.13 ``c10/cuda/CublasHandlePool.cpp`` ``getChosenWorkspaceSize``: with no
  ``CUBLAS_WORKSPACE_CONFIG``, 4096 KiB x 8 = 32 MiB on compute capability 9.x, else 4096 KiB x 2 + 16 KiB x 8
  = 8,320 KiB. One workspace per (handle, stream); handles are per thread, so a training step has two (the
  forward's thread and autograd's device thread). It comes from the caching allocator at the first GEMM of
  that (thread, stream) and is never freed. The real cs336 snapshots hold exactly such 8,519,680-byte blocks.
- CUDA context: the driver's per-process reservation outside the caching allocator (not in
  ``memory_allocated``/``memory_reserved`` but it takes device memory); typical CUDA 12 values with lazy module
  loading, measured with nvidia-smi by many users: ~500 MiB on H100/H200, ~420 MiB on A100, ~300 MiB on
  consumer cards. An estimate: override it with your own measurement.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from memlens.errors import InputError

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class GPUMemoryFacts:
    """Memory facts of one GPU model. Bytes."""

    name: str
    capability: tuple[int, int]
    total_memory: int          # device memory, bytes
    cuda_context: int          # driver/context reservation outside the caching allocator, bytes

    @property
    def cublas_workspace(self) -> int:
        """Bytes of one cuBLAS workspace (per thread and stream), honouring CUBLAS_WORKSPACE_CONFIG."""
        return cublas_workspace_bytes(self.capability, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


_TABLE = {
    "H100": GPUMemoryFacts("NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB, 500 * MiB),
    "H200": GPUMemoryFacts("NVIDIA H200", (9, 0), 141 * 10**9, 500 * MiB),
    "A100": GPUMemoryFacts("NVIDIA A100-SXM4-80GB", (8, 0), 80 * GiB, 420 * MiB),
    "A100-40GB": GPUMemoryFacts("NVIDIA A100-SXM4-40GB", (8, 0), 40 * GiB, 420 * MiB),
    "L4": GPUMemoryFacts("NVIDIA L4", (8, 9), 24 * GiB, 300 * MiB),
    "A10G": GPUMemoryFacts("NVIDIA A10G", (8, 6), 24 * GiB, 300 * MiB),
    "RTX4090": GPUMemoryFacts("NVIDIA GeForce RTX 4090", (8, 9), 24 * GiB, 300 * MiB),
    "V100": GPUMemoryFacts("Tesla V100-SXM2-32GB", (7, 0), 32 * GiB, 300 * MiB),
    "T4": GPUMemoryFacts("Tesla T4", (7, 5), 16 * GiB, 250 * MiB),
}


def gpu_facts(gpu: str | GPUMemoryFacts, **overrides) -> GPUMemoryFacts:
    """The facts of `gpu` (a name from the table, case-insensitive, or a `GPUMemoryFacts`), with overrides."""
    if isinstance(gpu, GPUMemoryFacts):
        facts = gpu
    else:
        norm = str(gpu).upper().replace(" ", "")
        keys = {k.upper(): k for k in _TABLE}
        key = keys.get(norm)
        if key is None:   # "H100 SXM", "A100 SXM 80GB" (memlens.gpus() names): the longest table key they start with
            prefixes = [k for k in keys if norm.startswith(k)]
            key = keys[max(prefixes, key=len)] if prefixes else None
        if key is None:
            raise InputError(f"unknown gpu '{gpu}' (known: {', '.join(_TABLE)}; or pass a GPUMemoryFacts)")
        facts = _TABLE[key]
    return replace(facts, **overrides) if overrides else facts


def known_gpus() -> list[str]:
    return list(_TABLE)


def cublas_workspace_bytes(capability: tuple[int, int], config: str | None) -> int:
    """cuBLAS workspace bytes for `capability` under a ``CUBLAS_WORKSPACE_CONFIG`` value (``:SIZE_KiB:COUNT``
    pairs, summed), as torch computes it."""
    if config:
        parts = [p for p in config.split(":") if p != ""]
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            raise InputError(f"CUBLAS_WORKSPACE_CONFIG '{config}' is not ':SIZE:COUNT' pairs") from None
        if len(nums) % 2 == 0 and nums:
            return sum(nums[i] * 1024 * nums[i + 1] for i in range(0, len(nums), 2))
        raise InputError(f"CUBLAS_WORKSPACE_CONFIG '{config}' is not ':SIZE:COUNT' pairs")
    if capability[0] == 9:
        return 4096 * 1024 * 8
    return 4096 * 1024 * 2 + 16 * 1024 * 8
