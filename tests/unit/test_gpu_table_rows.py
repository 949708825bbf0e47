"""Every row of the one GPU table: it passes the GPU-file schema and survives a JSON round trip, every name and
alias finds it (and only it), it names its sources; and a hand check of numbers derived from the datasheet
figures of the newer parts (ridge points, roofline times, per-clock peaks, links)."""
from __future__ import annotations

import pytest

from memlens.devicetime.collectives import intra_link
from memlens.devicetime.gpu_schema import check_gpu_fields
from memlens.devicetime.gpu_table import BUILTIN, DATASHEETS
from memlens.devicetime.gpus import gpu, gpu_of_device, gpus, load_gpu, save_gpu
from memlens.devicetime.scaling import roofline_ns
from memlens.prediction.gpus import gpu_facts

NAMES = [g.name for g in BUILTIN]
WANTED = ["B200", "GB200", "H200", "H20", "A100 SXM 40GB", "A100 SXM 80GB", "A100 PCIe 40GB", "A100 PCIe 80GB",
          "L40S", "L4", "A10G", "RTX 4090", "MI210", "MI250X (one GCD)", "MI300X", "MI325X", "MI355X"]


def test_the_table_holds_each_part_once():
    assert set(WANTED) <= set(NAMES) and len(NAMES) == len(set(NAMES))
    assert set(DATASHEETS) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_each_row_passes_the_gpu_file_schema_and_round_trips(name, tmp_path):
    g = gpu(name)
    checked = check_gpu_fields(g.to_dict(), f"{name} row")
    assert checked["flops"] == g.flops and checked["mem_bw"] == g.mem_bw
    assert load_gpu(save_gpu(g, tmp_path / "g.json")) == g


@pytest.mark.parametrize("name", NAMES)
def test_every_name_and_alias_finds_its_row(name):
    g = gpu(name)
    for spelling in (g.name, *g.aliases):
        assert gpu(spelling) is g
        assert gpu(spelling.upper().replace(" ", "-")) is g      # case and '-'/' ' ignored
        assert gpu_of_device(spelling) is g
    if g.device_name:
        assert gpu_of_device(g.device_name) is g


def test_device_names_of_the_newer_parts_find_their_row_not_a_neighbour():
    # "H20" is a prefix of "H200", "L4" of "L40S": the exact name and the whole word decide
    for device, row in (("NVIDIA H20", "H20"), ("NVIDIA H200", "H200"), ("NVIDIA L40S", "L40S"),
                        ("NVIDIA L4", "L4"), ("NVIDIA B200", "B200"), ("NVIDIA GB200", "GB200"),
                        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"), ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
                        ("AMD Instinct MI325X", "MI325X"), ("AMD Instinct MI355X", "MI355X"),
                        ("AMD Instinct MI300X VF", "MI300X")):
        assert gpu_of_device(device).name == row, device
    # prediction's prefix match (longest wins) on the same names
    assert gpu_facts("H20 96GB").total_memory == 96 * 2**30 and gpu_facts("H200 NVL").sm_count == 132
    assert gpu_facts("L40S 48GB").sm_count == 142 and gpu_facts("L4 24GB").sm_count == 58
    assert gpu_facts("A100 80GB PCIe").name == "NVIDIA A100 80GB PCIe"


def test_every_row_names_its_sources():
    table = gpus().set_index("name")
    for name, row in table.iterrows():
        assert len(row["source"]) > 30 and row["datasheet"], name
        assert row["interconnect_source"] != "user-defined", name
    for name in ("B200", "GB200", "H20", "MI355X"):          # figures no public sheet confirmed say so
        assert "Not confirmed" in table.loc[name, "source"], name


# hand-computed: dense bf16 FLOP/s over memory bytes/s (FLOP per byte at which an op turns compute-bound)
RIDGE = {"B200": 2250 / 8.0, "GB200": 2500 / 8.0, "H200": 989.4 / 4.8, "H20": 148 / 4.0,
         "A100 PCIe 80GB": 312 / 1.935, "A100 PCIe 40GB": 312 / 1.555, "A100 SXM 40GB": 312 / 1.555,
         "A100 SXM 80GB": 312 / 2.039, "L40S": 362.05 / 0.864, "L4": 121 / 0.3, "A10G": 125 / 0.6,
         "RTX 4090": 165.2 / 1.008, "MI210": 181 / 1.6, "MI250X (one GCD)": 191.5 / 1.6, "MI300X": 1307.4 / 5.3,
         "MI325X": 1307.4 / 6.0, "MI355X": 2516.6 / 8.0}
RIDGE_WRITTEN = {"B200": 281.25, "GB200": 312.5, "H200": 206.125, "H20": 37.0, "A100 PCIe 80GB": 161.24,
                 "A100 PCIe 40GB": 200.64, "L40S": 419.04, "MI325X": 217.9, "MI355X": 314.575}


@pytest.mark.parametrize("name", sorted(RIDGE))
def test_ridge_point_is_peak_over_bandwidth(name):
    g = gpu(name)
    assert g.peak_flops("bfloat16") / g.mem_bw == pytest.approx(RIDGE[name], rel=1e-9)
    if name in RIDGE_WRITTEN:
        assert RIDGE[name] == pytest.approx(RIDGE_WRITTEN[name], abs=0.005)


def test_roofline_times_on_the_newer_parts_by_hand():
    # 1 TFLOP of bf16 GEMM moving 1 GB, 8 GB of elementwise traffic; achieved = peak x 0.7 (GEMM) / x 0.85 (HBM)
    # on NVIDIA, x 0.4 / x 0.8 on AMD
    cases = {"B200": (1e12 / (2250e12 * 0.7), 8e9 / (8.0e12 * 0.85)),
             "H20": (1e12 / (148e12 * 0.7), 8e9 / (4.0e12 * 0.85)),
             "L40S": (1e12 / (362.05e12 * 0.7), 8e9 / (864e9 * 0.85)),
             "MI355X": (1e12 / (2516.6e12 * 0.4), 8e9 / (8.0e12 * 0.8))}
    for name, (gemm_s, stream_s) in cases.items():
        ns = roofline_ns(gpu(name), [1e12, 0], [1e9, 8e9], ["bfloat16", "bfloat16"], ["gemm", "elementwise"])
        assert ns.tolist() == pytest.approx([gemm_s * 1e9, stream_s * 1e9], rel=1e-12), name
    # B200: 1 TFLOP at 1.575 PFLOP/s achieved = 634.9 us; 8 GB at 6.8 TB/s = 1.176 ms
    assert cases["B200"][0] * 1e6 == pytest.approx(634.92, abs=0.01)
    assert cases["B200"][1] * 1e3 == pytest.approx(1.1765, abs=1e-4)


def test_amd_peaks_are_units_times_clock_times_flop_per_clock():
    # CDNA 3: 2048 FP16 FLOP per CU per clock (dense), FP8 twice; CDNA 4: 4096 FP16, 8192 FP8, 256 FP32
    for name in ("MI300X", "MI325X"):
        g = gpu(name)
        assert g.flops["bf16"] == pytest.approx(304 * 2.1e9 * 2048, rel=1e-3)
        assert g.flops["fp8"] == pytest.approx(2 * g.flops["bf16"], rel=1e-3)
    g = gpu("MI355X")
    assert (g.compute_units, g.clock_ghz) == (256, 2.4)
    assert g.flops["bf16"] == pytest.approx(256 * 2.4e9 * 4096, rel=1e-4)
    assert g.flops["fp8"] == pytest.approx(256 * 2.4e9 * 8192, rel=1e-4)
    assert g.flops["fp32"] == pytest.approx(256 * 2.4e9 * 256, rel=1e-3)
    assert g.peak_flops("float32", tf32=True) == g.flops["fp32"]       # no TF32 rate given: FP32


def test_nvidia_dense_rates_are_half_the_sparse_figures():
    # the datasheets' with-sparsity figures (per GPU) halved: B200 = HGX B200 / 8, GB200 = per superchip / 2
    sparse = {"B200": {"bf16": 36e15 / 8, "fp8": 72e15 / 8, "tf32": 18e15 / 8},
              "GB200": {"bf16": 10e15 / 2, "fp8": 20e15 / 2, "tf32": 5e15 / 2},
              "H20": {"bf16": 296e12, "fp8": 592e12, "tf32": 148e12}}
    for name, peaks in sparse.items():
        for key, value in peaks.items():
            assert gpu(name).flops[key] == pytest.approx(value / 2, rel=0.005), (name, key)
    # the L40S sheet prints dense 362.05 beside sparse 733 (= 2 x 142 SMs x 2.52 GHz x 1024): its dense is kept
    assert gpu("L40S").flops["bf16"] == 362.05e12 and 733e12 / 2 == pytest.approx(142 * 2.52e9 * 1024, rel=2e-3)


def test_links_between_gpus():
    assert intra_link(gpu("B200")) == (900e9, "NVLink") and intra_link(gpu("GB200")) == (900e9, "NVLink")
    assert intra_link(gpu("H20")) == (450e9, "NVLink")
    assert intra_link(gpu("MI300X")) == (7 * 128e9 / 2, "Infinity Fabric")
    assert intra_link(gpu("MI325X")) == (448e9, "Infinity Fabric")
    assert intra_link(gpu("MI355X")) == pytest.approx((7 * 153.6e9 / 2, "Infinity Fabric"))
    for name in ("L40S", "A100 PCIe 80GB", "A100 PCIe 40GB", "MI210"):       # no all-to-all link: PCIe
        g = gpu(name)
        assert intra_link(g) == (min(g.host_bw), "PCIe")
    assert gpu("GB200").gpus_per_node == 72 and gpu("GB200").host_link == "NVLink-C2C"


def test_memory_facts_of_the_newer_cuda_parts():
    b200 = gpu_facts("B200")
    assert (b200.capability, b200.total_memory, b200.sm_count) == ((10, 0), 180 * 10**9, 148)
    assert b200.cublas_workspace == 32 * 2**20               # torch gives Hopper and Blackwell 32 MiB
    assert gpu_facts("L40S").cublas_workspace == 8320 * 1024
    assert gpu_facts("A100 PCIe 40GB").total_memory == 40 * 2**30
