"""The one GPU table: every part's memory facts (what prediction reads) and device-time facts sit in one row,
found by one name or its aliases; the values prediction used before the two tables were joined are kept."""
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from memlens.devicetime.gpu import GPU
from memlens.devicetime.gpu_table import BUILTIN
from memlens.devicetime.gpus import gpu, gpus, load_gpu, save_gpu
from memlens.errors import InputError
from memlens.prediction.gpus import GPUMemoryFacts, gpu_facts, known_gpus

MiB, GiB = 1 << 20, 1 << 30
ROOT = Path(__file__).resolve().parents[2] / "memlens"

# (name torch reports, capability, device bytes, CUDA context, SMs, threads per SM): prediction's own table before
# it became rows of the one GPU table, written out here by hand from the datasheets it cited
BEFORE = {
    "H100": ("NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB, 500 * MiB, 132, 2048),
    "H200": ("NVIDIA H200", (9, 0), 141 * 10**9, 500 * MiB, 132, 2048),
    "A100": ("NVIDIA A100-SXM4-80GB", (8, 0), 80 * GiB, 420 * MiB, 108, 2048),
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", (8, 0), 40 * GiB, 420 * MiB, 108, 2048),
    "L4": ("NVIDIA L4", (8, 9), 24 * GiB, 300 * MiB, 58, 1536),
    "A10G": ("NVIDIA A10G", (8, 6), 24 * GiB, 300 * MiB, 80, 1536),
    "RTX4090": ("NVIDIA GeForce RTX 4090", (8, 9), 24 * GiB, 300 * MiB, 128, 1536),
    "V100": ("Tesla V100-SXM2-32GB", (7, 0), 32 * GiB, 300 * MiB, 80, 2048),
    "T4": ("Tesla T4", (7, 5), 16 * GiB, 250 * MiB, 40, 1024),
}


@pytest.mark.parametrize("key", sorted(BEFORE))
def test_prediction_reads_the_same_memory_facts_from_the_one_table(key):
    assert gpu_facts(key) == GPUMemoryFacts(*BEFORE[key])
    row = gpu(key)   # the same row by the same key, with its device-time facts
    assert (row.device_name, row.capability, row.memory_bytes, row.cuda_context, row.compute_units,
            row.max_threads_per_sm) == BEFORE[key]
    assert row.flops and row.mem_bw > 0 and row.source


def test_names_aliases_and_prefixes_find_one_row():
    assert gpu_facts("H100 SXM") == gpu_facts("h100") == gpu_facts("H100-80GB") == gpu_facts(gpu("H100"))
    assert gpu_facts("H100 PCIe 80GB").sm_count == 114          # the longest matching name wins
    assert gpu_facts("a100 sxm 40gb").total_memory == 40 * GiB
    with pytest.raises(InputError, match="no CUDA compute capability"):
        gpu_facts("MI300X")
    with pytest.raises(InputError, match="unknown gpu 'Z9000'"):
        gpu_facts("Z9000")
    assert "MI300X" not in known_gpus() and "H100 SXM" in known_gpus()
    assert set(known_gpus()) == {g.name for g in BUILTIN if g.capability is not None}


def test_each_part_is_defined_once():
    """No second table: each torch device name is given facts in one row of one module."""
    text = "\n".join(p.read_text() for p in ROOT.rglob("*.py"))
    for name, *_ in BEFORE.values():
        assert len(re.findall(re.escape(f'("{name}", ('), text)) == 1, name   # its row: (name, capability, ...)
    assert len({g.name for g in BUILTIN}) == len(BUILTIN)
    spellings = [s.lower() for g in BUILTIN for s in g.aliases]
    assert len(spellings) == len(set(spellings))


def test_memory_facts_survive_a_json_round_trip(tmp_path):
    g = gpu("RTX 4090")
    back = load_gpu(save_gpu(g, tmp_path / "g.json"))
    assert back == g and back.capability == (8, 9) and back.cuda_context == 300 * MiB
    assert json.loads((tmp_path / "g.json").read_text())["capability"] == [8, 9]
    assert gpu_facts(str(tmp_path / "g.json")).name == "RTX 4090"   # a saved GPU is named by its own name


def test_bad_memory_facts_are_input_errors():
    base = dict(name="x", flops={"fp32": 1e12}, mem_bw=1e12)
    with pytest.raises(InputError, match="capability"):
        GPU(**base, capability=(9,))
    with pytest.raises(InputError, match="capability"):
        GPU(**base, capability=(True, 0))
    with pytest.raises(InputError, match="cuda_context"):
        GPU(**base, cuda_context=-1)
    with pytest.raises(InputError, match="max_threads_per_sm"):
        GPU(**base, max_threads_per_sm=0)


def test_the_table_lists_what_prediction_needs():
    df = gpus().set_index("name")
    assert df.loc["T4", "capability"] == "7.5" and df.loc["T4", "max_threads_per_sm"] == 1024
    assert df.loc["T4", "cuda_context"] == 250 * MiB and df.loc["T4", "device_name"] == "Tesla T4"
    assert pd.isna(df.loc["MI300X", "capability"])


def test_a_gpu_file_with_bad_memory_facts_is_refused_naming_the_field(tmp_path):
    good = gpu("T4").to_dict()
    for field, value, words in (("capability", [7], "capability"), ("capability", [True, 5], "capability"),
                                ("capability", "7.5", "capability"), ("cuda_context", -1, "cuda_context"),
                                ("max_threads_per_sm", 0, "max_threads_per_sm"), ("device_name", 5, "device_name")):
        path = tmp_path / f"{field}.json"
        path.write_text(json.dumps({**good, field: value}))
        with pytest.raises(InputError, match=words):
            load_gpu(path)
    path = tmp_path / "none.json"
    path.write_text(json.dumps({**good, "capability": None}))
    assert load_gpu(path).capability is None
