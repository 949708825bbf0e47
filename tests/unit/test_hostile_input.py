"""Issue 18, items 1-7: memory and time bombs. Each file is built here, at test time, and each must be
refused by the CLI with exit code 2 and one clean line, in a child process whose peak RSS stays under
1 GiB (measured with os.wait4) and which finishes (a 30 s kill guards against hangs)."""
from __future__ import annotations

import gzip
import json
import pickle
import struct
import zlib

import pytest

from hostile import MEMORY_CEILING, assert_refused, run_memlens

FRAME = {"name": "forward", "filename": "/home/u/model.py", "line": 12}


def _snapshot(entries: list) -> dict:
    return {"segments": [], "device_traces": [entries]}


def _entry(addr: int, frames: list, action: str = "alloc") -> dict:
    return {"action": action, "addr": addr, "size": 512, "stream": 0, "time_us": addr, "frames": frames}


# ---------------------------------------------------------------- 1. memo index

def test_huge_long_binput_memo_index_is_refused(tmp_path):
    path = tmp_path / "memo.pickle"
    # PROTO 4, EMPTY_LIST, LONG_BINPUT 2**27, STOP: the C unpickler would size its memo table to 2**28
    path.write_bytes(b"\x80\x04]r" + struct.pack("<I", 1 << 27) + b".")
    assert_refused(run_memlens("info", path), str(path), "memo")


def test_mutated_real_pickle_memo_index_is_refused(tmp_path):
    # a protocol-2 pickle uses LONG_BINPUT for slots >= 256; raise one slot to 2**30 as a corrupt byte would
    entries = [_entry(4096 * i, [dict(FRAME, line=i)]) for i in range(300)]
    data = bytearray(pickle.dumps(_snapshot(entries), protocol=2))
    at = data.find(b"r" + struct.pack("<I", 300))
    assert at > 0
    data[at + 1:at + 5] = struct.pack("<I", 1 << 30)
    path = tmp_path / "mutated.pickle"
    path.write_bytes(bytes(data))
    assert_refused(run_memlens("info", path), str(path))


# ---------------------------------------------------------------- 2. bytearray

def test_bytearray_global_is_refused(tmp_path):
    path = tmp_path / "bytearray.pickle"
    # builtins.bytearray(2**30) in 32 bytes
    path.write_bytes(b"\x80\x04\x8c\x08builtins\x8c\tbytearray\x93J\x00\x00\x00\x40\x85R.")
    assert_refused(run_memlens("info", path), str(path), "bytearray")


# ---------------------------------------------------------------- 3. frames per stack

def test_stack_with_a_million_frames_is_refused(tmp_path):
    frame = dict(FRAME)
    entries = [_entry(4096 * i, [frame] * 1_000_000) for i in range(3)]  # distinct lists, one shared frame
    path = tmp_path / "frames.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(_snapshot(entries), protocol=4), 9))
    assert_refused(run_memlens("info", path), str(path), "MEMLENS_MAX_FRAMES")


def test_frames_limit_can_be_raised(tmp_path):
    frame = dict(FRAME)
    path = tmp_path / "long_stack.pickle"
    path.write_bytes(pickle.dumps(_snapshot([_entry(0, [frame] * 5000)]), protocol=4))
    assert_refused(run_memlens("info", path), "MEMLENS_MAX_FRAMES")
    ok = run_memlens("info", "--json", path, env={"MEMLENS_MAX_FRAMES": "10000"})
    assert ok.code == 0, ok.stderr
    assert json.loads(ok.stdout)["blocks"] == 1


# ---------------------------------------------------------------- 4. decompressed size

def _gzip_bomb(path, prefix: bytes, filler: bytes, total: int) -> None:
    """A gzip file expanding to `prefix` + `filler` repeated up to `total` bytes, written in chunks."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = filler * ((16 << 20) // len(filler))
    with open(path, "wb") as f:
        f.write(comp.compress(prefix))
        written = len(prefix)
        while written < total:
            f.write(comp.compress(chunk))
            written += len(chunk)
        f.write(comp.flush())


def test_gzip_bomb_pickle_over_default_limit(tmp_path):
    path = tmp_path / "bomb.pickle.gz"
    _gzip_bomb(path, b"\x80\x04", b"N", (1 << 30) + (64 << 20))  # NONE opcodes: a valid-looking prefix
    assert path.stat().st_size < 4 << 20
    line = assert_refused(run_memlens("info", path), str(path), "MEMLENS_MAX_DECOMPRESSED")
    assert "1.0 GiB" in line


def test_gzip_bomb_json_and_the_limit_variable(tmp_path):
    path = tmp_path / "bomb.json.gz"
    _gzip_bomb(path, b'{"traceEvents": [', b" ", 64 << 20)
    assert_refused(run_memlens("info", path, env={"MEMLENS_MAX_DECOMPRESSED": "16MiB"}), str(path),
                   "MEMLENS_MAX_DECOMPRESSED")


def test_limit_variable_raises_the_limit(tmp_path):
    entries = [_entry(4096 * i, [dict(FRAME, line=i)]) for i in range(2000)]
    data = pickle.dumps(_snapshot(entries), protocol=4)
    path = tmp_path / "snapshot.pickle.gz"
    path.write_bytes(gzip.compress(data))
    refused = run_memlens("info", path, env={"MEMLENS_MAX_DECOMPRESSED": str(len(data) - 1)})
    assert_refused(refused, "MEMLENS_MAX_DECOMPRESSED")
    ok = run_memlens("info", "--json", path, env={"MEMLENS_MAX_DECOMPRESSED": str(len(data))})
    assert ok.code == 0, ok.stderr
    assert json.loads(ok.stdout)["blocks"] == 2000


def test_bad_limit_variable_is_bad_input(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{}")
    assert_refused(run_memlens("info", path, env={"MEMLENS_MAX_DECOMPRESSED": "lots"}),
                   "MEMLENS_MAX_DECOMPRESSED")


# ---------------------------------------------------------------- 7. nesting

@pytest.mark.parametrize("depth", [150, 200_000])
def test_deeply_nested_pickle(tmp_path, depth):
    path = tmp_path / "nested.pickle"
    # EMPTY_LIST x depth, APPEND x (depth - 1): lists nested `depth` deep, built without MARKs
    path.write_bytes(b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b".")
    assert_refused(run_memlens("info", path), str(path), "nested")


def test_deeply_nested_pickle_with_marks(tmp_path):
    path = tmp_path / "marks.pickle"
    depth = 100_000
    path.write_bytes(b"\x80\x02" + b"(" * depth + b"t" * depth + b".")
    assert_refused(run_memlens("info", path), str(path))


@pytest.mark.parametrize("depth", [150, 100_000])
def test_deeply_nested_json(tmp_path, depth):
    path = tmp_path / "nested.json"
    path.write_text('{"traceEvents": [' + "[" * depth + "]" * depth + "]}")
    assert_refused(run_memlens("info", path), str(path), "nested")


def test_memory_ceiling_is_meaningful():
    # the ceiling must sit well above an ordinary run, or the checks above would be vacuous
    assert MEMORY_CEILING == 1 << 30


def test_frames_limit_holds_for_in_memory_snapshots():
    # the C-unpickler path and snapshot_to_trace(dict) reach the interner without the streaming check
    from memlens.errors import InputError
    from memlens.io.snapshot.importer import snapshot_to_trace
    frame = dict(FRAME)
    with pytest.raises(InputError, match="MEMLENS_MAX_FRAMES"):
        snapshot_to_trace(_snapshot([_entry(0, [frame] * 5000)]))


def test_gzip_bomb_is_stopped_early_by_its_ratio(tmp_path):
    path = tmp_path / "ratio.pickle.gz"
    _gzip_bomb(path, b"\x80\x04", b"N", 256 << 20)  # under the 1 GiB limit, but ~1000x
    outcome = run_memlens("info", path, env={"MEMLENS_MAX_DECOMPRESSED": "1GiB"})
    assert_refused(outcome, "500x", "MEMLENS_MAX_DECOMPRESSED")
    # raising the limit raises the point where the ratio is judged (256 MiB < 8 GiB / 16); the flood of
    # NONE opcodes is then refused by the parser's bound on loose objects, still without the memory
    outcome = run_memlens("info", path, env={"MEMLENS_MAX_DECOMPRESSED": "8GiB"})
    assert_refused(outcome, "loose objects")
