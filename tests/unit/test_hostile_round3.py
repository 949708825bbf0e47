"""Hostile input, round three: special and huge files refused before reading, device counts bounded (and the peak
breakdown computed for every device in one pass), user patterns that cannot hang, GPU files checked field by
field. Each case checks exit 2 with one clean line (`hostile.assert_refused`) or the exact error."""
from __future__ import annotations

import json
import os
import pickle
import re

import numpy as np
import pandas as pd
import pytest

from conftest import SAMPLE_TRACES
from hostile import assert_refused, run_memlens
from memlens.errors import InputError, read_user_file
from memlens.trace import Trace

SAMPLE = SAMPLE_TRACES / "mlp_train_sgd_stacks.memlens"


# ---------------------------------------------------------------- files that are not files

@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.toml"
    os.mkfifo(path)
    return path


def test_categories_from_a_device_or_a_fifo_are_refused(fifo):
    assert_refused(run_memlens("info", "--categories", "/dev/zero", SAMPLE), "/dev/zero", "is a device")
    assert_refused(run_memlens("info", "--categories", fifo, SAMPLE), "pipe.toml", "FIFO")


def test_gpu_file_that_is_a_device_is_refused(tmp_path):
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    assert_refused(run_memlens("ati", "--gpu", link, SAMPLE), "zero.json", "is a device")


def test_sparse_file_that_starts_like_kineto_is_refused_by_its_size(tmp_path):
    path = tmp_path / "huge_trace.json"
    with open(path, "wb") as f:
        f.write(b'{"schemaVersion": 1, "traceEvents": [')
        f.truncate(3 << 30)  # 3 GiB, sparse: no disk used
    line = assert_refused(run_memlens("info", path), "huge_trace.json", "3,221,225,472 bytes", "MEMLENS_MAX_DECOMPRESSED")
    assert "at most 1,073,741,824" in line


def test_read_user_file_bounds(tmp_path, fifo):
    path = tmp_path / "f.txt"
    path.write_bytes(b"x" * 100)
    assert read_user_file(path, 100) == b"x" * 100  # exactly at the limit
    with pytest.raises(InputError, match="100 bytes: a rules file holds at most 99"):
        read_user_file(path, 99, "rules file")
    with pytest.raises(InputError, match="FIFO"):
        read_user_file(fifo, 100)
    with pytest.raises(InputError, match="is a directory"):
        read_user_file(tmp_path, 100)
    with pytest.raises(InputError, match="no such file"):
        read_user_file(tmp_path / "missing", 100)


# ---------------------------------------------------------------- device counts

def test_a_snapshot_with_thousands_of_devices_is_refused(tmp_path):
    entry = {"action": "alloc", "addr": 0, "size": 512, "stream": 0, "frames": []}
    path = tmp_path / "devices.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[dict(entry)] for _ in range(2500)]},
                                  protocol=4))
    assert_refused(run_memlens("info", path), "2,500 devices", "at most 64", "MEMLENS_MAX_DEVICES")


def test_the_device_limit_is_exact_and_can_be_raised(monkeypatch):
    from memlens.trace.checks import validate_trace
    rows = [{"block_id": i, "device": f"cuda:{i}", "size": 512, "alloc_ns": 0, "free_ns": 1} for i in range(65)]
    validate_trace(Trace.from_tables(pd.DataFrame(rows[:64]), metadata={"source_kind": "synthetic"}))
    with pytest.raises(InputError, match="65 devices"):
        validate_trace(Trace.from_tables(pd.DataFrame(rows), metadata={"source_kind": "synthetic"}))
    monkeypatch.setenv("MEMLENS_MAX_DEVICES", "65")
    validate_trace(Trace.from_tables(pd.DataFrame(rows), metadata={"source_kind": "synthetic"}))


def _reference_peak(blocks: pd.DataFrame):
    """Brute force for one device: walk its events in (time, seq) order, the first maximum of live bytes and
    the blocks live right after it (allocated at or before, not yet freed)."""
    lo = int(np.nanmin(blocks[["alloc_ns", "free_ns"]].to_numpy(dtype=float)))
    events = []
    for r in blocks.itertuples():
        a = lo if pd.isna(r.alloc_ns) else int(r.alloc_ns)
        events.append((a, int(r.alloc_seq), r.size, r.block_id, True))
        if not pd.isna(r.free_ns):
            events.append((int(r.free_ns), int(r.free_seq), -r.size, r.block_id, False))
    events.sort(key=lambda e: (e[0], e[1]))
    live, best, at, alive, best_alive = 0, None, None, set(), set()
    for t, seq, d, bid, is_alloc in events:
        live += d
        alive = alive | {bid} if is_alloc else alive - {bid}
        if best is None or live > best:
            best, at, best_alive = live, (t, seq), set(alive)
    return best, at, best_alive


def test_peak_breakdown_over_many_devices_matches_a_sweep():
    rng = np.random.default_rng(7)
    rows = []
    for i in range(900):
        a = int(rng.integers(0, 50))
        rows.append({"block_id": i, "device": f"cuda:{int(rng.integers(0, 60))}",
                     "size": int(rng.choice([0, 512, 1024, 4096])), "alloc_ns": a,
                     "free_ns": None if rng.random() < 0.2 else a + int(rng.integers(0, 20)),
                     "category": str(rng.choice(["activation", "parameter", ""]))})
    trace = Trace.from_tables(pd.DataFrame(rows), metadata={"source_kind": "synthetic"})
    # the events at an equal time share no instant with other rows of their device only by seq: use the
    # trace's own seq (filled by from_tables) in the reference too
    from memlens.analysis.peak import peak_breakdown
    got = peak_breakdown(trace, largest=2)
    assert sorted(got) == trace.devices
    for dev, b in trace.blocks.groupby("device"):
        peak, (t, seq), alive = _reference_peak(b)
        pb = got[dev]
        assert (pb.peak_bytes, pb.peak_ns, pb.peak_seq, pb.live_blocks) == (peak, t, seq, len(alive))
        live = b[b["block_id"].isin(alive)]
        want = live.assign(category=live["category"].replace("", "(unknown)")).groupby("category")["size"].sum()
        assert dict(zip(pb.by_category["category"], pb.by_category["bytes"])) == {k: int(v) for k, v in want.items()}
        top = live.sort_values(["size", "block_id"], ascending=[False, True]).head(2)
        assert pb.largest["block_id"].tolist() == top["block_id"].tolist()


# ---------------------------------------------------------------- user patterns and rules files

def _one_block_trace(function_name: str) -> Trace:
    stacks = pd.DataFrame([{"stack_id": 0, "depth": 0, "name": function_name, "filename": "m.py", "line": 1}])
    blocks = pd.DataFrame([{"block_id": 1, "device": "cuda:0", "size": 512, "alloc_ns": 0, "free_ns": 5,
                            "stack_id": 0}])
    return Trace.from_tables(blocks, metadata={"source_kind": "synthetic"}, stacks=stacks)


def test_a_backtracking_pattern_stops_with_the_rule_named(tmp_path):
    from memlens.categories import categorize
    rules = tmp_path / "rules.toml"
    rules.write_text("[[rule]]\ncategory = 'fine'\nfunction = '^forward$'\n\n"
                     "[[rule]]\ncategory = 'slow'\nfunction = '(a|aa)+$'\n")
    with pytest.raises(InputError, match=r"rules.toml:5: function pattern '\(a\|aa\)\+\$' took over 2 s"):
        categorize(_one_block_trace("a" * 40 + "!"), rules)
    # the same rule on a name it answers quickly is a rule like any other
    out = categorize(_one_block_trace("aaaa"), rules)
    assert out.blocks["category"].tolist() == ["slow"]


def test_toml_nested_deeply_is_bad_input(tmp_path):
    from memlens.categories.rules import read_rules_file
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(InputError, match="deep.toml: not valid TOML for rules: nested too deeply"):
        read_rules_file(path)


# ---------------------------------------------------------------- GPU files

def _gpu_file(tmp_path, **changes) -> str:
    """The H100's description as a GPU file, with `changes` spliced in as raw JSON text."""
    from memlens.devicetime.gpus import gpu
    d = gpu("H100").to_dict()
    text = json.dumps({k: f"@@{k}@@" if k in changes else v for k, v in d.items()})
    for k, raw in changes.items():
        text = text.replace(f'"@@{k}@@"', raw)
    path = tmp_path / "mygpu.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("field, raw, message", [
    ("latency_ns", "Infinity", "latency_ns must be finite"),
    ("latency_ns", "-1", "latency_ns must be >= 0"),
    ("mem_bw", "true", "mem_bw must be a number, not bool"),
    ("mem_bw", "0", "mem_bw must be > 0"),
    ("compute_units", "-4", "compute_units must be >= 1"),
    ("compute_units", "2.5", "compute_units must be a whole number"),
    ("gpus_per_node", "0", "gpus_per_node must be >= 1"),
    ("network_bw", "1" + "0" * 400, "network_bw must be finite, got a number with 401 digits"),
    ("clock_ghz", "1e308", "clock_ghz must be > 0 and <= 100"),
    ("mem_efficiency", "1.0000001", "mem_efficiency must be > 0 and <= 1"),
    ("class_scale", '{"gemm": [1e308, 1]}', "class_scale['gemm'][0] must be >= 0 and <= 1,000,000"),
    ("class_scale", '"fast"', "class_scale must be an object"),
    ("flops", '{"bf16": null}', "flops['bf16'] must be a number, not NoneType"),
    ("host_bw", "[1e9]", "host_bw must be [device->host, host->device]"),
    ("name", "7", "name must be a string"),
])
def test_gpu_file_fields_are_checked(tmp_path, field, raw, message):
    from memlens.devicetime.gpus import load_gpu
    path = _gpu_file(tmp_path, **{field: raw})
    with pytest.raises(InputError) as err:
        load_gpu(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_gpu_file_edges_that_are_fine(tmp_path):
    from memlens.devicetime.gpus import load_gpu
    g = load_gpu(_gpu_file(tmp_path, gpus_per_node="1", mem_efficiency="1", latency_ns="0", compute_units="1.0",
                           class_scale='{"gemm": [0, 1000000]}'))
    assert (g.gpus_per_node, g.mem_efficiency, g.latency_ns, g.compute_units) == (1, 1.0, 0.0, 1)
    assert g.class_scale == {"gemm": (0, 1000000)}


def test_a_bad_gpu_file_is_exit_2_on_the_command_line(tmp_path):
    path = _gpu_file(tmp_path, latency_ns="Infinity")
    assert_refused(run_memlens("ati", "--gpu", path, SAMPLE), "mygpu.json", "latency_ns must be finite")


# ---------------------------------------------------------------- nothing prints a raw control character

EVIL = "\x1b[2J\x1b]0;pwned\x07\u202eevil\u2028"


def _raw_controls(text: str) -> list[str]:
    import unicodedata
    return sorted({repr(ch) for ch in text if ch not in "\n\t" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")})


def test_names_from_files_never_print_raw(tmp_path):
    """Module, op and GPU names carrying terminal escapes, a bidi override and a line separator, through the
    verbs that print them: each exits 0 or 2 and prints every such character as an escape."""
    n = 6
    blocks = pd.DataFrame([{"block_id": i, "device": "cuda:0", "size": 512 * (i + 1), "alloc_ns": 10 * i,
                            "free_ns": 10 * i + 35, "op": EVIL + "op", "module": EVIL + "module"} for i in range(n)])
    ops = pd.DataFrame([{"op_id": i, "name": EVIL + "op", "start_ns": 10 * i, "end_ns": 10 * i + 5,
                         "module": EVIL + "module"} for i in range(2 * n)])
    accesses = pd.DataFrame([{"block_id": i, "t_ns": 10 * i + d, "op_id": i + k, "is_write": k == 0}
                             for i in range(n) for k, d in ((0, 1), (1, 12), (2, 30))])
    path = tmp_path / "evil.memlens"
    Trace.from_tables(blocks, accesses=accesses, ops=ops, metadata={"source_kind": "synthetic"}).save(path)
    gpu_path = _gpu_file(tmp_path, name=json.dumps("H100" + EVIL))
    runs = [("info", path), ("ati", "--by", "module", path), ("ati", "--by", "op", path), ("outliers", path),
            ("ati", "--gpu", gpu_path, "--by", "op", path)]
    for argv in runs:
        out = run_memlens(*argv)
        assert out.code in (0, 2), (argv, out.stderr[-500:])
        assert _raw_controls(out.stdout) == [] and _raw_controls(out.stderr) == [], argv
    shown = run_memlens("ati", "--by", "module", path).stdout
    assert "\\x1b[2J" in shown and "\\u202eevil" in shown  # escaped, not dropped


def test_unknown_snapshot_actions_are_escaped_in_the_import_note(tmp_path):
    entries = [{"action": "alloc", "addr": 0, "size": 512, "stream": 0, "frames": []},
               {"action": "x\x1b[31mred\u202e", "addr": 0, "size": 512, "stream": 0, "frames": []}]
    src = tmp_path / "odd.pickle"
    src.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    out = run_memlens("import", src, "-o", tmp_path / "odd.memlens")
    assert out.code in (0, 2), out.stderr[-500:]
    assert _raw_controls(out.stdout + out.stderr) == []


def test_terminal_text_escapes_exactly_the_unsafe_characters():
    from memlens.errors import terminal_text
    assert terminal_text("a\tb\nc") == "a\tb\nc"
    assert terminal_text("\x00\x1b\x7f") == "\\x00\\x1b\\x7f"
    assert terminal_text("é漢\u202e\ud800\u2028\x85") == "é漢\\u202e\\ud800\\u2028\\x85"


# ---------------------------------------------------------------- saving over a symbolic link

def test_overwriting_a_trace_through_a_symlink_leaves_nothing_behind(tmp_path):
    trace = Trace.from_tables(pd.DataFrame([{"block_id": 1, "device": "cuda:0", "size": 512, "alloc_ns": 0,
                                             "free_ns": 5}]), metadata={"source_kind": "synthetic"})
    trace.save(tmp_path / "a.memlens")
    (tmp_path / "l.memlens").symlink_to("a.memlens")
    trace.save(tmp_path / "l.memlens", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.memlens", "l.memlens"]
    assert (tmp_path / "l.memlens" / "manifest.json").is_file()
    (tmp_path / "dangling.memlens").symlink_to(tmp_path / "nowhere")
    with pytest.raises(InputError, match="symbolic link to nothing"):
        trace.save(tmp_path / "dangling.memlens", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.memlens", "dangling.memlens", "l.memlens"]


# ---------------------------------------------------------------- sizes and numbers that are not what they seem

def _snapshot_with_size(path, size):
    entries = [{"action": "alloc", "addr": 0, "size": size, "stream": 0, "frames": []},
               {"action": "free_completed", "addr": 0, "size": size, "stream": 0, "frames": []}]
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    return path


@pytest.mark.parametrize("size, shown", [(512.0, "float '512.0'"), ("512", "str '512'"), (True, "bool 'True'"),
                                         (1e23, "float '1e+23'")])
def test_snapshot_sizes_of_the_wrong_type_are_named(tmp_path, size, shown):
    from memlens.io import load
    with pytest.raises(InputError, match=re.escape(f"holds {shown} where an integer is expected")):
        load(_snapshot_with_size(tmp_path / "s.pickle", size))


def test_a_missing_snapshot_size_is_a_note(tmp_path):
    from memlens.io import load
    trace = load(_snapshot_with_size(tmp_path / "s.pickle", None))
    assert trace.blocks["size"].tolist() == [0]
    assert any("2 trace entries without a size (read as 0 bytes)" in n for n in trace.metadata["notes"])


def test_numbers_past_their_range_are_bad_input(tmp_path):
    csv = tmp_path / "big.csv"
    csv.write_text("id,lower,upper,size\n1,0,10,1e23\n")
    assert_refused(run_memlens("info", csv), "column 'size' holds 1e+23 on line 2")
    csv.write_text(f"id,lower,upper,size,alignment\n1,0,10,512,{2 ** 66}\n")
    assert_refused(run_memlens("info", csv), "column 'alignment' holds 7.3787e+19 on line 2")
    csv.write_text(f"id,lower,upper,size\n1,0,10,{2 ** 62 - 1}\n")  # just under the bound: read
    from memlens.io.lifetimes_csv import read_lifetimes_csv
    assert read_lifetimes_csv(csv)["size"].tolist() == [2 ** 62 - 1]
    assert_refused(run_memlens("simulate", "--capacity", "9" * 5000, SAMPLE), "(5,000 characters) as a size")


def test_a_lone_surrogate_in_a_kineto_name_is_bad_input(tmp_path):
    memory = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "s": "t"}
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::empty\\ud800", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
               "args": {}},
              {**memory, "ts": 1, "args": {"Device Type": 1, "Device Id": 0, "Addr": 1000, "Bytes": 512,
                                           "Total Allocated": 512, "Total Reserved": 2097152}},
              {**memory, "ts": 5, "args": {"Device Type": 1, "Device Id": 0, "Addr": 1000, "Bytes": -512,
                                           "Total Allocated": 0, "Total Reserved": 2097152}}]
    path = tmp_path / "surrogate.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}).replace("\\\\ud800", "\\ud800"))
    assert "\\ud800" in path.read_text()
    assert_refused(run_memlens("info", path), "surrogate.json", "not valid Unicode", "\\ud800")


def test_a_sparse_lifetime_csv_is_refused_by_its_size(tmp_path):
    path = tmp_path / "huge.csv"
    with open(path, "wb") as f:
        f.write(b"id,lower,upper,size\n1,0,10,512\n")
        f.truncate(3 << 30)
    assert_refused(run_memlens("info", path), "huge.csv", "3,221,225,472 bytes", "MEMLENS_MAX_DECOMPRESSED")
