"""The helpers of benchmarks/device_time_real.py that decide what its ratios mean: the truth (a union of
launched GPU intervals from the raw JSON, worked by hand on the hand-made profile), the pairing of a model's
profiles across GPUs, the pooled ops of a leave-one-out fit (each profile keeps its own nesting), and the
benchmark's answer without the shared profiles."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from _kineto_cases import hand_made
from memlens.clock import op_parents

BENCHMARKS = next(p / "benchmarks" for p in Path(__file__).resolve().parents if (p / "benchmarks").is_dir())
sys.path.insert(0, str(BENCHMARKS))
try:
    import device_time_real as bench
finally:
    sys.path.pop(0)


@pytest.mark.parametrize("era", [2022, 2021])
def test_truth_is_the_union_of_launched_gpu_intervals(era, tmp_path):
    path = tmp_path / "p.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(hand_made(era=era), f)
    # gemm 40-70 us, add 240-244, memcpy 250-256 and memset 255-257 overlap (one span 250-257); the early
    # kernel (1-6) was launched before profiling began: not in the truth. 30 + 4 + 7 = 41 us
    assert bench.truth_busy_ns(path) == 41_000.0


def test_models_pair_across_gpus_by_the_tracelens_name():
    assert bench.model_key("tracelens_h100_qwen_0.5b_chat") == bench.model_key("tracelens_mi300_qwen_0.5b_chat") \
        == "qwen_0.5b_chat"
    assert bench.model_key("kineto_resnet50_2021format") == "kineto_resnet50_2021format"


def test_pooled_ops_keep_each_profiles_nesting():
    class P:        # what pooled_ops reads of a profile: its trace's ops table
        def __init__(self, ops):
            self.ops = ops

    a = pd.DataFrame({"op_id": [0, 1, 2], "parent_op_id": pd.array([None, 0, 1], dtype="Int64")})
    b = pd.DataFrame({"op_id": [0, 5], "parent_op_id": pd.array([None, 0], dtype="Int64")})
    pooled = bench.pooled_ops([{"trace": P(a)}, {"trace": P(b)}])
    assert pooled["op_id"].tolist() == [0, 1, 2, 3, 8]
    assert op_parents(pooled).tolist() == [-1, 0, 1, -1, 3]      # rows; b's ops point into b, not a


def test_without_the_shared_profiles_it_says_so_and_exits_0(tmp_path, capsys):
    assert bench.main(["--folder", str(tmp_path / "none")]) == 0
    assert "no shared Kineto profiles" in capsys.readouterr().out
