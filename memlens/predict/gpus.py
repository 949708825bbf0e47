"""What fake tensors never see, per GPU: the numbers the prediction adds explicitly.

Each figure is overridable (``memlens.predict(..., overrides={...})``). Sources:
- cuBLAS workspace: torch 2.13 ``c10/cuda/CublasHandlePool.cpp`` ``getChosenWorkspaceSize``: with no
  ``CUBLAS_WORKSPACE_CONFIG``, 4096 KiB x 8 = 32 MiB on compute capability 9.x, else 4096 KiB x 2 + 16 KiB x 8
  = 8,320 KiB. One workspace per (handle, stream); handles are per thread, so a training step has two (the
  forward's thread and autograd's device thread). It comes from the caching allocator at the first GEMM of
  that (thread, stream) and is never freed. The real cs336 snapshots hold exactly such 8,519,680-byte blocks.
- SM count and max resident threads per SM (what ATen's reduction kernels size their grid with, see
  ``memlens.predict.scratch``): SM counts from NVIDIA's product pages / architecture whitepapers (H100 SXM5 132,
  H200 132, A100 108, L4 58, A10G 80, RTX 4090 128, V100 80, T4 40); threads per SM from the CUDA C++
  Programming Guide's per-compute-capability table (2048 on 7.0, 8.0 and 9.0; 1536 on 8.6 and 8.9; 1024 on 7.5).
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
    sm_count: int = 108        # multiProcessorCount
    max_threads_per_sm: int = 2048   # maxThreadsPerMultiProcessor

    @property
    def cublas_workspace(self) -> int:
        """Bytes of one cuBLAS workspace (per thread and stream), honouring CUBLAS_WORKSPACE_CONFIG."""
        return cublas_workspace_bytes(self.capability, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


_TABLE = {
    "H100": GPUMemoryFacts("NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB, 500 * MiB, 132, 2048),
    "H200": GPUMemoryFacts("NVIDIA H200", (9, 0), 141 * 10**9, 500 * MiB, 132, 2048),
    "A100": GPUMemoryFacts("NVIDIA A100-SXM4-80GB", (8, 0), 80 * GiB, 420 * MiB, 108, 2048),
    "A100-40GB": GPUMemoryFacts("NVIDIA A100-SXM4-40GB", (8, 0), 40 * GiB, 420 * MiB, 108, 2048),
    "L4": GPUMemoryFacts("NVIDIA L4", (8, 9), 24 * GiB, 300 * MiB, 58, 1536),
    "A10G": GPUMemoryFacts("NVIDIA A10G", (8, 6), 24 * GiB, 300 * MiB, 80, 1536),
    "RTX4090": GPUMemoryFacts("NVIDIA GeForce RTX 4090", (8, 9), 24 * GiB, 300 * MiB, 128, 1536),
    "V100": GPUMemoryFacts("Tesla V100-SXM2-32GB", (7, 0), 32 * GiB, 300 * MiB, 80, 2048),
    "T4": GPUMemoryFacts("Tesla T4", (7, 5), 16 * GiB, 250 * MiB, 40, 1024),
}


def gpu_facts(gpu: str | GPUMemoryFacts, **overrides) -> GPUMemoryFacts:
    """The facts of `gpu` (a name from the table, case-insensitive, or a `GPUMemoryFacts`), with overrides."""
    if isinstance(gpu, GPUMemoryFacts):
        facts = gpu
    elif str(gpu).strip().lower().endswith(".json"):   # a calibrated GPU: the memory of the part it was fitted on
        from memlens.devicetime.gpus import load_gpu
        described = load_gpu(gpu)
        base = gpu_facts(described.calibration.get("base") or described.name)
        return replace(base, name=described.name, **overrides)  # named by its own name, not the base's
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
