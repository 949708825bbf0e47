"""Import speed and memory on a synthetic large CUDA memory snapshot.

Generates a snapshot shaped like torch 2.5+ ``_dump_snapshot`` output (per-entry dicts with ``time_us``,
``compile_context``, ``user_metadata`` and 20-40 frames drawn from a few hundred shared frame dicts; every
entry gets its own frames list, as torch writes them) until the pickle reaches ``--mb`` megabytes, then
imports it in a fresh child process and prints events/s, wall time and peak memory as a ratio of the
file size (the target: under 30 s and at most 3x the file size for 100 MB).

Peak memory is reported two ways: Python heap peak (tracemalloc, in a separate run since it slows the
code it watches; includes numpy/pandas buffers) and the timed child's peak RSS above its RSS right before
the import (includes allocator slack and the pages of the mmap'ed file it has read, which the kernel can
drop). The baseline, measured the same way, is plain ``pickle.load`` of the file.

    python benchmarks/import_speed.py --mb 100
    python benchmarks/import_speed.py --mb 100 --save   # import + save vs convert_snapshot (memlens import)
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_snapshot(target_bytes: int, seed: int = 0) -> dict:
    """A synthetic snapshot whose pickle is about `target_bytes` long (one device)."""
    rng = np.random.default_rng(seed)
    frames = [{"name": f"fn_{i}(at::Tensor const&)", "filename": f"/src/module_{i % 37}.cpp", "line": int(i)}
              for i in range(600)]
    stacks = [[frames[j] for j in rng.integers(0, len(frames), int(rng.integers(20, 41)))] for _ in range(300)]
    bytes_per_entry = 5 * 30 + 60  # LONG_BINGET per frame + the entry's own fields, measured below
    n_entries = max(3, int(target_bytes / bytes_per_entry))
    n_blocks = n_entries // 3
    sizes = (rng.integers(1, 1 << 14, n_blocks) * 512).tolist()
    stack_ids = rng.integers(0, len(stacks), n_entries).tolist()
    entries, live, t = [], [], 1_700_000_000_000_000
    next_addr = 1 << 40
    for k in range(n_blocks):
        # keep ~200 blocks live, freeing a random one once past that
        addr = next_addr
        next_addr += sizes[k]
        for action in ("alloc",) if len(live) < 200 else ("alloc", "free"):
            if action == "alloc":
                live.append((addr, sizes[k]))
                rows = [("alloc", addr, sizes[k])]
            else:
                a, s = live.pop(int(rng.integers(0, len(live) - 1)))
                rows = [("free_requested", a, s), ("free_completed", a, s)]
            for act, a, s in rows:
                t += int(rng.integers(1, 50))
                entries.append({"action": act, "addr": a, "size": s, "stream": 0, "time_us": t,
                                "compile_context": "N/A", "user_metadata": "",
                                "frames": list(stacks[stack_ids[len(entries) % n_entries]])})
    segments = [{"device": 0, "address": a, "total_size": s, "allocated_size": s, "active_size": s,
                 "requested_size": s, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                 "is_expandable": False, "frames": [],
                 "blocks": [{"address": a, "size": s, "requested_size": s, "state": "active_allocated",
                             "frames": []}]} for a, s in live]
    return {"segments": segments, "device_traces": [entries], "allocator_settings": {},
            "external_annotations": []}


def write_snapshot(path: Path, megabytes: float) -> int:
    """Write a synthetic snapshot of about `megabytes` MB to `path`; returns the number of entries."""
    target = int(megabytes * 1e6)
    probe = pickle.dumps(make_snapshot(2_000_000))
    scale = target / len(probe)
    snap = make_snapshot(int(2_000_000 * scale))
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    return len(snap["device_traces"][0])


_CHILD = r"""
import json, pickle, resource, sys, time, tracemalloc
import memlens, numpy, pandas  # imported before measuring
from memlens.io.snapshot.importer import import_snapshot
path, mode, heap = sys.argv[1], sys.argv[2], sys.argv[3] == "heap"

def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
base_rss = rss_kb()
if heap:
    tracemalloc.start()
t0 = time.perf_counter()
c0 = time.process_time()
if mode == "pickle":
    with open(path, "rb") as f:
        obj = pickle.load(f)
    n = len(obj["device_traces"][0])
elif mode == "memlens":
    trace = import_snapshot(path)
    n = len(trace.events)
elif mode == "save":  # the in-memory import saved, what `memlens import` does below 256 MiB
    import shutil
    trace = import_snapshot(path)
    trace.save(path + ".memlens")
    n = len(trace.events)
    shutil.rmtree(path + ".memlens")
else:  # "convert": convert_snapshot, what `memlens import` does from 256 MiB
    import shutil
    from memlens.io.snapshot.convert import convert_snapshot
    convert_snapshot(path, path + ".memlens")
    n = json.load(open(path + ".memlens/manifest.json"))["tables"]["events"]["rows"]
    shutil.rmtree(path + ".memlens")
wall = time.perf_counter() - t0
cpu = time.process_time() - c0
heap_peak = tracemalloc.get_traced_memory()[1] if heap else 0
peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "events": n, "heap_peak": heap_peak, "rss_peak_above_start": (peak_rss - base_rss) * 1024}))
"""


def _child(path: Path, mode: str, heap: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), mode, "heap" if heap else "time"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(path: Path, mode: str) -> dict:
    """Time one import in a fresh interpreter (with its peak RSS), then measure its Python heap peak in
    another (tracemalloc slows allocation-heavy code several-fold, so it never runs during the timing)."""
    timed = _child(path, mode, heap=False)
    timed["heap_peak"] = _child(path, mode, heap=True)["heap_peak"]
    return timed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="size of the synthetic snapshot (MB)")
    parser.add_argument("--keep", help="write the snapshot here and keep it")
    parser.add_argument("--save", action="store_true",
                        help="compare import + save with convert_snapshot (peak RSS, time) instead")
    args = parser.parse_args(argv)
    tmp = tempfile.TemporaryDirectory()
    path = Path(args.keep) if args.keep else Path(tmp.name) / "synthetic_snapshot.pickle"
    t0 = time.perf_counter()
    n = write_snapshot(path, args.mb)
    size = os.path.getsize(path)
    print(f"synthetic snapshot: {size / 1e6:.1f} MB, {n:,} entries (generated in {time.perf_counter() - t0:.1f} s)")
    if args.save:
        return compare_save(path, size)
    base = measure(path, "pickle")
    ours = measure(path, "memlens")
    for label, m in (("plain pickle.load (baseline)", base), ("memlens import_snapshot", ours)):
        print(f"{label:30s} {m['wall_s']:7.2f} s wall {m['cpu_s']:7.2f} s CPU  "
              f"{m['events'] / m['cpu_s']:10,.0f} events/CPU-s  "
              f"heap peak {m['heap_peak'] / size:4.2f}x file  RSS peak {m['rss_peak_above_start'] / size:4.2f}x file")
    print(f"memlens / pickle.load: {ours['wall_s'] / base['wall_s']:.2f}x time, "
          f"{ours['heap_peak'] / max(base['heap_peak'], 1):.2f}x heap")
    budget_s = 30 * max(size, 1) / 100e6
    ok = ours["cpu_s"] < budget_s and ours["heap_peak"] <= 3 * size
    print(f"target (<{budget_s:.1f} CPU-s for this size, i.e. 30 s per 100 MB, and heap <= 3x file):",
          "met" if ok else "NOT met", "(wall time counts other processes' load; CPU time does not)")
    return 0


def compare_save(path: Path, size: int) -> int:
    """`import_snapshot` + save (baseline) vs `convert_snapshot`, each in a fresh child: time and peak RSS."""
    runs = {mode: _child(path, mode, heap=False) for mode in ("save", "convert")}
    for label, m in (("import_snapshot + save (baseline)", runs["save"]), ("convert_snapshot", runs["convert"])):
        print(f"{label:34s} {m['wall_s']:7.2f} s wall {m['cpu_s']:7.2f} s CPU  {m['events']:,} events  "
              f"RSS peak {m['rss_peak_above_start'] / 2**20:7.1f} MiB above start ({m['rss_peak_above_start'] / size:4.2f}x file)")
    base, conv = runs["save"], runs["convert"]
    print(f"convert / import+save: {conv['cpu_s'] / base['cpu_s']:.2f}x CPU time, "
          f"{conv['rss_peak_above_start'] / max(base['rss_peak_above_start'], 1):.2f}x peak RSS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
