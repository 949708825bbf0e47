"""Issue 26 item 7: small hand-made hostile files beyond pickles: a FIFO, a table whose footer claims a
billion-row-like table, int64-max sizes for `plan`, wrong-signed memory-timeline rows, control characters
from a snapshot in `info`'s text. Each ends with exit 2 and one line naming the file (or, for `info`, with
its text escaped), in bounded time and memory."""
from __future__ import annotations

import hashlib
import json
import os
import pickle

import numpy as np
import pandas as pd
import pytest

from hostile import assert_refused, run_memlens


def test_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "trace.pickle"
    os.mkfifo(fifo)  # opening it would block until a writer came
    for argv in (["info", fifo], ["import", fifo, "-o", tmp_path / "x.memlens"], ["plan", fifo]):
        assert_refused(run_memlens(*argv), str(fifo), "FIFO")


def _claiming_table(path, rows: int):
    """A saved trace whose blocks.parquet (and manifest) claim `rows` rows of nulls: a few MB on disk and
    nearly nothing in the footer's uncompressed sizes, gigabytes once read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memlens.trace import Trace
    blocks = pd.DataFrame({"block_id": np.arange(3), "device": "cuda:0", "size": [4096, 8192, 512],
                           "alloc_ns": [0, 10, 20], "free_ns": [30, 40, 50]})
    Trace.from_tables(blocks).save(path)
    schema = pq.read_schema(path / "blocks.parquet").remove_metadata()
    pq.write_table(pa.table({f.name: pa.nulls(rows, f.type) for f in schema}, schema=schema),
                   path / "blocks.parquet", row_group_size=rows)
    manifest = json.loads((path / "manifest.json").read_text())
    data = (path / "blocks.parquet").read_bytes()
    manifest["tables"]["blocks"].update(bytes=len(data), rows=rows, sha256=hashlib.sha256(data).hexdigest())
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("engine", [[], ["--engine", "memory"]])
def test_table_claiming_too_many_rows_is_refused_before_reading(tmp_path, engine):
    path = tmp_path / "huge.memlens"
    _claiming_table(path, 20_000_000)  # 17 columns: at least 2.7 GB once read, past the 1 GiB default
    assert_refused(run_memlens("info", path, *engine), "blocks.parquet", "rows")


def test_plan_with_int64_max_sizes(tmp_path):
    csv = tmp_path / "buffers.csv"
    csv.write_text(f"id,lower,upper,size\n0,0,10,{2**63 - 1}\n1,5,15,1024\n")
    assert_refused(run_memlens("plan", csv), str(csv), "int64")
    csv.write_text(f"id,lower,upper,size,alignment\n0,0,10,16,{2**63 - 1}\n")
    assert_refused(run_memlens("plan", csv), str(csv), "int64")


@pytest.mark.parametrize("rows, needle", [
    ([[0, 1, 2], [[0] * 8, [0, 512] + [0] * 6, [0, -512] + [0] * 6]], "negative"),  # coalesced
    ([[1000, 2, -512, 4], [2000, 4, 512, 4]], "CREATE"),  # a raw export of two rows, signs swapped
    ([[1000, 2, 512, 4], [2000, 4, 512, 4]], "DESTROY"),
])
def test_memory_timeline_rows_with_wrong_signs(tmp_path, rows, needle):
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(rows))
    assert_refused(run_memlens("info", path), str(path), needle)


def test_info_escapes_control_characters_from_the_file(tmp_path):
    frames = [{"name": "evil\x1b[2J\x1b]0;owned\x07", "filename": "/home/u/m\x1b[31m.py", "line": 3}]
    trace = [{"action": a, "addr": 4096, "size": 512, "stream": 0, "time_us": i, "frames": frames}
             for i, a in enumerate(["alloc", "weird\x1b[5m\u202eaction", "free_completed"])]
    path = tmp_path / "ctl.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    out = run_memlens("info", path)
    assert out.code == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\u202e" not in out.stdout
    assert "evil\\x1b[2J" in out.stdout and "weird\\x1b[5m\\u202eaction" in out.stdout
