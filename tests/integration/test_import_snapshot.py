"""CUDA memory snapshot import: every real snapshot in ../shared/traces checked against numbers computed
independently from the raw pickle with a plain per-entry walk, plus crafted snapshots for each rule."""
from __future__ import annotations

import json
import pickle
from collections import Counter

import numpy as np
import pandas as pd
import pytest

import memlens
from memlens.cli import main
from memlens.errors import InputError
from memlens.io.snapshot.importer import snapshot_to_trace

SNAPSHOTS = ["snapshots/decomfl_memory.pickle", "snapshots/cs336_wedsonlin_medium_128_training.pickle",
             "snapshots/cs336_wedsonlin_medium_128_inference.pickle",
             "snapshots/flexgen_opt1.3b_2023format.pickle", "snapshots/verl_segments_only.pickle"]
LIVE = {"active_allocated", "active_pending_free", "active_awaiting_free"}


def raw_facts(snap: dict) -> dict:
    """Everything the tests compare, computed by walking the raw entries one by one."""
    facts = {"allocs": Counter(), "completed": Counter(), "requested": Counter(), "free_without_alloc": 0,
             "entries": 0, "live_final": 0, "live_final_bytes": 0, "peak": {}, "span_us": 0}
    live_seg = {}
    for seg in snap.get("segments", []):
        addr = seg["address"]
        for b in seg["blocks"]:
            a = b.get("address", addr)
            if b["state"] in LIVE:
                live_seg[(f"cuda:{seg['device']}", a)] = b["requested_size"]
            addr = a + b["size"]
    facts["live_final"] = len(live_seg)
    facts["live_final_bytes"] = sum(live_seg.values())
    times = []
    allocated_in_trace_live = set()
    for dev_index, entries in enumerate(snap.get("device_traces", [])):
        dev = f"cuda:{dev_index}"
        live, before_bytes, walk, cur = {}, 0, [], 0
        for e in entries:
            facts["entries"] += 1
            if "time_us" in e:
                times.append(e["time_us"])
            act = e["action"]
            if act == "alloc":
                facts["allocs"][dev] += 1
                live[e["addr"]] = e["size"]
                cur += e["size"]
            elif act == "free_requested":
                facts["requested"][dev] += 1
            elif act == "free_completed":
                facts["completed"][dev] += 1
                if e["addr"] in live:
                    cur -= live.pop(e["addr"])
                else:
                    facts["free_without_alloc"] += 1
                    before_bytes += e["size"]
                    cur -= e["size"]
            walk.append(cur)
        allocated_in_trace_live |= {(dev, a) for a in live}
        before_live = sum(s for k, s in live_seg.items() if k[0] == dev and k not in allocated_in_trace_live)
        start = before_bytes + before_live
        facts["peak"][dev] = max([start] + [start + w for w in walk])
    for dev in {k[0] for k in live_seg} - set(facts["peak"]):  # segments but no device trace
        facts["peak"][dev] = sum(s for k, s in live_seg.items() if k[0] == dev)
    facts["span_us"] = (max(times) - min(times)) if times else 0
    facts["live_not_in_trace"] = len(set(live_seg) - allocated_in_trace_live)
    return facts


@pytest.fixture(scope="module")
def imported():
    """(raw snapshot, facts, Trace) per shared snapshot, computed once."""
    from conftest import shared_trace
    cache = {}

    def get(rel):
        if rel not in cache:
            path = shared_trace(rel)
            with open(path, "rb") as f:
                snap = pickle.load(f)  # trusted test data; memlens itself uses the restricted loader
            cache[rel] = (snap, raw_facts(snap), memlens.load(path))
        return cache[rel]
    return get


@pytest.mark.parametrize("rel", SNAPSHOTS)
def test_snapshot_matches_raw_counts(imported, rel):
    snap, facts, trace = imported(rel)
    ev, b = trace.events, trace.blocks
    assert trace.metadata["source_kind"] == "cuda_snapshot"
    assert len(ev) == facts["entries"]
    raw_actions = [e["action"] for t in snap.get("device_traces", []) for e in t]
    assert ev["action"].tolist() == raw_actions
    for dev, n in facts["allocs"].items():
        assert int(((ev["device"] == dev) & (ev["action"] == "alloc")).sum()) == n
        assert int((b["device"].eq(dev) & b["alloc_ns"].notna()).sum()) == n
        assert int((b["device"].eq(dev) & b["free_ns"].notna()).sum()) == facts["completed"][dev]
    assert int(b["free_without_alloc"].sum()) == facts["free_without_alloc"]
    # blocks live at the end are exactly the final state's live blocks, with the same requested bytes
    alive = b[b["free_ns"].isna()]
    assert len(alive) == facts["live_final"]
    assert int(alive["size"].sum()) == facts["live_final_bytes"]
    assert int(b["allocated_before"].sum()) == facts["free_without_alloc"] + facts["live_not_in_trace"]
    assert trace.duration_ns == facts["span_us"] * 1000
    assert trace.peak_live_bytes() == facts["peak"]
    assert len(trace.segments) == len(snap["segments"])
    assert int(trace.segments["total_size"].sum()) == sum(s["total_size"] for s in snap["segments"])
    assert not trace.has_accesses
    assert any("no accesses" in n for n in trace.metadata["notes"])
    trace.validate()


@pytest.mark.parametrize("rel", SNAPSHOTS)
def test_events_seq_and_block_links(imported, rel):
    _, _, trace = imported(rel)
    ev, b = trace.events, trace.blocks
    assert ev["seq"].is_monotonic_increasing and ev["seq"].is_unique
    for _, g in ev.groupby("device"):
        assert g["t_ns"].is_monotonic_increasing
    allocs = ev[ev["action"] == "alloc"]
    merged = allocs.merge(b, on="block_id", suffixes=("_ev", ""))
    assert (merged["seq"] == merged["alloc_seq"]).all() and (merged["t_ns"] == merged["alloc_ns"]).all()
    assert (merged["addr_ev"] == merged["addr"]).all() and (merged["size_ev"] == merged["size"]).all()
    done = ev[ev["action"] == "free_completed"].merge(b, on="block_id")
    assert (done["seq"] == done["free_seq"]).all()
    # every block id on an alloc/free row exists; non-block rows have none
    is_block_row = ev["action"].isin(["alloc", "free_requested", "free_completed"])
    assert ev.loc[is_block_row, "block_id"].notna().all() and ev.loc[~is_block_row, "block_id"].isna().all()
    assert set(ev["block_id"].dropna()) <= set(b["block_id"])


def test_stacks_rebuild_the_raw_frames(imported):
    snap, _, trace = imported("snapshots/cs336_wedsonlin_medium_128_training.pickle")
    entries = snap["device_traces"][0]
    stacks = {sid: g.sort_values("depth") for sid, g in trace.stacks.groupby("stack_id")}
    for i in (0, 5000, 12000, len(entries) - 1):
        frames = entries[i]["frames"]
        got = stacks[int(trace.events["stack_id"].iloc[i])]
        assert got["name"].tolist() == [f["name"] for f in frames]
        assert got["filename"].tolist() == [f["filename"] for f in frames]
    distinct = {tuple((f["name"], f["filename"], f["line"]) for f in e["frames"]) for e in entries}
    assert trace.stacks["stack_id"].nunique() >= len(distinct)
    # the first alloc is an `index` op called from model.py line 54 (see its frames)
    first = trace.blocks.iloc[0]
    assert first["op"] == "index_Tensor" and first["location"] == "model.py:54 forward"


def test_era_specifics(imported):
    _, _, old = imported("snapshots/flexgen_opt1.3b_2023format.pickle")
    assert old.metadata["clock"]["source_units"] == "event_index" and old.metadata["format_era"].startswith("2023")
    assert any("no time_us" in n for n in old.metadata["notes"])
    # live blocks take their stacks from the 2023 history
    live = old.blocks[old.blocks["free_ns"].isna()]
    assert live["stack_id"].notna().all() and (live["location"] != "").all()
    raw, _, segs = imported("snapshots/verl_segments_only.pickle")
    assert segs.metadata["clock"]["source_units"] == "none" and len(segs.events) == 0
    assert segs.blocks["allocated_before"].all() and segs.blocks["alloc_ns"].isna().all()
    assert (segs.segment_blocks["state"] == "active_pending_free").sum() == 9
    assert segs.segments["segment_pool_id"].tolist() == [
        ",".join(map(str, s["segment_pool_id"])) for s in raw["segments"]]
    _, _, new = imported("snapshots/cs336_wedsonlin_medium_128_training.pickle")
    assert new.metadata["allocator_settings"]["max_split_size"] == -1
    assert new.ops["name"].tolist() == ["Optimizer.step#AdamW.step"]
    assert new.metadata["t0_unix_ns"] == 1783874495854988 * 1000


def test_info_json_on_imported_snapshot(imported, tmp_path, capsys):
    rel = "snapshots/cs336_wedsonlin_medium_128_training.pickle"
    _, facts, _ = imported(rel)
    from conftest import shared_trace
    dst = tmp_path / "train.memlens"
    assert main(["import", str(shared_trace(rel)), "-o", str(dst)]) == 0
    capsys.readouterr()
    assert main(["info", "--json", str(dst)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["devices"] == ["cuda:0"]
    assert info["duration_ns"] == facts["span_us"] * 1000
    assert info["peak_live_bytes"] == facts["peak"]
    assert info["blocks"] == facts["allocs"]["cuda:0"] + facts["free_without_alloc"] + facts["live_not_in_trace"]
    assert main(["import", str(shared_trace(rel)), "-o", str(dst)]) == 2  # exists, no --overwrite
    assert "--overwrite" in capsys.readouterr().err


def _frames(name):
    return [{"name": name, "filename": "/home/u/train.py", "line": 7}]


def crafted() -> dict:
    """Two devices, no time_us on device 1 entries' twin below, every action, both pending spellings."""
    dev0 = [
        {"action": "segment_alloc", "addr": 1000, "size": 4096, "stream": 0, "time_us": 10, "frames": []},
        {"action": "alloc", "addr": 1000, "size": 512, "stream": 0, "time_us": 11, "frames": _frames("a")},
        {"action": "alloc", "addr": 1512, "size": 512, "stream": 0, "time_us": 12, "frames": _frames("b")},
        {"action": "free_requested", "addr": 1000, "size": 512, "stream": 0, "time_us": 13, "frames": []},
        {"action": "free_completed", "addr": 1000, "size": 512, "stream": 0, "time_us": 15, "frames": []},
        {"action": "alloc", "addr": 1000, "size": 300, "stream": 0, "time_us": 16, "frames": _frames("c")},
        {"action": "oom", "device_free": 123, "size": 1 << 40, "stream": 0, "time_us": 17, "frames": []},
        {"action": "segment_map", "addr": 9000, "size": 2 << 20, "stream": 0, "time_us": 18},
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 19},
    ]
    dev1 = [
        {"action": "free_completed", "addr": 5000, "size": 1024, "stream": 7, "time_us": 12},
        {"action": "alloc", "addr": 6000, "size": 2048, "stream": 7, "time_us": 13, "frames": _frames("d")},
        {"action": "free_requested", "addr": 6000, "size": 2048, "stream": 7, "time_us": 14},
    ]
    segments = [
        {"device": 0, "address": 1000, "total_size": 4096, "allocated_size": 1024, "active_size": 1024,
         "requested_size": 812, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": [],
         "blocks": [{"address": 1000, "size": 512, "requested_size": 300, "state": "active_allocated"},
                    {"address": 1512, "size": 512, "requested_size": 512, "state": "active_allocated"},
                    {"address": 2024, "size": 3072, "requested_size": 0, "state": "inactive"}]},
        {"device": 1, "address": 6000, "total_size": 2097152, "allocated_size": 0, "active_size": 3072,
         "requested_size": 3072, "stream": 7, "segment_type": "small", "segment_pool_id": (0, 0),
         "is_expandable": True, "frames": [],
         "blocks": [{"address": 6000, "size": 2048, "requested_size": 2048, "state": "active_awaiting_free"},
                    {"address": 8048, "size": 1024, "requested_size": 1000, "state": "active_pending_free",
                     "frames": _frames("e")},
                    {"address": 9072, "size": 2088080, "requested_size": 0, "state": "inactive"}]},
    ]
    return {"segments": segments, "device_traces": [dev0, dev1],
            "allocator_settings": {"expandable_segments": True}, "external_annotations": []}


def test_crafted_snapshot_rules():
    tr = snapshot_to_trace(crafted(), source="crafted")
    ev, b = tr.events, tr.blocks
    assert ev["seq"].tolist() == list(range(12))
    assert ev["t_ns"].tolist() == [0, 1000, 2000, 3000, 5000, 6000, 7000, 8000, 9000, 2000, 3000, 4000]
    assert tr.metadata["clock"]["source_units"] == "time_us" and tr.metadata["t0_unix_ns"] == 10_000
    oom = ev[ev["action"] == "oom"].iloc[0]
    assert oom["device_free"] == 123 and pd.isna(oom["addr"]) and tr.metadata["ooms"] == 1
    by_name = {r.location.split()[-1]: r for r in b[b["location"] != ""].itertuples()}
    a, bb, c, d, e = (by_name[k] for k in "abcde")
    assert (a.alloc_ns, a.free_ns, a.free_requested_ns, a.alloc_seq, a.free_seq) == (1000, 5000, 3000, 1, 4)
    assert pd.isna(bb.free_ns) and bb.block_size == 512 and c.block_size == 512 and c.size == 300
    assert pd.isna(d.free_ns) and d.free_requested_ns == 4000  # free requested, never completed: live
    assert e.allocated_before and pd.isna(e.alloc_ns) and e.size == 1000 and e.device == "cuda:1"
    nofree = b[b["free_without_alloc"]]
    assert len(nofree) == 1 and nofree["addr"].iloc[0] == 5000 and nofree["free_ns"].iloc[0] == 2000
    assert nofree["allocated_before"].all() and nofree["alloc_ns"].isna().all()
    assert int(b["free_ns"].isna().sum()) == 4  # b, c, d, e == the final state's 4 live blocks
    assert tr.segments["is_expandable"].tolist() == [False, True]
    linked = tr.segment_blocks.dropna(subset=["block_id"])
    assert len(linked) == 4 and set(linked["block_id"]) == set(b.loc[b["free_ns"].isna(), "block_id"])
    notes = " ".join(tr.metadata["notes"])
    assert "1 blocks were freed without their alloc" in notes and "1 blocks had their free requested" in notes
    assert "out-of-memory" in notes
    tr.validate()


def test_crafted_without_time_us_uses_entry_order():
    snap = crafted()
    for trace in snap["device_traces"]:
        for entry in trace:
            entry.pop("time_us")
    tr = snapshot_to_trace(snap)
    assert tr.metadata["clock"]["source_units"] == "event_index"
    assert tr.events["t_ns"].tolist() == list(range(9)) + list(range(3))
    assert "t0_unix_ns" not in tr.metadata


def test_trace_live_blocks_disagreeing_with_final_state_are_noted():
    snap = crafted()
    snap["segments"][0]["blocks"][1]["state"] = "inactive"  # block b is live in the trace only
    tr = snapshot_to_trace(snap)
    assert any("disagree" in n for n in tr.metadata["notes"])


@pytest.mark.parametrize("bad, message", [
    ([1, 2, 3], "not a list of allocator segments"),
    ("text", "not a CUDA memory snapshot"),
    ({"foo": 1}, "no 'segments' or 'device_traces'"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": "x", "size": 1}]]}, "integer"),
    ({"segments": [], "device_traces": [["entry"]]}, "not dicts"),
])
def test_malformed_snapshot_objects(bad, message):
    with pytest.raises(InputError, match=message):
        snapshot_to_trace(bad, source="crafted.pickle")


def test_old_list_of_segments_is_read():
    tr = snapshot_to_trace(crafted()["segments"])
    assert len(tr.blocks) == 4 and tr.blocks["allocated_before"].all()
    assert np.array_equal(np.sort(tr.blocks["size"].to_numpy()), [300, 512, 1000, 2048])


def _tables_equal(a, b):
    for name in ("blocks", "events", "segments", "segment_blocks", "stacks"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("rel", SNAPSHOTS)
def test_streaming_reader_equals_full_unpickling(imported, rel):
    from memlens.io.snapshot.frames import StackInterner
    from memlens.io.snapshot.stream import EntryColumns, stream_snapshot
    from conftest import shared_trace
    snap, _, trace = imported(rel)
    streamed = stream_snapshot(shared_trace(rel).read_bytes(), StackInterner())
    assert streamed is not None  # real snapshots take the streaming path
    assert all(isinstance(t, EntryColumns) for t in streamed["device_traces"] if len(t))
    _tables_equal(trace, snapshot_to_trace(snap, source=trace.metadata["source_path"]))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_pickle_protocol_imports_the_same(tmp_path, protocol):
    path = tmp_path / f"p{protocol}.pickle"
    path.write_bytes(pickle.dumps(crafted(), protocol=protocol))
    _tables_equal(memlens.load(path), snapshot_to_trace(crafted(), source=str(path)))


def test_gzipped_snapshot(tmp_path):
    import gzip
    path = tmp_path / "snap.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(crafted())))
    _tables_equal(memlens.load(path), snapshot_to_trace(crafted(), source=str(path)))


def test_shared_objects_in_the_stream(tmp_path):
    """A frames list shared between trace entries and (later) segments, and an entry object repeated:
    the streaming reader resolves the first and hands the second to the general unpickler."""
    snap = crafted()
    shared_frames = _frames("shared")
    dev0 = snap["device_traces"][0]
    dev0[1]["frames"] = shared_frames
    dev0[2]["frames"] = shared_frames
    reordered = {"device_traces": snap["device_traces"], "segments": snap["segments"]}
    snap["segments"][0]["blocks"][1]["frames"] = shared_frames
    path = tmp_path / "shared.pickle"
    path.write_bytes(pickle.dumps(reordered, protocol=4))
    got = memlens.load(path)
    _tables_equal(got, snapshot_to_trace(reordered))
    live_b = got.segment_blocks[got.segment_blocks["addr"] == 1512]
    assert int(live_b["stack_id"].iloc[0]) == int(got.events["stack_id"].iloc[1])

    # an entry object repeated: each repeat would be a row for 5 bytes of file (36M of them made gigabytes,
    # a hostile file), so a file that repeats one is refused; a snapshot built in memory may repeat entries
    repeated = crafted()
    repeated["device_traces"][1].append(repeated["device_traces"][1][0])
    path.write_bytes(pickle.dumps(repeated, protocol=4))
    with pytest.raises(InputError, match="more than once"):
        memlens.load(path)
    assert len(snapshot_to_trace(repeated).events) == sum(map(len, repeated["device_traces"]))
