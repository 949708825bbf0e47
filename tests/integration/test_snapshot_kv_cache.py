"""Key/value caches named by the stacks (a snapshot's built-in category ``kv_cache``): a block made by a Python
function named for a KV cache is inference state, not "blocks the source does not describe"."""
from __future__ import annotations

import pickle

import pytest

import memlens
from memlens.analysis.peak import peak_breakdown
from memlens.categories.builtin import FRAME_RULES


def _frames(*frames):
    return [{"filename": f, "line": line, "name": n} for n, f, line in frames]


def _serving_snapshot() -> dict:
    """Events 1 us apart: a 4096-byte block made by vLLM-like `_allocate_kv_cache`; a 2048-byte one by a
    KVCache class's method in the user's file; a 1024-byte one by a C++ frame whose name says kv_cache (not
    Python: not the rule's); a 512-byte one with HF's past_key_values in a Python frame; a 256-byte one by the
    serving loop alone."""
    blocks = [
        (0x100000, 4096, _frames(("_allocate_kv_cache", "/v/vllm/worker/cache_engine.py", 83),
                                 ("__init__", "/v/vllm/worker/cache_engine.py", 60))),
        (0x101000, 2048, _frames(("allocate", "lab/serve.py", 9), ("init_KVCache", "lab/serve.py", 3))),
        (0x102000, 1024, _frames(("at::native::kv_cache_copy(at::Tensor)", "", 0), ("run", "lab/serve.py", 40))),
        (0x103000, 512, _frames(("_update", "lab/hf_like.py", 7), ("merge_past_key_values", "lab/hf_like.py", 2))),
        (0x104000, 256, _frames(("main", "lab/serve.py", 50))),
    ]
    ev = [{"action": "segment_alloc", "addr": 0x100000, "size": 1 << 20, "stream": 0, "time_us": 1, "frames": []}]
    for k, (addr, size, frames) in enumerate(blocks):
        ev.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": 2 + k, "frames": frames})
    return {"segments": [], "device_traces": [ev]}


def test_blocks_made_by_kv_cache_code_are_kv_cache(tmp_path):
    path = tmp_path / "serve.pickle"
    path.write_bytes(pickle.dumps(_serving_snapshot()))
    b = memlens.load(path).blocks.sort_values("alloc_ns", kind="stable")
    got = dict(zip(b["size"], b["category"]))
    assert [got[s] for s in (4096, 2048, 512)] == ["kv_cache"] * 3
    assert got[1024] != "kv_cache" and got[256] != "kv_cache"
    assert b[b["category"] == "kv_cache"]["category_rule"].str.contains("key/value cache").all()
    peak = peak_breakdown(memlens.load(path))["cuda:0"]
    assert dict(zip(peak.by_category["category"], peak.by_category["bytes"]))["kv_cache"] == 4096 + 2048 + 512


def test_frame_rules_say_the_same_as_the_built_in_rules(tmp_path):
    path = tmp_path / "serve.pickle"
    path.write_bytes(pickle.dumps(_serving_snapshot()))
    trace = memlens.load(path)
    again = memlens.categorize(trace, FRAME_RULES)
    assert again.blocks["category"].tolist() == trace.blocks["category"].tolist()


@pytest.mark.shared
def test_verl_kv_cache_is_no_longer_unknown(shared):
    trace = memlens.load(shared("snapshots/verl_segments_only.pickle"))
    peak = peak_breakdown(trace)["cuda:0"]
    by = dict(zip(peak.by_category["category"], peak.by_category["bytes"]))
    # by hand from the blocks table: every block whose stack has a Python frame named _allocate_kv_cache
    stacks = trace.stacks
    kv_ids = set(stacks[stacks["name"].astype(str).str.contains("_allocate_kv_cache")]["stack_id"])
    want = int(trace.blocks[trace.blocks["stack_id"].isin(kv_ids)]["size"].sum())
    assert by["kv_cache"] == want and want > 20 * (1 << 30)
    assert by.get("unknown", 0) / peak.peak_bytes < 0.025
