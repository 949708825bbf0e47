"""The arithmetic of benchmarks/predict_fsdp_published.py, by hand: tokens per second per GPU of a step, the
ratio to the published figure, the steady-state step as the difference of two predictions."""
import sys
from pathlib import Path

import pytest

BENCHMARKS = next(p / "benchmarks" for p in Path(__file__).resolve().parents if (p / "benchmarks").is_dir())
sys.path.insert(0, str(BENCHMARKS))
try:
    import predict_fsdp_published as bench
finally:
    sys.path.pop(0)


def test_tokens_per_gpu_second_by_hand():
    # 2 x 8192 = 16,384 tokens in 2.8433 s -> 5,762.3 tokens/s
    assert bench.tokens_per_gpu_second(2, 8192, 2_843_300_000) == pytest.approx(16_384 / 2.8433)
    assert bench.tokens_per_gpu_second(1, 1000, 1e9) == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="positive"):
        bench.tokens_per_gpu_second(2, 8192, 0)


def test_ratio_and_steady_step_by_hand():
    assert bench.ratio_to_published(6_338.2, 5_762) == pytest.approx(1.1)
    assert bench.ratio_to_published(5_762, 5_762) == 1.0
    with pytest.raises(ValueError):
        bench.ratio_to_published(1.0, 0)
    assert bench.steady_step_ns(5_700_000_000, 2_860_000_000) == 2_840_000_000
    with pytest.raises(ValueError):
        bench.steady_step_ns(1, 2)


def test_published_configuration_is_the_stated_one():
    # torchtitan's Table 1 row and Llama 3 8B's shapes, as the docs page states them
    assert bench.PUBLISHED_TOKENS_PER_GPU_S == 5_762
    assert (bench.DIM, bench.LAYERS, bench.HEADS, bench.KV_HEADS, bench.FFN, bench.VOCAB) == \
        (4096, 32, 32, 8, 14336, 128256)
    assert (bench.BATCH, bench.SEQ, bench.WORLD) == (2, 8192, 8)
