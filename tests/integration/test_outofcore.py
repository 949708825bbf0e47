"""The out-of-core engine (memlens.analysis.outofcore) answers exactly what the in-memory engine answers."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from memlens.analysis.ati import access_intervals, ati_stats
from memlens.analysis.ati import ati_only
from memlens.analysis.distributions import log_histogram
from memlens.analysis.outliers import outliers
from memlens.errors import InputError
from memlens.trace.partitioned import PartitionedTraceWriter, save_partitioned
from memlens.trace.read import load_trace
from memlens.trace import Trace

pytest.importorskip("dask")
from memlens.analysis.outofcore import engine, quantiles as qmod  # noqa: E402
from memlens.analysis.outofcore.choose import choose_engine  # noqa: E402
from memlens.analysis.outofcore.runner import Runner  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_traces" / "transformer_train_adamw.memlens"


def cli(*args) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "memlens", *args], capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def two_device_trace(seed: int = 0, n_blocks: int = 400, n_acc: int = 5000) -> Trace:
    """Random blocks on two devices, some alive before recording / at the end, accesses (with repeated
    timestamps, and in-place read+write rows) inside and a few outside their lifetimes."""
    rng = np.random.default_rng(seed)
    alloc = rng.integers(0, 1_000_000, n_blocks)
    life = rng.integers(0, 400_000, n_blocks)
    blocks = pd.DataFrame({"block_id": np.arange(n_blocks) * 7 + 3,  # sparse ids
                           "device": np.where(rng.random(n_blocks) < 0.5, "cuda:0", "cuda:1"),
                           "size": rng.integers(1, 1 << 24, n_blocks),
                           "alloc_ns": pd.array(alloc, dtype="Int64"), "free_ns": pd.array(alloc + life, dtype="Int64"),
                           "category": rng.choice(["activation", "parameter", "gradient"], n_blocks),
                           "source": "dispatch"})
    blocks.loc[rng.random(n_blocks) < 0.05, "alloc_ns"] = pd.NA
    blocks.loc[rng.random(n_blocks) < 0.05, "free_ns"] = pd.NA
    blocks["allocated_before"] = blocks["alloc_ns"].isna()
    which = rng.integers(0, n_blocks, n_acc)
    lo = blocks["alloc_ns"].fillna(0).to_numpy(np.int64)[which]
    hi = blocks["free_ns"].fillna(1_400_000).to_numpy(np.int64)[which]
    t = lo + (rng.random(n_acc) * (hi - lo + 1)).astype(np.int64)
    t[:20] += 10_000_000  # a recorder's clock skew: outside the lifetime
    t = np.round(t, -3)  # equal timestamps happen
    order = np.argsort(t, kind="stable")
    acc = pd.DataFrame({"block_id": blocks["block_id"].to_numpy()[which][order], "t_ns": t[order],
                        "op_id": (t[order] // 1000), "is_write": rng.random(n_acc) < 0.3})
    dup = acc.iloc[::50].copy()
    dup["is_write"] = True  # the same op writes what it read: one event, not two
    acc = pd.concat([acc, dup]).sort_values(["t_ns"], kind="stable").reset_index(drop=True)
    return Trace.from_tables(blocks, accesses=acc, metadata={"source_kind": "synthetic"})


def reference_ati(trace, device=None) -> dict:
    iv = access_intervals(trace, device=device)
    doc = ati_stats(iv)
    doc["histogram"] = log_histogram(ati_only(iv)["length_ns"].to_numpy(), per_decade=1)  # the ATI only
    doc["accesses_outside_lifetime"] = iv.attrs["accesses_outside_lifetime"]
    doc["overlapping_ops"] = iv.attrs["overlapping_ops"]
    return doc


def assert_same_ati(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        if k == "histogram":
            pd.testing.assert_frame_equal(got[k], v)
        elif k == "std_ns" and v is not None:
            assert got[k] == pytest.approx(v, rel=1e-12)  # a sum of squares added in another order
        elif k == "edges":  # the lifetime edges: exact quantiles too, std to the last bits
            assert set(got[k]) == set(v)
            for kind, e in v.items():
                g = dict(got[k][kind])
                e = dict(e)
                g_std, e_std = g.pop("std_ns"), e.pop("std_ns")
                assert g == e, kind
                assert (g_std is None and e_std is None) or g_std == pytest.approx(e_std, rel=1e-12), kind
        else:
            assert got[k] == v, k


# ---- exact quantiles ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_exact_quantiles_match_numpy_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 20_000))
    values = rng.lognormal(9, 4, n).astype(np.int64)
    values[: n // 3] = rng.integers(0, 3, n // 3)  # many ties at 0..2 ns, as zero-length intervals are
    pieces = np.array_split(rng.permutation(values), int(rng.integers(1, 7)))
    qs = (0.0, 0.001, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0)
    counts = sum(qmod.bin_counts(p) for p in pieces)
    needed = qmod.needed_bins(counts, qs)
    got = qmod.exact_quantiles(counts, [qmod.values_in_bins(p, needed) for p in pieces], qs)
    want = np.quantile(values.astype(np.float64), qs)
    assert [got[q] for q in qs] == list(want)


def test_fine_bins_are_monotone_and_narrow():
    v = np.unique(np.concatenate([np.arange(5000), (np.logspace(3, 18, 5000)).astype(np.int64)]))
    b = qmod.fine_bin(v)
    assert (np.diff(b) >= 0).all() and b.max() < qmod.N_BINS
    # a bin above the exact range spans at most 1/512 of its values (so pass 2 reads few values)
    for k in np.unique(b[v >= 1024])[:: 97]:
        inside = v[b == k]
        assert inside.max() - inside.min() <= inside.min() / 512 + 1


# ---- identity with the in-memory engine -----------------------------------------------------------
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    trace = two_device_trace()
    path = save_partitioned(trace, tmp_path_factory.mktemp("ooc") / "two.memlens", rows_per_group=700)
    return trace, path


@pytest.mark.parametrize("rows_per_bucket", [400, 1_000_000])
@pytest.mark.parametrize("device", [None, "cuda:1"])
def test_ati_identical_to_in_memory(saved, rows_per_bucket, device):
    trace, path = saved
    with Runner(workers=2) as runner:
        got = engine.ati(path, runner, device=device, rows_per_bucket=rows_per_bucket)
    assert_same_ati(got, reference_ati(trace, device))
    if device is None:
        assert got["accesses_outside_lifetime"] >= 20  # the skewed rows the trace was built with


@pytest.mark.parametrize("priority", ["size_x_idle", "doa", "aoa", "wdoa"])
def test_outliers_identical_to_in_memory(saved, priority):
    trace, path = saved
    with Runner(workers=2) as runner:
        got, summary = engine.outliers(path, runner, "pcie4", top=25, priority=priority, min_size=0,
                                       rows_per_bucket=500)
    want = outliers(trace, "pcie4", top=25, priority=priority, min_size=0)
    assert len(want) > 0
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True))
    from memlens.analysis.outliers import bandwidth_filter, filter_summary
    ref = filter_summary(bandwidth_filter(trace, "pcie4"))
    for k in ("intervals", "swappable", "blocks_with_swappable"):
        assert summary[k] == ref[k]
    assert summary["swappable_share"] == pytest.approx(ref["swappable_share"], rel=1e-12)


def test_summary_identical_to_in_memory(saved, tmp_path):
    trace, path = saved
    with Runner(workers=2) as runner:
        got = engine.summary(path, runner)
    assert got == load_trace(path).summary()
    # the peaks checked independently: a walk over alloc/free events in time order
    lo, _ = trace.time_span_ns()
    for dev in ("cuda:0", "cuda:1"):
        b = trace.blocks[trace.blocks["device"] == dev]
        events = [(int(r.alloc_ns) if pd.notna(r.alloc_ns) else lo, 1, r.size) for r in b.itertuples()]
        events += [(int(r.free_ns), 0, -r.size) for r in b.itertuples() if pd.notna(r.free_ns)]
        live, peak = 0, 0
        for _, _, delta in sorted(events, key=lambda e: (e[0], e[1])):
            live += delta
            peak = max(peak, live)
        assert got["peak_live_bytes"][dev] == peak


def test_recorded_trace_through_the_cli(tmp_path):
    """A real memlens recording (torch, small transformer): `ati`/`outliers`/`info` --json are the same
    documents with either engine."""
    if not SAMPLE.exists():
        pytest.skip("sample trace absent")
    path = save_partitioned(load_trace(SAMPLE), tmp_path / "rec.memlens", rows_per_group=1000)
    for verb in (["ati"], ["outliers", "--top", "30"], ["info"]):
        docs = []
        for eng in ("memory", "dask"):
            rc, out, err = cli(*verb, str(path), "--json", "--engine", eng, "--workers", "2")
            assert rc == 0, err
            docs.append(json.loads(out))
        if verb == ["ati"]:  # standard deviations are sums in another order: equal to the last bits
            assert docs[1].pop("std_ns") == pytest.approx(docs[0].pop("std_ns"), rel=1e-12)
            for kind, e in docs[0]["edges"].items():
                got = docs[1]["edges"][kind].pop("std_ns")
                assert got == pytest.approx(e.pop("std_ns"), rel=1e-12), kind
        if verb == ["info"]:  # the peak story (cause, sites, phases) needs the whole trace: memory engine only
            story = {"peak", "iterations", "iteration_source", "phases"}
            assert set(docs[0]) - set(docs[1]) == story
            docs[0] = {k: v for k, v in docs[0].items() if k not in story}
        assert docs[0] == docs[1], verb


def test_local_cluster_through_scheduler_option(saved):
    distributed = pytest.importorskip("distributed")
    from memlens.cli import main
    trace, path = saved
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None) as lc:
        import contextlib
        import io
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["ati", str(path), "--json", "--scheduler", lc.scheduler_address]) == 0
    doc = json.loads(buf.getvalue())
    want = reference_ati(trace)
    assert doc["p99_ns"] == want["p99_ns"] and doc["count"] == want["count"] and doc["p50_ns"] == want["p50_ns"]
    assert doc["histogram"] == want["histogram"].to_dict(orient="records")


def test_unreachable_scheduler_is_bad_input(saved):
    rc, _, err = cli("ati", str(saved[1]), "--scheduler", "tcp://127.0.0.1:9", "--json")
    assert rc == 2 and "cannot reach the dask scheduler" in err and "Traceback" not in err


def test_dask_engine_needs_a_saved_trace_and_accesses(tmp_path, shared):
    pickle = shared("snapshots/decomfl_memory.pickle")
    rc, _, err = cli("ati", str(pickle), "--engine", "dask")
    assert rc == 2 and "memlens import" in err
    # auto on a file that is not a saved trace stays in memory (and says why it cannot compute ATI)
    rc, _, err = cli("ati", str(pickle), "--engine", "auto")
    assert rc == 2 and "per-access data" in err
    from memlens.io import load
    saved = save_partitioned(load(pickle), tmp_path / "snap.memlens")
    rc, out, err = cli("info", str(saved), "--engine", "dask", "--json")
    assert rc == 0 and json.loads(out) == load_trace(saved).summary()
    rc, _, err = cli("outliers", str(saved), "--engine", "dask")
    assert rc == 2 and "per-access data" in err


def test_auto_picks_dask_when_memory_is_short(saved, monkeypatch):
    from memlens.analysis.outofcore import choose
    _, path = saved
    monkeypatch.setattr(choose, "available_memory", lambda: 100 << 30)
    assert choose_engine(path, "auto") == "memory"
    monkeypatch.setattr(choose, "available_memory", lambda: 1 << 20)  # 1 MiB left: the trace needs more
    assert choose_engine(path, "auto") == "dask"
    with pytest.raises(InputError):
        choose_engine(path, "gpu")


def test_import_memlens_does_not_import_dask():
    code = "import memlens, sys; memlens.load_many; print('dask' in sys.modules, 'distributed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ---- the partitioned writer -----------------------------------------------------------------------
def test_partitioned_writer_round_trip_and_row_groups(tmp_path):
    import pyarrow.parquet as pq
    trace = two_device_trace(seed=3)
    path = save_partitioned(trace, tmp_path / "t.memlens", rows_per_group=1000)
    assert pq.ParquetFile(path / "accesses.parquet").metadata.num_row_groups == -(-len(trace.accesses) // 1000)
    back = load_trace(path)
    pd.testing.assert_frame_equal(back.blocks, trace.blocks)
    pd.testing.assert_frame_equal(back.accesses, trace.accesses)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["tables"]["accesses"]["sorted_by"] == "t_ns"


def test_partitioned_writer_rejects_time_travel_and_leaves_nothing(tmp_path):
    target = tmp_path / "x.memlens"
    with pytest.raises(InputError, match="time order"):
        with PartitionedTraceWriter(target, rows_per_group=10) as w:
            w.add("blocks", pd.DataFrame({"block_id": [0], "device": "cpu", "size": [8], "alloc_ns": [0]}))
            w.add("accesses", pd.DataFrame({"block_id": [0, 0], "t_ns": [5, 9], "op_id": [0, 1], "is_write": False}))
            w.add("accesses", pd.DataFrame({"block_id": [0], "t_ns": [7], "op_id": [2], "is_write": False}))
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_corrupt_table_is_bad_input(saved, tmp_path):
    import shutil
    _, path = saved
    broken = tmp_path / "broken.memlens"
    shutil.copytree(path, broken)
    (broken / "accesses.parquet").write_bytes(b"PAR1 not really")
    rc, _, err = cli("ati", str(broken), "--engine", "dask")
    assert rc == 2 and "accesses.parquet" in err and "Traceback" not in err


def test_whole_trace_commands_refuse_with_the_memory_they_need(saved, monkeypatch, tmp_path, capsys):
    """Swap planning, allocator replay and the offset planner need every block at once: a saved trace larger
    than the memory available is refused before loading, with one line naming the trace's size and the memory
    figures, as is `report --engine memory` (the report's auto engine goes out of core instead:
    tests/integration/test_report_outofcore.py); with enough memory they run as before."""
    from memlens.analysis.outofcore import choose
    from memlens.cli import main
    trace, path = saved
    n_acc = len(trace.accesses)
    out = tmp_path / "r.html"
    monkeypatch.setattr(choose, "available_memory", lambda: 1 << 20)  # 1 MiB free: the trace needs more
    for argv in (["swap", str(path)], ["simulate", str(path)], ["plan", str(path)],
                 ["report", str(path), "--engine", "memory", "-o", str(out)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert "needs the whole trace in memory" in err and "1.0 MiB available" in err, (argv, err)
        assert f"{n_acc:,} accesses" in err and len(err.splitlines()) == 1
    assert not out.exists()
    monkeypatch.setattr(choose, "available_memory", lambda: 100 << 30)
    assert main(["swap", str(path), "--json"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), dict)  # the plan, as before
