"""A buffer-lifetime CSV converted a chunk at a time (`convert_lifetimes_csv`) is the trace `import_lifetimes_csv`
builds in memory, and converting it holds no more memory for a longer file."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from memlens.analysis.peak import peak_breakdown
from memlens.errors import InputError
from memlens.io.lifetimes_csv import convert_lifetimes_csv, import_lifetimes_csv
from memlens.trace.read import load_trace


def write_csv(path, n: int, seed: int = 0, offsets: bool = False) -> pd.DataFrame:
    """`n` buffers with integer lifetimes (many equal times: frees and allocs at the same instant)."""
    rng = np.random.default_rng(seed)
    lower = rng.integers(0, max(n // 3, 1), n)
    df = pd.DataFrame({"id": [f"buf{i}" for i in range(n)], "lower": lower, "upper": lower + rng.integers(0, 200, n),
                       "size": rng.integers(1, 1 << 20, n), "alignment": 64})
    if offsets:
        df["offset"] = pd.array(np.where(rng.random(n) < 0.2, None, rng.integers(0, 1 << 30, n)), dtype="Int64")
    df.to_csv(path, index=False)
    return df


@pytest.mark.parametrize("offsets", [False, True])
def test_chunked_conversion_equals_the_in_memory_import(tmp_path, offsets):
    src = tmp_path / "b.csv"
    write_csv(src, 5000, offsets=offsets)
    got = load_trace(convert_lifetimes_csv(src, tmp_path / "b.memlens", rows_per_group=700))
    want = import_lifetimes_csv(src)
    assert got.summary() == want.summary()
    # the same blocks; the seq values differ (spaced, not ranks) but order every alloc / free the same way
    pd.testing.assert_frame_equal(got.blocks.drop(columns=["alloc_seq", "free_seq"]),
                                  want.blocks.drop(columns=["alloc_seq", "free_seq"]))
    a, b = got.live_bytes("plan"), want.live_bytes("plan")
    np.testing.assert_array_equal(a["block_id"].to_numpy(), b["block_id"].to_numpy())
    np.testing.assert_array_equal(a["live"].to_numpy(), b["live"].to_numpy())
    pa, pb = peak_breakdown(got)["plan"], peak_breakdown(want)["plan"]
    assert (pa.peak_bytes, pa.peak_ns, pa.peak_block_id, pa.live_blocks) == \
        (pb.peak_bytes, pb.peak_ns, pb.peak_block_id, pb.live_blocks)


def test_bad_rows_in_later_chunks_name_their_line_and_leave_nothing(tmp_path):
    src = tmp_path / "b.csv"
    df = write_csv(src, 3000)
    df.loc[2500, "id"] = "buf7"  # a duplicate 5 chunks away from the first
    df.to_csv(src, index=False)
    dst = tmp_path / "b.memlens"
    with pytest.raises(InputError, match="duplicate buffer id 'buf7'"):
        convert_lifetimes_csv(src, dst, rows_per_group=500)
    df.loc[2500, "id"] = "fine"
    df["size"] = df["size"].astype(object)
    df.loc[1502, "size"] = "x"  # file line 1504 (header on line 1)
    df.to_csv(src, index=False)
    with pytest.raises(InputError, match="non-integer value on line 1504"):
        convert_lifetimes_csv(src, dst, rows_per_group=500)
    assert not dst.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["b.csv"]


def test_import_command_converts_a_large_csv_in_chunks(tmp_path, monkeypatch, capsys):
    from memlens.cli import main
    from memlens.commands import import_
    src = tmp_path / "b.csv"
    write_csv(src, 2000)
    monkeypatch.setattr(import_, "STREAM_ABOVE_BYTES", 1)  # every CSV counts as large
    dst = tmp_path / "b.memlens"
    assert main(["import", str(src), "-o", str(dst), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["streamed"] and doc["blocks"] == 2000
    assert load_trace(dst).summary() == import_lifetimes_csv(src).summary()


CHILD = """
import sys
from memlens.io.lifetimes_csv import convert_lifetimes_csv
convert_lifetimes_csv(sys.argv[1], sys.argv[2], rows_per_group=50_000)
print([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1])
"""


def test_conversion_memory_does_not_grow_with_the_file(tmp_path):
    """Child VmHWM for a 4x longer CSV: flat (8 bytes per row for the duplicate check), where the in-memory
    import holds ~200 bytes per buffer (+120 MB between these two)."""
    hwm = {}
    for n in (200_000, 800_000):
        src = tmp_path / f"b{n}.csv"
        write_csv(src, n, seed=n)
        proc = subprocess.run([sys.executable, "-c", CHILD, str(src), str(tmp_path / f"b{n}.memlens")],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        hwm[n] = int(proc.stdout.split()[-1]) * 1024
    assert hwm[800_000] - hwm[200_000] < 30 << 20, hwm
