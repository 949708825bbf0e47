"""What fake tensors never see, per GPU: the numbers the prediction adds explicitly.

The per-GPU numbers (compute capability, SM count, threads per SM, CUDA context) are rows of the one GPU
table, `memlens.devicetime.gpu_table`; `gpu_facts` reads them, and `memlens.predict(..., cuda_context=...)`
overrides the context. Sources:
- cuBLAS workspace: torch 2.13 ``c10/cuda/CublasHandlePool.cpp`` ``getChosenWorkspaceSize``: with no
  ``CUBLAS_WORKSPACE_CONFIG``, 4096 KiB x 8 = 32 MiB on compute capability 9.x to 12.x (Hopper, Blackwell), else
  4096 KiB x 2 + 16 KiB x 8 = 8,320 KiB. One workspace per (handle, stream); handles are per thread, so a training
  step has two (the forward's thread and autograd's device thread). It comes from the caching allocator at the
  first GEMM of that (thread, stream) and is never freed. The real cs336 snapshots hold exactly such 8,519,680-byte blocks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from memlens.devicetime.gpu import GPU
from memlens.devicetime.gpu_table import BUILTIN
from memlens.errors import InputError



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


def gpu_facts(gpu, **overrides) -> GPUMemoryFacts:
    """The memory facts of `gpu`: a name or alias from the one GPU table (`memlens.gpus()`, case, spaces and
    '-'/'_' ignored; "H100", "h100-sxm", "A100-40GB"), a `memlens.GPU`, a calibrated GPU's JSON file (the
    memory facts of the part it was fitted on, under its own name) or a `GPUMemoryFacts`; with overrides."""
    if isinstance(gpu, GPUMemoryFacts):
        facts = gpu
    elif isinstance(gpu, GPU):
        facts = _facts_of(gpu)
    elif str(gpu).strip().lower().endswith(".json"):   # a calibrated GPU: the memory of the part it was fitted on
        from memlens.devicetime.gpus import load_gpu
        described = load_gpu(gpu)
        base = gpu_facts(described.calibration.get("base") or described.name)
        return replace(base, name=described.name, **overrides)  # named by its own name, not the base's
    else:
        facts = _facts_of(_table_row(gpu))
    return replace(facts, **overrides) if overrides else facts


def _table_row(name):
    """The row of the one GPU table called `name`, else the row whose name or alias `name` starts with
    (longest first: "H100 80GB" is the H100 SXM, "H100 PCIe 80GB" the PCIe card)."""
    from memlens.devicetime.gpus import gpu as table_gpu   # here: that module loads pandas (for its table)
    try:
        return table_gpu(name)
    except InputError:
        pass
    norm = _squash(name)
    spelled = [(_squash(s), g) for g in BUILTIN for s in (g.name, *g.aliases)]
    prefixes = [(s, g) for s, g in spelled if s and norm.startswith(s)]
    if not prefixes:
        raise InputError(f"unknown gpu '{name}' (known: {', '.join(known_gpus())}; or pass a memlens.GPU)")
    return max(prefixes, key=lambda sg: len(sg[0]))[1]


def _squash(text) -> str:
    return "".join(ch for ch in str(text).upper() if ch not in " -_")


def _facts_of(g) -> GPUMemoryFacts:
    if g.capability is None:
        raise InputError(f"gpu '{g.name}': prediction on fake CUDA tensors models NVIDIA CUDA parts; this part has "
                         f"no CUDA compute capability in the GPU table (known: {', '.join(known_gpus())})")
    return GPUMemoryFacts(g.device_name or g.name, g.capability, g.memory_bytes, g.cuda_context, g.compute_units,
                          g.max_threads_per_sm)


def known_gpus() -> list[str]:
    """The parts of the one GPU table that prediction models (those with a CUDA compute capability)."""
    return [g.name for g in BUILTIN if g.capability is not None]


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
    if capability[0] in (9, 10, 11, 12):     # Hopper and Blackwell ("use32mb" in torch)
        return 4096 * 1024 * 8
    return 4096 * 1024 * 2 + 16 * 1024 * 8
