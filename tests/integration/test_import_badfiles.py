"""A corpus of bad inputs (crafted and fuzzed from the real traces) through the CLI: each gets exit code 2
and one stderr line naming the file, or (for mutations that still parse) a clean import; never an
internal error, a traceback, a hang, or code run by a pickle."""
from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from memlens.cli import main
from memlens.io.safe_pickle import load_pickle


class _RunsCode:
    """Unpickling this would create a marker file through os.system."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _ImportsModule:
    def __reduce__(self):
        import collections
        return (collections.OrderedDict, ())


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_clean_input_error(code: int, err: str, path: Path) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(path) in lines[0], lines[0]


def crafted_corpus(tmp: Path) -> dict[str, Path]:
    """name -> path of a file that must be refused with a clear message."""
    files: dict[str, bytes] = {
        "empty.pickle": b"", "empty.json": b"", "empty.csv": b"", "empty_noext": b"",
        "spaces.json": b"   \n\t ",
        "garbage.bin": bytes(np.random.default_rng(0).integers(0, 256, 2000, dtype=np.uint8)),
        "text.txt": b"hello, this is not a trace\n",
        "pickle_list_of_ints.pickle": pickle.dumps([1, 2, 3]),
        "pickle_string.pickle": pickle.dumps("not a snapshot"),
        "pickle_dict_wrong_keys.pickle": pickle.dumps({"model": 1}),
        "pickle_wrong_version.pickle": pickle.dumps({"segments": [], "device_traces": [[{"addr": 1}]]}),
        "pickle_bad_types.pickle": pickle.dumps({"segments": "nope", "device_traces": []}),
        "pickle_imports_module.pickle": pickle.dumps({"segments": [_ImportsModule()]}),
        "pickle_truncated_header.pickle": b"\x80\x04\x95",
        "pickle_future_protocol.pickle": b"\x80\x09}\x94.",
        "pickle_gzip_truncated.pickle.gz": gzip.compress(pickle.dumps({"segments": []}))[:-6],
        "gzip_truncated.json.gz": gzip.compress(b'{"traceEvents": []}' * 50)[:40],
        "gzip_of_garbage.json.gz": gzip.compress(b"\x00\x01garbage"),
        "json_truncated.json": b'{"traceEvents": [{"ph": "i", "name": "[memory]", "ts": 1',
        "json_wrong_shape.json": b'{"traceEvents": 5}',
        # a trace with no op, no [memory] event and no GPU work (a trace without memory loads: its ops)
        "json_nothing_to_show.json": json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1,
                                                                  "args": {"name": "a"}}]}).encode(),
        "json_array_of_strings.json": b'["a", "b"]',
        "timeline_bad_rows.json": b"[[1, 2, 3]]",
        "csv_wrong_header.csv": b"a,b,c\n1,2,3\n",
        "csv_bad_values.csv": b"id,lower,upper,size\nx,1,zero,5\n",
        "utf16.json": '{"traceEvents": []}'.encode("utf-16"),
    }
    paths = {}
    for name, data in files.items():
        p = tmp / name
        p.write_bytes(data)
        paths[name] = p
    (tmp / "not_a_trace.memlens").mkdir()
    paths["dir_without_manifest"] = tmp / "not_a_trace.memlens"
    future = tmp / "future.memlens"
    future.mkdir()
    (future / "manifest.json").write_text(json.dumps({"format": "memlens-trace", "schema_version": 99,
                                                      "tables": {}}))
    paths["future_schema_version"] = future
    paths["missing"] = tmp / "does_not_exist.pickle"
    return paths


def test_crafted_bad_files_exit_2_with_one_line(tmp_path, capsys):
    for name, path in crafted_corpus(tmp_path).items():
        code, _, err = run_cli(capsys, "info", str(path))
        assert_clean_input_error(code, err, path)


def test_code_running_pickle_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_RunsCode(marker)]]}))
    code, _, err = run_cli(capsys, "info", str(evil))
    assert_clean_input_error(code, err, evil)
    assert "system" in err and "refusing" in err
    assert not marker.exists()
    for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
        evil.write_bytes(pickle.dumps(_RunsCode(marker), protocol=protocol))
        with pytest.raises(Exception, match="refusing"):
            load_pickle(evil)
        assert not marker.exists()


def _mutations(data: bytes, rng: np.random.Generator, count: int) -> list[bytes]:
    """Truncations at fixed fractions plus random byte flips (1-8 bytes each)."""
    out = [data[: int(len(data) * f)] for f in (0.0001, 0.01, 0.3, 0.5, 0.9, 0.999)] + [data[:-1]]
    for _ in range(count):
        buf = bytearray(data)
        for pos in rng.integers(0, len(buf), int(rng.integers(1, 9))):
            buf[pos] ^= int(rng.integers(1, 256))
        out.append(bytes(buf))
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rel, count", [
    ("snapshots/flexgen_opt1.3b_2023format.pickle", 30),
    ("snapshots/cs336_wedsonlin_medium_128_inference.pickle", 12),
    ("kineto/tracelens_h100_bert_small.json.gz", 20),
    ("profiler/hta_memory_timeline.raw.gz", 10),
])
def test_fuzzed_real_traces_never_crash(shared, tmp_path, capsys, rel, count):
    src = shared(rel)
    data = src.read_bytes()
    rng = np.random.default_rng(zlib.crc32(rel.encode()))
    variants = _mutations(data, rng, count)
    if data[:2] == b"\x1f\x8b":  # also mutate the JSON inside, so that the parsers see the damage
        inner = gzip.decompress(data)
        variants += [gzip.compress(v) for v in _mutations(inner, rng, count)]
    refused = 0
    for i, blob in enumerate(variants):
        path = tmp_path / f"mut{i}_{src.name}"
        path.write_bytes(blob)
        code, _, err = run_cli(capsys, "info", str(path))
        assert code in (0, 2), f"variant {i}: {err}"
        if code == 2:
            assert_clean_input_error(code, err, path)
            refused += 1
    assert refused >= 7  # every truncation at least is refused


def test_cli_process_exit_code_and_single_stderr_line(tmp_path):
    """The real console process: exit 2, one stderr line, no traceback, for a truncated snapshot and a
    code-running pickle."""
    marker = tmp_path / "pwned"
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_RunsCode(marker)]]}))
    trunc = tmp_path / "trunc.pickle"
    trunc.write_bytes(pickle.dumps({"segments": [{"device": 0, "blocks": list(range(1000))}]})[:300])
    for path in (bad, trunc):
        proc = subprocess.run([sys.executable, "-m", "memlens", "info", str(path)], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert str(path) in proc.stderr
    assert not marker.exists()
