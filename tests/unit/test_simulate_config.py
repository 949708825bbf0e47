"""PYTORCH_CUDA_ALLOC_CONF strings, snapshot allocator_settings and user dicts -> AllocatorConfig."""
from __future__ import annotations

import pytest

from memlens.errors import InputError
from memlens.simulate.config import (
    K_LARGE_BUFFER, UNLIMITED, AllocatorConfig, parse_conf, round_size, roundup_power2_next_division,
)

MiB = 1 << 20


def test_defaults():
    c = parse_conf(None)
    assert c == AllocatorConfig()
    assert c.max_split_size == UNLIMITED and c.max_non_split_rounding_size == K_LARGE_BUFFER
    assert c.garbage_collection_threshold == 0 and not c.expandable_segments
    assert c.to_conf_string() == ""


def test_conf_string_with_every_placement_option():
    c = parse_conf("expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6,"
                   "max_non_split_rounding_mb:64,roundup_power2_divisions:4")
    assert c.expandable_segments
    assert c.max_split_size == 128 * MiB and c.max_non_split_rounding_size == 64 * MiB
    assert c.garbage_collection_threshold == 0.6
    assert c.roundup_power2_divisions == (4,) * 16
    assert parse_conf(c.to_conf_string()) == c


def test_divisions_list_follows_torch_interval_rules():
    c = parse_conf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    # the first entry also covers every smaller interval; '>' covers those above the last one named
    assert c.roundup_power2_divisions == (1,) * 9 + (2, 4) + (8,) * 5
    assert c.divisions_for(300 * MiB) == 1 and c.divisions_for(700 * MiB) == 2
    assert c.divisions_for(1500 * MiB) == 4 and c.divisions_for(3000 * MiB) == 8
    assert c.divisions_for(100 * 1024 * MiB) == 8  # beyond 32 GiB: the last interval


def test_roundup_next_division_example_from_torch_comment():
    assert roundup_power2_next_division(1200, 4) == 1280  # 1024, 1280, 1536, 1792
    assert roundup_power2_next_division(1024, 4) == 1024
    assert roundup_power2_next_division(1 << 30, 8) == 1 << 30


def test_round_size_uses_the_interval_of_the_request():
    c = parse_conf("roundup_power2_divisions:[1:0,64:2]")
    assert round_size(40 * MiB + 1, c) == 40 * MiB + 512  # below 64 MiB: 0 divisions before the first
    assert round_size(65 * MiB, c) == 96 * MiB  # [64, 128) MiB in 2 steps


def test_ignored_options_are_accepted():
    assert parse_conf("backend:native,release_lock_on_cudamalloc:True,pinned_num_register_threads:8") \
        == AllocatorConfig()


@pytest.mark.parametrize("text, message", [
    ("max_split_size_mb:10", "max_split_size_mb"),
    ("max_non_split_rounding_mb:1", "max_non_split_rounding_mb"),
    ("garbage_collection_threshold:1.5", "garbage_collection_threshold"),
    ("roundup_power2_divisions:3", "power of two"),
    ("roundup_power2_divisions:[256:3]", "power of two"),
    ("roundup_power2_divisions:[256:1", "closing"),
    ("expandable_segments:yes", "True or False"),
    ("max_split_size_mb", "key:value"),
    ("no_such_option:1", "unknown allocator option"),
    ("max_split_size_mb:abc", "integer"),
])
def test_bad_conf_strings(text, message):
    with pytest.raises(InputError, match=message):
        parse_conf(text)


def test_snapshot_allocator_settings_dict():
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
                "expandable_segments": False, "release_lock_on_cudamalloc": False,
                "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}
    assert parse_conf(settings) == AllocatorConfig()
    tuned = dict(settings, max_split_size=128 * MiB, expandable_segments=True,
                 roundup_power2_divisions={**settings["roundup_power2_divisions"], "256": 4})
    c = parse_conf(tuned)
    assert c.max_split_size == 128 * MiB and c.expandable_segments
    assert c.divisions_for(300 * MiB) == 4 and c.divisions_for(100 * MiB) == 0


def test_snapshot_settings_fall_back_to_the_raw_conf_string():
    c = parse_conf({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256,expandable_segments:True"})
    assert c.max_split_size == 256 * MiB and c.expandable_segments


def test_user_dict_of_conf_keys():
    c = parse_conf({"max_split_size_mb": 128, "expandable_segments": True})
    assert c.max_split_size == 128 * MiB and c.expandable_segments
    with pytest.raises(InputError):
        parse_conf(42)
