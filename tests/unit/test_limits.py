"""The input limits (memlens/limits.py) and the bounded gunzip (memlens/io/gzipfile.py), at their edges.

Each expectation is derived from the documented rule, not from the code: the limit variables' defaults and
parsing (sizes for MEMLENS_MAX_DECOMPRESSED, whole positive numbers for the others), nesting counted from 1
at the outermost container with a container exactly at the limit accepted, and a gzip input that expands to
exactly the limit accepted while one byte more is refused.
"""
from __future__ import annotations

import gzip
import io
import os
import zlib

import pytest

from memlens import limits
from memlens.errors import InputError
from memlens.io.gzipfile import MAX_RATIO, gunzip_limited

LIMIT_VARS = ("MEMLENS_MAX_DECOMPRESSED", "MEMLENS_MAX_FRAMES", "MEMLENS_MAX_NESTING")


@pytest.fixture(autouse=True)
def _no_limit_variables(monkeypatch):
    for name in LIMIT_VARS:
        monkeypatch.delenv(name, raising=False)


def test_documented_defaults():
    assert limits.max_decompressed() == 1024 ** 3
    assert limits.max_frames() == 4096
    assert limits.max_nesting() == 100
    doc = limits.__doc__
    assert "``1GiB``" in doc and "``4096``" in doc and "``100``" in doc


@pytest.mark.parametrize("raw, expected", [("4GiB", 4 * 1024 ** 3), (" 512MiB ", 512 * 1024 ** 2), ("1", 1),
                                           ("", 1024 ** 3), ("   ", 1024 ** 3)])
def test_size_variable_parsed_as_a_size(monkeypatch, raw, expected):
    monkeypatch.setenv("MEMLENS_MAX_DECOMPRESSED", raw)
    assert limits.max_decompressed() == expected


@pytest.mark.parametrize("name, reader", [("MEMLENS_MAX_FRAMES", limits.max_frames),
                                          ("MEMLENS_MAX_NESTING", limits.max_nesting)])
def test_count_variables_take_whole_numbers(monkeypatch, name, reader):
    monkeypatch.setenv(name, " 7 ")
    assert reader() == 7
    monkeypatch.setenv(name, "1")
    assert reader() == 1
    for bad in ("4GiB", "2.5", "many"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(InputError) as err:
            reader()
        assert err.value.message == f"environment variable {name}={bad!r} is not a whole number"


@pytest.mark.parametrize("name", LIMIT_VARS)
@pytest.mark.parametrize("raw", ["0", "-1"])
def test_limits_must_be_positive(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(InputError) as err:
        limits.check_environment()
    # a negative size is not a size at all (parse_bytes refuses it); every other case says "positive"
    expected = "is not a size" if (name, raw) == ("MEMLENS_MAX_DECOMPRESSED", "-1") else "must be positive"
    assert err.value.message.startswith(f"environment variable {name}={raw!r} ")
    assert err.value.message.endswith(expected if expected == "must be positive" else "is not a size (e.g. 4GiB)")


def test_size_variable_nonsense_names_the_variable(monkeypatch):
    monkeypatch.setenv("MEMLENS_MAX_DECOMPRESSED", "lots")
    with pytest.raises(InputError) as err:
        limits.check_environment()
    assert err.value.message == "environment variable MEMLENS_MAX_DECOMPRESSED='lots' is not a size (e.g. 4GiB)"


def test_too_big_names_the_limit_and_the_variable(monkeypatch):
    monkeypatch.setenv("MEMLENS_MAX_DECOMPRESSED", "3MiB")
    message = limits.too_big("the data expands past")
    assert message.startswith("the data expands past the limit of 3")
    assert message.endswith("(a decompression bomb? set MEMLENS_MAX_DECOMPRESSED, e.g. "
                            "MEMLENS_MAX_DECOMPRESSED=8GiB, to read it anyway)")


def _nested(depth: int, kind=list):
    """`depth` containers of `kind`, one inside the other (depth 1: an empty container)."""
    obj = kind()
    for _ in range(depth - 1):
        obj = kind([obj]) if kind is not dict else {"k": obj}
    return obj


@pytest.mark.parametrize("kind", [list, tuple, dict, frozenset])
def test_nesting_exactly_at_the_limit_is_accepted(kind):
    limits.check_nesting(_nested(5, kind), limit=5)
    with pytest.raises(InputError, match="more than 5 deep"):
        limits.check_nesting(_nested(6, kind), limit=5)


def test_nesting_of_scalars_and_sets_of_scalars():
    limits.check_nesting(42, limit=1)
    limits.check_nesting({1, 2, 3}, limit=1)
    with pytest.raises(InputError):
        limits.check_nesting([{1, 2}], limit=1)


def test_a_shared_container_is_checked_at_its_deepest_place():
    shared = _nested(3)                      # 3 deep on its own
    shallow_then_deep = [shared, [[shared]]]  # at depth 2 (total 4) and at depth 4 (total 6)
    limits.check_nesting(shallow_then_deep, limit=6)
    with pytest.raises(InputError):
        limits.check_nesting(shallow_then_deep, limit=5)
    deep_first = [[[shared]], shared]         # the deep place met first in the walk order, too
    with pytest.raises(InputError):
        limits.check_nesting(deep_first, limit=5)


def test_nesting_limit_from_the_environment(monkeypatch):
    monkeypatch.setenv("MEMLENS_MAX_NESTING", "3")
    limits.check_nesting(_nested(3))
    with pytest.raises(InputError) as err:
        limits.check_nesting(_nested(4), where="file.pickle")
    assert str(err.value) == "file.pickle: containers nested more than 3 deep (set MEMLENS_MAX_NESTING to raise the limit)"


def test_a_container_seen_again_does_not_end_the_walk():
    shared = [1]
    too_deep = _nested(5)
    # the walk pops the last child first: `shared` twice (the second time already seen), then `too_deep`
    with pytest.raises(InputError):
        limits.check_nesting([too_deep, shared, shared], limit=4)


def test_each_container_is_walked_once_however_often_it_is_shared():
    # 60 levels, each holding the next one twice: 2**60 paths, 60 containers; a walk that revisited a
    # container met again at the same depth would never finish
    node = []
    for _ in range(60):
        node = [node, node]
    limits.check_nesting(node, limit=100)
    with pytest.raises(InputError):
        limits.check_nesting(node, limit=50)


def _gz(data: bytes, level: int = 6) -> io.BytesIO:
    return io.BytesIO(gzip.compress(data, compresslevel=level))


def test_gunzip_exactly_the_limit_is_accepted_one_byte_more_is_refused(monkeypatch):
    payload = os.urandom(5000)              # incompressible: the ratio guard stays out of the way
    monkeypatch.setenv("MEMLENS_MAX_DECOMPRESSED", str(len(payload)))
    assert bytes(gunzip_limited(_gz(payload), chunk=997)) == payload
    monkeypatch.setenv("MEMLENS_MAX_DECOMPRESSED", str(len(payload) - 1))
    with pytest.raises(InputError) as err:
        gunzip_limited(_gz(payload), path="x.json.gz", chunk=997)
    assert err.value.message == limits.too_big("gzip data expands past")
    assert err.value.path == "x.json.gz"


def test_gunzip_reads_every_member_from_where_the_file_stands():
    first, second = os.urandom(3000), b"tail" * 100
    f = io.BytesIO(b"HEADER" + gzip.compress(first) + gzip.compress(second))
    f.seek(len(b"HEADER"))
    assert bytes(gunzip_limited(f, chunk=1000)) == first + second


def test_gunzip_ratio_guard(monkeypatch):
    limit = 1 << 20
    monkeypatch.setenv("MEMLENS_MAX_DECOMPRESSED", str(limit))
    # compresses ~1000x but stays at or below limit/16: the guard does not look yet
    small = b"\0" * (limit // 16)
    assert len(gunzip_limited(_gz(small, 9), chunk=4096)) == limit // 16
    # compresses ~1000x and goes past limit/16 (still under the limit): a bomb, refused early
    big = b"\0" * (limit // 2)
    assert len(gzip.compress(big, 9)) * MAX_RATIO < len(big)
    with pytest.raises(InputError) as err:
        gunzip_limited(_gz(big, 9), chunk=4096)
    assert err.value.message == limits.too_big(f"gzip data expands more than {MAX_RATIO}x and would go past")
    # the ratio is of the bytes read from where the gzip data starts, not from the file's start
    f = io.BytesIO(os.urandom(4 << 20) + gzip.compress(big, 9))
    f.seek(4 << 20)
    with pytest.raises(InputError, match=f"more than {MAX_RATIO}x"):
        gunzip_limited(f, chunk=4096)
    # past limit/16 but at an ordinary ratio: read whole
    ordinary = os.urandom(limit // 4)
    assert bytes(gunzip_limited(_gz(ordinary), chunk=4096)) == ordinary


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "not gzip"])
def test_gunzip_damaged_input_is_bad_input(damage):
    raw = gzip.compress(os.urandom(4000))
    if damage == "truncated":
        raw = raw[: len(raw) // 2]
    elif damage == "corrupt":
        raw = raw[:20] + bytes(b ^ 0xFF for b in raw[20:40]) + raw[40:]
    else:
        raw = b"plain text, not gzip at all"
    with pytest.raises(InputError) as err:
        gunzip_limited(io.BytesIO(raw), path="broken.json.gz")
    assert err.value.message.startswith("gzip data is corrupt or truncated (") and err.value.message.endswith(")")
    assert err.value.path == "broken.json.gz"


def test_zlib_errors_are_covered():
    # the damaged-input test relies on these being the exceptions gzip raises
    with pytest.raises((OSError, EOFError, zlib.error)):
        gzip.decompress(b"\x1f\x8b" + b"\0" * 10)


def test_streamed_snapshot_check_refuses_a_stack_ref_anywhere_but_as_frames(monkeypatch):
    from memlens.io.bounded_text import PlaceholderSeen
    from memlens.io.snapshot.frames import StackRef
    from memlens.io.snapshot.limits import check_streamed as check
    from memlens.io.snapshot.stream import EntryColumns

    def check_streamed(obj):
        check(obj, columns_type=EntryColumns)

    ref = StackRef(3)
    cols = EntryColumns()
    check_streamed({"segments": [{"blocks": [{"frames": ref, "size": 8}]}], "device_traces": [cols]})
    for bad in ({"frames": StackRef(4), "name": ref}, {"a": [ref]}, {ref: 1}, (1, ref), [[{"x": {ref}}]]):
        with pytest.raises(PlaceholderSeen):
            check_streamed({"segments": [bad]})
    bad_cols = EntryColumns()
    bad_cols.names[next(iter(bad_cols.names))].append(ref)
    with pytest.raises(PlaceholderSeen):
        check_streamed({"device_traces": [[bad_cols]]})
    # the nesting limit holds on the same walk, and an EntryColumns counts as one level below its list
    monkeypatch.setenv("MEMLENS_MAX_NESTING", "3")
    check_streamed({"device_traces": [cols]})
    with pytest.raises(InputError, match="nested more than 3 deep"):
        check_streamed({"device_traces": [[[cols]]]})
