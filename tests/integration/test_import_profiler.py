"""Kineto / Chrome trace and memory-timeline imports, checked against numbers computed from the raw JSON."""
from __future__ import annotations

import gzip
import json
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

import memlens
from memlens.io.kineto.importer import kineto_to_trace
from memlens.io.kineto.attrib import innermost_enclosing
from memlens.io.memory_timeline import memory_timeline_to_trace
from memlens.io.size_pairing import pair_by_size_lifo

KINETO = ["kineto/hta_df_index_resolver.json.gz", "kineto/kineto_resnet50_2021format.pt.trace.json.gz",
          "kineto/tracelens_h100_bert_small.json.gz", "kineto/tracelens_mi300_bert_small.json.gz"]
DEVICE_PREFIX = {0: "cpu", 1: "cuda", 6: "cuda"}


def raw_memory(path) -> dict:
    """Per device: allocs, frees, net curve peak (+ live before when totals exist), ts span, from raw JSON."""
    with gzip.open(path) as f:
        doc = json.load(f)
    mem = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    mem.sort(key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))
    per = defaultdict(lambda: {"allocs": 0, "frees": 0, "bytes": []})
    for e in mem:
        a = e["args"]
        dev = "cpu" if a["Device Type"] == 0 else f"{DEVICE_PREFIX[a['Device Type']]}:{a['Device Id']}"
        p = per[dev]
        p["allocs" if a["Bytes"] > 0 else "frees"] += a["Bytes"] != 0
        p["bytes"].append(a["Bytes"])
        p.setdefault("start", a.get("Total Allocated", a["Bytes"]) - a["Bytes"])
        p["max_total"] = max(p.get("max_total", 0), a.get("Total Allocated", 0))
    for p in per.values():
        curve = np.cumsum(p["bytes"]) + p["start"]
        p["peak"] = int(max(curve.max(), p["start"]))
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "Operator")]
    return {"devices": dict(per), "n_mem": len(mem), "n_ops": len(ops), "mem": mem, "ops": ops, "doc": doc}


@pytest.fixture(scope="module")
def kineto():
    from conftest import shared_trace
    cache = {}

    def get(rel):
        if rel not in cache:
            path = shared_trace(rel)
            cache[rel] = (raw_memory(path), memlens.load(path))
        return cache[rel]
    return get


@pytest.mark.parametrize("rel", KINETO)
def test_kineto_matches_raw(kineto, rel):
    raw, trace = kineto(rel)
    b = trace.blocks[~trace.blocks["synthetic"].astype(bool)]
    assert trace.metadata["source_kind"] == "kineto"
    assert len(trace.events) == raw["n_mem"] and len(trace.ops) == raw["n_ops"]
    assert sorted(trace.devices) == sorted(raw["devices"])
    for dev, p in raw["devices"].items():
        mine = b[b["device"] == dev]
        assert int(mine["alloc_ns"].notna().sum()) == p["allocs"]
        assert int(mine["free_ns"].notna().sum()) == p["frees"]
    # the live curve (with bytes live before profiling) equals the profiler's own running total
    assert trace.peak_live_bytes() == {d: p["peak"] for d, p in raw["devices"].items()}
    if "Total Allocated" in raw["mem"][0]["args"]:
        for dev, p in raw["devices"].items():
            assert trace.peak_live_bytes()[dev] == max(p["max_total"], p["start"])
    ts = [e["ts"] for e in raw["mem"]] + [e["ts"] for e in raw["ops"]] \
        + [e["ts"] + e.get("dur", 0) for e in raw["ops"]]
    assert abs(trace.duration_ns - (max(ts) - min(ts)) * 1000) <= 2
    trace.validate()


def test_kineto_2021_pairs_by_size_and_says_so(kineto):
    raw, trace = kineto("kineto/kineto_resnet50_2021format.pt.trace.json.gz")
    assert trace.metadata["format_era"].startswith("2021")
    assert (trace.blocks["pairing"] == "size_lifo").all() and trace.blocks["addr"].isna().all()
    assert any("paired by size" in n for n in trace.metadata["notes"])
    done = trace.blocks.dropna(subset=["free_ns"])
    assert (done["free_ns"] >= done["alloc_ns"]).all()


def test_kineto_rocm_and_base_time(kineto):
    raw, trace = kineto("kineto/tracelens_mi300_bert_small.json.gz")
    assert trace.metadata["device_types"] == [0, 6] and "cuda:0" in trace.devices
    assert any("HIP" in n for n in trace.metadata["notes"])
    first_ts = min(min(e["ts"] for e in raw["mem"]), min(e["ts"] for e in raw["ops"]))
    assert trace.metadata["t0_unix_ns"] == raw["doc"]["baseTimeNanoseconds"] + round(first_ts * 1000)
    assert (trace.blocks["module"] != "").any()  # recorded with_modules


def test_kineto_attribution_against_brute_force(kineto):
    raw, trace = kineto("kineto/tracelens_h100_bert_small.json.gz")
    t0 = min(min(e["ts"] for e in raw["mem"]), min(e["ts"] for e in raw["ops"]))
    for ev, op_id in zip(raw["mem"], trace.events["op_id"]):
        inside = [(o["ts"], -o.get("dur", 0), i) for i, o in enumerate(raw["ops"])
                  if (o["pid"], str(o["tid"])) == (ev["pid"], str(ev["tid"]))
                  and o["ts"] <= ev["ts"] < o["ts"] + max(o.get("dur", 0), 0.001)]
        expected = max(inside)[2] if inside else None
        assert (None if pd.isna(op_id) else int(op_id)) == expected
    assert trace.metadata["t0_trace_ts_us"] == t0


def test_kineto_pre_profiling_block(kineto):
    raw, trace = kineto("kineto/hta_df_index_resolver.json.gz")
    syn = trace.blocks[trace.blocks["synthetic"].astype(bool)]
    assert syn["device"].tolist() == ["cuda:1"]
    assert int(syn["size"].iloc[0]) == raw["devices"]["cuda:1"]["start"] == 4096614400
    assert syn["allocated_before"].all() and syn["addr"].isna().all()
    assert trace.ops["iteration"].notna().any()
    # integer epoch-microsecond ts: the absolute start is exact
    first = min(min(e["ts"] for e in raw["mem"]), min(e["ts"] for e in raw["ops"]))
    assert trace.metadata["t0_unix_ns"] == first * 1000


def test_kineto_crafted_edges():
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::outer", "pid": 1, "tid": 1, "ts": 100, "dur": 50},
        {"ph": "X", "cat": "cpu_op", "name": "aten::inner", "pid": 1, "tid": 1, "ts": 100, "dur": 10},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 105,
         "args": {"Addr": 7, "Bytes": 64, "Device Type": 1, "Device Id": 0, "Total Allocated": 64}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 120,
         "args": {"Addr": 9, "Bytes": -32, "Device Type": 1, "Device Id": 0, "Total Allocated": 32}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 130,
         "args": {"Addr": 7, "Bytes": -64, "Device Type": 1, "Device Id": 0, "Total Allocated": -32}},
    ]
    tr = kineto_to_trace({"traceEvents": events})
    b = tr.blocks.set_index("addr")
    assert b.loc[7, "op"] == "aten::inner" and b.loc[7, "free_ns"] == 30_000 and b.loc[7, "alloc_ns"] == 5_000
    assert b.loc[9, "free_without_alloc"] and pd.isna(b.loc[9, "alloc_ns"])
    assert tr.events["op_id"].tolist()[:2] == [1, 0] and pd.isna(tr.events["op_id"].iloc[2])
    # ops without [memory] events load (no blocks, a note says so); nothing at all is refused
    bare = kineto_to_trace({"traceEvents": events[:2]})
    assert len(bare.ops) == 2 and len(bare.blocks) == 0 and bare.metadata["memory_events"] == 0
    with pytest.raises(memlens.InputError, match="no \\[memory\\] events"):
        kineto_to_trace({"traceEvents": []})
    with pytest.raises(memlens.InputError, match="malformed"):
        kineto_to_trace({"traceEvents": [{"name": "[memory]", "ts": 1, "args": {"Bytes": "x"}}]})


def test_size_lifo_pairing_matches_a_stack_walk():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        dev, size, is_alloc = rng.integers(0, 2, n), rng.integers(1, 4, n), rng.random(n) < 0.55
        p = pair_by_size_lifo(dev, size, is_alloc)
        stacks, expected = {}, {}
        for i in range(n):
            key = (dev[i], size[i])
            if is_alloc[i]:
                stacks.setdefault(key, []).append(i)
                expected[i] = (i, i, -1)
            elif stacks.get(key):
                j = stacks[key].pop()
                expected[j] = (j, j, i)
            else:
                expected[i] = (i, -1, i)
        got = sorted(zip(p.first_row.tolist(), p.alloc_row.tolist(), p.completed_row.tolist()))
        assert got == sorted(expected.values())


def test_innermost_enclosing_against_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(100):
        ops = []

        def nest(thread, lo, hi, depth):
            t = lo
            while t < hi and rng.random() < 0.7:
                s = int(rng.integers(t, hi))
                e = int(rng.integers(s, hi + 1))
                ops.append((thread, s, e))
                if depth < 4 and e - s > 2:
                    nest(thread, s, e, depth + 1)
                t = e
        for thread in range(2):
            nest(thread, 0, 100, 0)
        if not ops:
            continue
        th, s, e = (np.array(c) for c in zip(*ops))
        q, qt = rng.integers(0, 101, 40), rng.integers(0, 3, 40)
        got = innermost_enclosing(th, s, e, qt, q)
        end = np.maximum(e, s + 1)
        for i in range(40):
            inside = [j for j in range(len(ops)) if th[j] == qt[i] and s[j] <= q[i] < end[j]]
            if not inside:
                assert got[i] == -1
            else:
                best = max(inside, key=lambda j: (s[j], -end[j]))
                assert (s[got[i]], end[got[i]]) == (s[best], end[best])


def test_memory_timeline_raw_matches_category_curves(shared):
    path = shared("profiler/hta_memory_timeline.raw.gz")
    with gzip.open(path) as f:
        rows = json.load(f)
    trace = memlens.load(path)
    assert trace.metadata["source_kind"] == "memory_timeline" and trace.metadata["clock"]["source_units"] == "ns"
    order = ["parameter", "optimizer_state", "input", "temporary", "activation", "gradient",
             "autograd_detail", "unknown"]
    timed = [r[0] for r in rows if r[0] != -1]
    assert trace.duration_ns == max(timed) - min(timed)
    b = trace.blocks
    for code, cat in enumerate(order):
        deltas = [r[2] for r in rows if r[3] == code]
        final = sum(deltas)
        mine = b[(b["category"] == cat) & b["free_ns"].isna()]
        assert int(mine["size"].sum()) == final
    assert int(b["allocated_before"].sum()) >= sum(1 for r in rows if r[1] == 1)
    total_curve_peak = max(np.cumsum([r[2] for r in rows]).max(), 0)
    # equal-time rows are applied frees-first by Trace.live_bytes; the raw running sum is an upper bound
    # the export does not name its device: not presented as a GPU unless the caller says so
    assert trace.devices == ["unknown"]
    assert trace.peak_live_bytes()["unknown"] <= total_curve_peak
    from memlens.io.memory_timeline import import_memory_timeline
    assert import_memory_timeline(path, device="cpu").devices == ["cpu"]
    trace.validate()


def test_memory_timeline_coalesced_and_errors():
    # torch writes [times_us, [[0, parameter, optimizer_state, input, temporary, activation, ...]]]
    tr = memory_timeline_to_trace([[10, 20, 30], [[0, 0, 5, 0, 0, 0, 0, 0, 0], [0, 0, 5, 0, 0, 100, 0, 0, 0],
                                                   [0, 0, 3, 0, 0, 40, 0, 0, 0]]])
    live = tr.blocks[tr.blocks["free_ns"].isna()].groupby("category")["size"].sum().to_dict()
    assert live == {"optimizer_state": 3, "activation": 40}
    ended = tr.blocks.dropna(subset=["free_ns"])
    assert ended[["category", "size", "free_ns"]].values.tolist() == [["optimizer_state", 2, 20_000],
                                                                      ["activation", 60, 20_000]]
    for bad, msg in (([], "non-empty"), ([[1, 2, 3]], "4 fields"), ([[1, 9, 3, 0]], "action"),
                     ([[1, 2, 3, 99]], "category"), ([["a", 2, 3, 0]], "integers")):
        with pytest.raises(memlens.InputError, match=msg):
            memory_timeline_to_trace(bad)


def test_detection_of_chrome_trace_variants(shared, tmp_path):
    from memlens.io.detect import detect_format
    # TraceLens traces open with a long "metadata" object; traceEvents comes later
    assert detect_format(shared("kineto/tracelens_h100_bert_small.json.gz")) == "kineto"
    assert detect_format(shared("profiler/hta_memory_timeline.raw.gz")) == "memory_timeline"
    array = tmp_path / "array_format.json"
    array.write_text(json.dumps([
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5,
         "args": {"Addr": 1, "Bytes": 512, "Device Type": 1, "Device Id": 0}}]))
    assert detect_format(array) == "kineto"
    tr = memlens.load(array)
    assert tr.blocks["op"].tolist() == ["aten::empty"] and tr.blocks["alloc_ns"].tolist() == [5000]
