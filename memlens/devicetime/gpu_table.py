"""The one GPU table: every built-in part with its datasheet peaks, the latency constants of the cost model and
the memory facts prediction needs, each row with its sources.

Each built-in row carries its source. Peaks are *dense* (no 2:4 sparsity) vendor datasheet figures; the
host link is the effective pinned-memory copy rate per direction (~80% of the raw PCIe rate, which is
what ``cudaMemcpyAsync`` of pinned memory reaches; NVLink-C2C at its nominal 450 GB/s per direction).

Library efficiencies (fractions of a peak): `gemm_efficiency` (cuBLAS ~0.7; hipBLASLt 0.4: the MI300X
TimeSformer profile's large GEMMs reach 0.35-0.4 of the datasheet rate), `attention_efficiency`
(FlashAttention-2: 0.17 on Hopper, 0.45 on Ampere/Ada, 0.3 for Volta's memory-efficient kernel; AMD 0.12
from the MI300X bert-small profile), `norm_efficiency` (row-wise norms: 0.41 of HBM on the H100 TimeSformer
profile, 0.25 on the MI300X one), `softmax_block_efficiency` (0.20 on both), `pageable_bw` (host copies
from pageable memory: ~11 GB/s on NVIDIA systems, 35 GB/s with ROCm's staging). See
`memlens.devicetime.rules` for the rules that use them.

The latency constants (`kernel_floor_ns`, `gemm_floor_ns`, `gemm_k_ns`, `attention_floor_ns`) describe
how far small kernels are from any peak (see `memlens.devicetime.costmodel`). They were read, kernel by
kernel, from public Kineto profiles for the H100 SXM and the MI300X (AMD-AGI/TraceLens test traces:
smallest elementwise kernel, the fixed part and the per-K slope of single-wave GEMMs, a short-sequence
flash-attention kernel). For the other NVIDIA parts they are the H100's scaled by the ratio of boost
clocks (latency in cycles is an architecture property; Ampere/Ada/Volta kernels are a bit slower per
cycle than that, so those rows are estimates, marked so in `latency_source`).

Memory facts for prediction: CUDA context ~500 MiB on H100/H200, ~420 MiB on A100, ~250-300 MiB on smaller
cards (CUDA 12 with lazy module loading, nvidia-smi readings many users report: an estimate, override it with
your own measurement); SM counts from NVIDIA's product pages and whitepapers; threads per SM from the CUDA
C++ Programming Guide's per-compute-capability table (2048 on 7.0, 8.0, 9.0; 1536 on 8.6 and 8.9; 1024 on 7.5).
"""
from __future__ import annotations

from memlens.devicetime.gpu import GPU

_T = 1e12
_GB = 1e9
MiB = 1 << 20


def _scaled(base: dict, clock_ratio: float) -> dict:
    """The H100's latency constants for a part whose boost clock is `1/clock_ratio` of the H100's."""
    return {k: base[k] * clock_ratio for k in ("launch_ns", "gemm_floor_ns", "gemm_k_ns", "attention_floor_ns")}


# Measured on the H100 SXM (TraceLens bert-small profile, kernel durations): smallest elementwise kernel
# ~1.6 us; single-wave bf16 GEMMs 5.8 us at K=512 and 8.2 us at K=2048 (-> 5.0 us + 1.6 ns per K);
# flash attention at 1 x 8 heads x 141 tokens x 64: 9.3 us (-> 7.0 us + the compute of 2 KV blocks).
_H100_LAT = {"launch_ns": 1_550.0, "gemm_floor_ns": 5_000.0, "gemm_k_ns": 1.55, "attention_floor_ns": 4_500.0}
_H100_CLOCK = 1.98
_PCIE3 = (13.2 * _GB, 12.2 * _GB)   # Zhang et al. measured (arXiv 1903.06631), out / in
_PCIE4 = (25 * _GB, 25 * _GB)
_PCIE5 = (50 * _GB, 50 * _GB)
_C2C = (450 * _GB, 450 * _GB)
# GPU-to-GPU links, one direction per GPU (datasheets give NVLink as bidirectional totals): H100/H200 SXM
# NVLink 4 900 GB/s -> 450; A100 SXM NVLink 3 600 -> 300; V100 SXM2 NVLink 2 300 -> 150. Network: one NIC per
# GPU as in DGX systems, InfiniBand NDR 400 Gb/s = 50 GB/s (Hopper), HDR 200 Gb/s = 25 GB/s (A100),
# EDR 100 Gb/s = 12.5 GB/s (V100): an estimate of a typical cluster, not a property of the GPU.
_NVL4 = {"nvlink_bw": 450 * _GB, "network_bw": 50 * _GB,
         "interconnect_source": "NVLink 4 900 GB/s bidirectional (datasheet) -> 450 GB/s per direction; network "
                                "estimate: one InfiniBand NDR 400 Gb/s NIC per GPU = 50 GB/s"}
_NO_GPU_LINK = "no GPU-to-GPU link modeled: GPUs of a node talk over PCIe (the host link)"
# NVLink 5 (Blackwell) 1.8 TB/s bidirectional per GPU -> 900 GB/s per direction; one 400 Gb/s NIC per GPU
_NVL5 = {"nvlink_bw": 900 * _GB, "network_bw": 50 * _GB,
         "interconnect_source": "NVLink 5 1.8 TB/s bidirectional (datasheet) -> 900 GB/s per direction; network "
                                "estimate: one 400 Gb/s ConnectX-7 NIC per GPU = 50 GB/s"}
# AMD Infinity Fabric, each GPU of the 8-GPU platform linked to the 7 others (fully meshed): MI300X/MI325X
# 7 links x 128 GB/s bidirectional = 896 GB/s -> 448 GB/s per direction; MI355X 7 x 153.6 -> 537.6
_IF_CDNA3 = {"nvlink_bw": 448 * _GB,
             "interconnect_source": "Infinity Fabric: 7 links x 128 GB/s bidirectional (data sheet: 896 GB/s peak "
                                    "aggregate) -> 448 GB/s per direction; no network_bw (NIC not part of the GPU)"}
_MEASURED = "kernel durations in the public H100 TraceLens profile (AMD-AGI/TraceLens tests/traces/h100)"


def _nvidia(name, clock, cuda, **kw):
    """An NVIDIA part; `cuda` = (name torch reports, compute capability, max threads per SM, CUDA context MiB)."""
    device_name, capability, threads, context_mib = cuda
    kw.update(device_name=device_name, capability=capability, max_threads_per_sm=threads,
              cuda_context=context_mib * MiB)
    lat = _scaled(_H100_LAT, _H100_CLOCK / clock)
    lat.update({k: kw.pop(k) for k in list(kw) if k in lat})
    kw.setdefault("interconnect_source", _NO_GPU_LINK)
    return GPU(name=name, clock_ghz=clock, vendor="nvidia", misaligned_gemm_penalty=kw.pop("misaligned", 3.0),
               attention_efficiency=kw.pop("attention_efficiency", 0.17),
               latency_source=kw.pop("latency_source", f"H100 constants scaled by boost clock ({_H100_CLOCK} / "
                                                     f"{clock} GHz); not measured on this part"),
               **lat, **kw)


# FlashAttention-2 on parts whose mma.sync path it was written for (Ampere, Ada): Dao (arXiv 2307.08691)
# reports 50-73% of the A100's peak in the forward pass at long sequences, less for head dim 64, short or
# causal sequences; on Hopper it does not use wgmma (~35% at best, FA3 paper), hence 0.17 there
_FA2_AMPERE = 0.45
_MI300X_LAT = {"launch_ns": 2_100.0, "gemm_floor_ns": 4_300.0, "gemm_k_ns": 1.4, "attention_floor_ns": 11_000.0}


def _amd(name, clock, units, **kw):
    """An AMD Instinct part: the MI300X's latency constants scaled by boost clock (2.1 GHz / clock), its
    library efficiencies (hipBLASLt, CK/Triton attention, MIOpen), PCIe 4.0 unless given."""
    lat = {k: v * 2.1 / clock for k, v in _MI300X_LAT.items()}
    kw.setdefault("interconnect_source", _NO_GPU_LINK)
    return GPU(name=name, vendor="amd", clock_ghz=clock, compute_units=units, host_bw=kw.pop("host_bw", _PCIE4),
               host_link=kw.pop("host_link", "PCIe 4.0 x16"), gemm_efficiency=0.4, attention_efficiency=0.12,
               mem_efficiency=0.8, misaligned_gemm_penalty=2.0, norm_efficiency=0.25, pageable_bw=35e9,
               latency_source=f"MI300X constants scaled by boost clock (2.1 / {clock} GHz); not measured on this part",
               **lat, **kw)


BUILTIN: tuple[GPU, ...] = (
    _nvidia("H100 SXM", 1.98, ("NVIDIA H100 80GB HBM3", (9, 0), 2048, 500),
            flops={"fp64": 67 * _T, "fp32": 67 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T,
                   "fp16": 989.4 * _T, "fp8": 1978.9 * _T, "int8": 1978.9 * _T},
            mem_bw=3.35e12, host_bw=_PCIE5, memory_bytes=80 * 2**30, compute_units=132, host_link="PCIe 5.0 x16",
            source="NVIDIA H100 Tensor Core GPU datasheet (SXM5 80GB), dense rates",
            latency_source=_MEASURED, **_NVL4, aliases=("h100", "h100-sxm", "h100_sxm", "h100 sxm5")),
    _nvidia("H100 PCIe", 1.755, ("NVIDIA H100 PCIe", (9, 0), 2048, 500),
            flops={"fp64": 51 * _T, "fp32": 51 * _T, "tf32": 378 * _T, "bf16": 756 * _T,
                   "fp16": 756 * _T, "fp8": 1513 * _T, "int8": 1513 * _T},
            mem_bw=2.0e12, host_bw=_PCIE5, memory_bytes=80 * 2**30, compute_units=114, host_link="PCIe 5.0 x16",
            source="NVIDIA H100 Tensor Core GPU datasheet (PCIe 80GB), dense rates",
            aliases=("h100-pcie", "h100_pcie")),
    _nvidia("H200", 1.98, ("NVIDIA H200", (9, 0), 2048, 500),
            flops={"fp64": 67 * _T, "fp32": 67 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T,
                   "fp16": 989.4 * _T, "fp8": 1978.9 * _T, "int8": 1978.9 * _T},
            mem_bw=4.8e12, host_bw=_PCIE5, memory_bytes=141 * 10**9, compute_units=132, host_link="PCIe 5.0 x16",
            source="NVIDIA H200 Tensor Core GPU datasheet (SXM 141GB), dense rates",
            latency_source="H100 constants (same Hopper SM and clock); not measured on this part",
            **_NVL4, aliases=("h200", "h200-sxm", "h200_sxm")),
    _nvidia("GH200", 1.98, ("", (9, 0), 2048, 500),
            flops={"fp64": 67 * _T, "fp32": 67 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T,
                   "fp16": 989.4 * _T, "fp8": 1978.9 * _T, "int8": 1978.9 * _T},
            mem_bw=4.0e12, host_bw=_C2C, latency_ns=2_000.0, memory_bytes=96 * 10**9, compute_units=132,
            host_link="NVLink-C2C", source="NVIDIA GH200 Grace Hopper Superchip datasheet (96GB HBM3), dense rates",
            latency_source="H100 constants (same Hopper SM and clock); not measured on this part",
            **_NVL4, aliases=("gh200",)),
    _nvidia("A100 SXM 80GB", 1.41, ("NVIDIA A100-SXM4-80GB", (8, 0), 2048, 420),
            flops={"fp64": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T,
                   "fp16": 312 * _T, "int8": 624 * _T},
            mem_bw=2.039e12, host_bw=_PCIE4, memory_bytes=80 * 2**30, compute_units=108, host_link="PCIe 4.0 x16",
            source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB), dense rates", attention_efficiency=_FA2_AMPERE,
            nvlink_bw=300 * _GB, network_bw=25 * _GB,
            interconnect_source="NVLink 3 600 GB/s bidirectional (datasheet) -> 300 GB/s per direction; network "
                                "estimate: one InfiniBand HDR 200 Gb/s NIC per GPU = 25 GB/s",
            aliases=("a100", "a100-sxm", "a100_80gb", "a100-80gb")),
    _nvidia("A100 SXM 40GB", 1.41, ("NVIDIA A100-SXM4-40GB", (8, 0), 2048, 420),
            flops={"fp64": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T, "fp16": 312 * _T,
                   "int8": 624 * _T},
            mem_bw=1.555e12, host_bw=_PCIE4, memory_bytes=40 * 2**30, compute_units=108, host_link="PCIe 4.0 x16",
            source="NVIDIA A100 Tensor Core GPU datasheet (SXM 40GB), dense rates", attention_efficiency=_FA2_AMPERE,
            nvlink_bw=300 * _GB, network_bw=25 * _GB,
            interconnect_source="NVLink 3 600 GB/s bidirectional (datasheet) -> 300 GB/s per direction; network "
                                "estimate: one InfiniBand HDR 200 Gb/s NIC per GPU = 25 GB/s",
            aliases=("a100-40gb", "a100_40gb", "a100 40gb", "a100-sxm4-40gb")),
    _nvidia("A10G", 1.695, ("NVIDIA A10G", (8, 6), 1536, 300),
            flops={"fp32": 31.2 * _T, "tf32": 62.5 * _T, "bf16": 125 * _T, "fp16": 125 * _T, "int8": 250 * _T},
            mem_bw=600e9, host_bw=_PCIE4, memory_bytes=24 * 2**30, compute_units=80, host_link="PCIe 4.0 x16",
            source="NVIDIA A10 Tensor Core GPU datasheet, dense rates: the A10G is AWS's variant of the same GA102 "
                   "part and has no sheet of its own (an estimate)",
            attention_efficiency=_FA2_AMPERE, aliases=("a10g", "a10")),
    _nvidia("RTX 4090", 2.52, ("NVIDIA GeForce RTX 4090", (8, 9), 1536, 300),
            flops={"fp32": 82.6 * _T, "tf32": 82.6 * _T, "bf16": 165.2 * _T, "fp16": 165.2 * _T,
                   "fp8": 330.3 * _T, "int8": 660.6 * _T},
            mem_bw=1008e9, host_bw=_PCIE4, memory_bytes=24 * 2**30, compute_units=128, host_link="PCIe 4.0 x16",
            source="NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090), dense tensor rates with FP32 "
                   "accumulate, which PyTorch's GEMMs use (half the FP16-accumulate figures)",
            attention_efficiency=_FA2_AMPERE, aliases=("rtx4090", "rtx-4090", "4090", "geforce rtx 4090")),
    _nvidia("T4", 1.59, ("Tesla T4", (7, 5), 1024, 250),
            flops={"fp32": 8.1 * _T, "fp16": 65 * _T, "int8": 130 * _T},
            mem_bw=320e9, host_bw=_PCIE3, memory_bytes=16 * 2**30, compute_units=40, host_link="PCIe 3.0 x16",
            source="NVIDIA T4 Tensor Core GPU datasheet; no bf16/tf32 tensor cores (they run at fp32)",
            attention_efficiency=0.3, aliases=("t4", "tesla t4")),
    _nvidia("L4", 2.04, ("NVIDIA L4", (8, 9), 1536, 300),
            flops={"fp32": 30.3 * _T, "tf32": 60 * _T, "bf16": 121 * _T, "fp16": 121 * _T,
                   "fp8": 242.5 * _T, "int8": 242.5 * _T},
            mem_bw=300e9, host_bw=_PCIE4, memory_bytes=24 * 2**30, compute_units=58, host_link="PCIe 4.0 x16",
            source="NVIDIA L4 Tensor Core GPU datasheet, dense rates (half the with-sparsity figures)",
            attention_efficiency=_FA2_AMPERE, aliases=("l4",)),
    _nvidia("V100 SXM2 32GB", 1.53, ("Tesla V100-SXM2-32GB", (7, 0), 2048, 300),
            flops={"fp64": 7.8 * _T, "fp32": 15.7 * _T, "fp16": 125 * _T},
            mem_bw=900e9, host_bw=_PCIE3, memory_bytes=32 * 2**30, compute_units=80, host_link="PCIe 3.0 x16",
            source="NVIDIA V100 Tensor Core GPU datasheet (SXM2); no bf16/tf32 tensor cores (they run at fp32)",
            attention_efficiency=0.3, nvlink_bw=150 * _GB, network_bw=12.5 * _GB,
            interconnect_source="NVLink 2 300 GB/s bidirectional (datasheet) -> 150 GB/s per direction; network "
                                "estimate: one InfiniBand EDR 100 Gb/s NIC per GPU = 12.5 GB/s",
            aliases=("v100", "v100-sxm2", "v100_32gb", "v100-dgxs", "v100 dgxs 32gb")),
    # Blackwell: NVIDIA gives its rates with 2:4 sparsity; the dense rates here are half. B200: the 8-GPU HGX/DGX
    # B200 sheet (1,000 W) over 8; GB200: the GB200 NVL72 sheet (1,200 W) per superchip over its 2 GPUs
    _nvidia("B200", 1.965, ("NVIDIA B200", (10, 0), 2048, 500),
            flops={"fp64": 37 * _T, "fp32": 75 * _T, "tf32": 1125 * _T, "bf16": 2250 * _T, "fp16": 2250 * _T,
                   "fp8": 4500 * _T, "int8": 4500 * _T},
            mem_bw=8.0e12, host_bw=_PCIE5, memory_bytes=180 * 10**9, compute_units=148, host_link="PCIe 5.0 x16",
            source="NVIDIA DGX B200 / HGX B200 datasheets (8 GPUs: FP16/BF16 36 PF, FP8 72 PF, TF32 18 PF with "
                   "sparsity; FP32 600 TF, FP64 296 TF; 1,440 GB HBM3e, 64 TB/s), per GPU and dense. Not confirmed: "
                   "the SM count (148, as the CUDA runtime reports; not on the sheet), the boost clock (1.965 GHz), "
                   "HBM bandwidth (NVIDIA pages give 62 and 64 TB/s per 8 GPUs: 7.7-8 TB/s)",
            **_NVL5, aliases=("b200", "b200-sxm", "hgx b200", "dgx b200")),
    _nvidia("GB200", 1.965, ("NVIDIA GB200", (10, 0), 2048, 500),
            flops={"fp64": 45 * _T, "fp32": 90 * _T, "tf32": 1250 * _T, "bf16": 2500 * _T, "fp16": 2500 * _T,
                   "fp8": 5000 * _T, "int8": 5000 * _T},
            mem_bw=8.0e12, host_bw=_C2C, latency_ns=2_000.0, memory_bytes=186 * 10**9, compute_units=148,
            host_link="NVLink-C2C", gpus_per_node=72,
            source="NVIDIA GB200 NVL72 datasheet, per GB200 superchip (2 GPUs: FP16/BF16 10 PF, FP8 20 PF, TF32 5 PF "
                   "with sparsity; FP32 180 TF, FP64 90 TF; 372 GB HBM3e, 16 TB/s; NVLink-C2C 900 GB/s "
                   "bidirectional) over 2, dense. Not confirmed: the SM count (148, as the B200), the clock, and how "
                   "the superchip's one NVLink-C2C is shared by its two GPUs (each given 450 GB/s per direction)",
            nvlink_bw=900 * _GB, network_bw=50 * _GB,
            interconnect_source="NVLink 5 1.8 TB/s bidirectional (datasheet) -> 900 GB/s per direction, 72 GPUs in "
                                "one NVLink domain; network estimate: one 400 Gb/s NIC per GPU = 50 GB/s",
            aliases=("gb200", "gb200 nvl72", "gb200-nvl72")),
    _nvidia("H20", 1.98, ("NVIDIA H20", (9, 0), 2048, 500),
            flops={"fp64": 1 * _T, "fp32": 44 * _T, "tf32": 74 * _T, "bf16": 148 * _T, "fp16": 148 * _T,
                   "fp8": 296 * _T, "int8": 296 * _T},
            mem_bw=4.0e12, host_bw=_PCIE5, memory_bytes=96 * 2**30, compute_units=78, host_link="PCIe 5.0 x16",
            source="NVIDIA HGX H20 product brief (dense: FP16/BF16 148 TF, FP8/INT8 296, TF32 74, FP32 44, FP64 1; "
                   "96 GB HBM3, 4.0 TB/s; NVLink 900 GB/s; PCIe Gen5 x16). Not confirmed against a public NVIDIA "
                   "page (the brief went to partners; figures as reported by the trade press): all rates, the SM "
                   "count (78, from benchmark logs) and the boost clock (taken as the H100's)",
            latency_source="H100 constants (same Hopper SM); not measured on this part",
            **_NVL4, aliases=("h20", "hgx h20")),
    _nvidia("A100 PCIe 80GB", 1.41, ("NVIDIA A100 80GB PCIe", (8, 0), 2048, 420),
            flops={"fp64": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T, "fp16": 312 * _T,
                   "int8": 624 * _T},
            mem_bw=1.935e12, host_bw=_PCIE4, memory_bytes=80 * 2**30, compute_units=108, host_link="PCIe 4.0 x16",
            source="NVIDIA A100 Tensor Core GPU datasheet (PCIe 80GB: 1,935 GB/s), dense rates; the PCIe card's "
                   "lower power limit (300 W) can hold sustained clocks below the SXM's",
            attention_efficiency=_FA2_AMPERE,
            interconnect_source="NVLink bridge (600 GB/s) joins pairs of cards only: not modeled, PCIe between GPUs",
            aliases=("a100-pcie", "a100 80gb pcie", "a100-pcie-80gb")),
    _nvidia("A100 PCIe 40GB", 1.41, ("NVIDIA A100-PCIE-40GB", (8, 0), 2048, 420),
            flops={"fp64": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T, "fp16": 312 * _T,
                   "int8": 624 * _T},
            mem_bw=1.555e12, host_bw=_PCIE4, memory_bytes=40 * 2**30, compute_units=108, host_link="PCIe 4.0 x16",
            source="NVIDIA A100 Tensor Core GPU datasheet (PCIe 40GB: 1,555 GB/s), dense rates",
            attention_efficiency=_FA2_AMPERE,
            interconnect_source="NVLink bridge (600 GB/s) joins pairs of cards only: not modeled, PCIe between GPUs",
            aliases=("a100-pcie-40gb", "a100-40gb-pcie")),
    _nvidia("L40S", 2.52, ("NVIDIA L40S", (8, 9), 1536, 300),
            flops={"fp32": 91.6 * _T, "tf32": 183 * _T, "bf16": 362.05 * _T, "fp16": 362.05 * _T,
                   "fp8": 733 * _T, "int8": 733 * _T},
            mem_bw=864e9, host_bw=_PCIE4, memory_bytes=48 * 2**30, compute_units=142, host_link="PCIe 4.0 x16",
            source="NVIDIA L40S datasheet, its dense rates (FP32 accumulate at full rate, unlike GeForce); 48 GB "
                   "GDDR6 864 GB/s; 142 SMs (one RT core each); no NVLink. The sheet's dense BF16 362.05 TF is not "
                   "half its sparse 733 (142 SMs x 2.52 GHz x 1024 = 366.4 TF): the dense figure is kept",
            attention_efficiency=_FA2_AMPERE, aliases=("l40s", "l40-s")),
    GPU(name="MI300X", vendor="amd", clock_ghz=2.1, compute_units=304, memory_bytes=192 * 2**30,
        flops={"fp64": 163.4 * _T, "fp32": 163.4 * _T, "tf32": 653.7 * _T, "bf16": 1307.4 * _T,
               "fp16": 1307.4 * _T, "fp8": 2614.9 * _T, "int8": 2614.9 * _T},
        mem_bw=5.3e12, host_bw=_PCIE5, host_link="PCIe 5.0 x16",
        # measured (MI300X TraceLens bert-small profile): smallest elementwise kernel ~2.1 us; single-wave
        # bf16 GEMMs 5.0 us at K=512 and 7.2 us at K=2048; attention (attn_fwd) 27 us at 141 tokens
        launch_ns=2_100.0, gemm_floor_ns=4_300.0, gemm_k_ns=1.4, attention_floor_ns=11_000.0,
        gemm_efficiency=0.4, attention_efficiency=0.12, mem_efficiency=0.8, misaligned_gemm_penalty=2.0,
        norm_efficiency=0.25, pageable_bw=35e9,
        source="AMD Instinct MI300X data sheet, dense matrix rates",
        latency_source="kernel durations in the public MI300X TraceLens profile (AMD-AGI/TraceLens tests/traces/mi300)",
        **_IF_CDNA3,
        aliases=("mi300x", "mi300", "mi-300x")),
    _amd("MI250X (one GCD)", 1.7, 110, flops={"fp64": 47.9 * _T, "fp32": 47.9 * _T, "bf16": 191.5 * _T,
                                                "fp16": 191.5 * _T, "int8": 191.5 * _T},
         mem_bw=1.6e12, memory_bytes=64 * 2**30,
         source="AMD Instinct MI250X data sheet, per graphics compute die (PyTorch sees each of the two GCDs "
                "as one device): half the package's dense matrix rates and HBM2e bandwidth",
         interconnect_source="Infinity Fabric: 8 links per package (800 GB/s aggregate), uneven per GCD (50-200 GB/s "
                             "to a peer): not modeled, PCIe between GPUs",
         aliases=("mi250x", "mi250", "mi-250x")),
    _amd("MI210", 1.7, 104, flops={"fp64": 45.3 * _T, "fp32": 45.3 * _T, "bf16": 181 * _T, "fp16": 181 * _T,
                                   "int8": 181 * _T},
         mem_bw=1.6e12, memory_bytes=64 * 2**30, source="AMD Instinct MI210 data sheet, dense matrix rates",
         interconnect_source="Infinity Fabric bridge (3 links, 300 GB/s) joins 2 or 4 cards only: not modeled, PCIe "
                             "between GPUs",
         aliases=("mi210", "mi-210")),
    _amd("MI325X", 2.1, 304, flops={"fp64": 163.4 * _T, "fp32": 163.4 * _T, "tf32": 653.7 * _T, "bf16": 1307.4 * _T,
                                    "fp16": 1307.4 * _T, "fp8": 2614.9 * _T, "int8": 2614.9 * _T},
         mem_bw=6.0e12, memory_bytes=256 * 2**30, host_bw=_PCIE5, host_link="PCIe 5.0 x16",
         source="AMD Instinct MI325X data sheet, dense matrix rates (the MI300X's CDNA 3 compute: 304 CUs, 2.1 GHz) "
                "with 256 GB HBM3E at 6 TB/s",
         **_IF_CDNA3, aliases=("mi325x", "mi325", "mi-325x")),
    _amd("MI355X", 2.4, 256, flops={"fp64": 78.6 * _T, "fp32": 157.3 * _T, "bf16": 2516.6 * _T, "fp16": 2516.6 * _T,
                                    "fp8": 5033.2 * _T, "int8": 5033.2 * _T},
         mem_bw=8.0e12, memory_bytes=288 * 2**30, host_bw=_PCIE5, host_link="PCIe 5.0 x16",
         source="AMD Instinct MI355X data sheet (CDNA 4: 256 CUs at 2.4 GHz; FP16/BF16 2.5 PF, FP8 5 PF dense; "
                "288 GB HBM3E, 8 TB/s). Not confirmed: that CDNA 4 has no TF32 matrix rate (none given here: fp32 "
                "matmuls run at the FP32 rate), the exact dense figures (computed as CUs x clock x FLOP per "
                "clock: 4096 FP16, 8192 FP8, 256 FP32) "
                "and the Infinity Fabric link rate; library efficiencies are the MI300X's, not measured on CDNA 4",
         nvlink_bw=537.6 * _GB,
         interconnect_source="Infinity Fabric: 7 links x 153.6 GB/s bidirectional (1,075 GB/s aggregate) -> 537.6 "
                             "GB/s per direction; not confirmed; no network_bw (NIC not part of the GPU)",
         aliases=("mi355x", "mi355", "mi-355x")),
)

# Where each row's figures come from: the vendor's datasheet or product page (the `source` of each row names the
# document and the figures it gives; `gpus()` lists these beside it)
_NV = "https://www.nvidia.com/en-us/data-center/"
_AMD = "https://www.amd.com/en/products/accelerators/instinct/"
DATASHEETS = {
    "H100 SXM": _NV + "h100/", "H100 PCIe": _NV + "h100/", "H200": _NV + "h200/",
    "GH200": _NV + "grace-hopper-superchip/",
    "A100 SXM 80GB": _NV + "a100/", "A100 SXM 40GB": _NV + "a100/",
    "A10G": _NV + "products/a10-gpu/",
    "RTX 4090": "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
    "T4": _NV + "tesla-t4/", "L4": _NV + "l4/", "V100 SXM2 32GB": _NV + "v100/",
    "B200": _NV + "dgx-b200/ and " + _NV + "hgx/", "GB200": _NV + "gb200-nvl72/",
    "H20": "no public NVIDIA page (HGX H20 product brief, partners only)",
    "A100 PCIe 80GB": _NV + "a100/", "A100 PCIe 40GB": _NV + "a100/", "L40S": _NV + "l40s/",
    "MI300X": _AMD + "mi300/mi300x.html", "MI250X (one GCD)": _AMD + "mi200/mi250x.html",
    "MI210": _AMD + "mi200/mi210.html", "MI325X": _AMD + "mi300/mi325x.html", "MI355X": _AMD + "mi350/mi355x.html",
}
