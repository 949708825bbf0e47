"""Import a big CUDA memory snapshot whose entries all have distinct stacks, against
plain `pickle.load` of the same file: peak RSS and time, each in a fresh child process.

    python benchmarks/snapshot_distinct_stacks.py [--mb 97]

The target: memory at most that of `pickle.load`, time at most 3x.
"""
from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_snapshot(path: Path, target_bytes: int, frames_per_stack: int = 24) -> int:
    """A snapshot whose every alloc has its own stack (distinct frame dicts); returns the entry count."""
    entries, size, i = [], 0, 0
    per_entry = 0
    while size < target_bytes:
        frames = [{"name": f"fn_{i}_{d}", "filename": f"/src/pkg/module_{d}.py", "line": i * 7 + d}
                  for d in range(frames_per_stack)]
        action = "alloc" if i % 2 == 0 else "free_completed"
        entries.append({"action": action, "addr": 4096 * (i // 2 + 1), "size": 512 * (i % 97 + 1), "stream": 0,
                        "time_us": i, "frames": frames})
        i += 1
        if i == 200:
            per_entry = len(pickle.dumps(entries, protocol=4)) / 200
        if per_entry:
            size = int(per_entry * i)
    with open(path, "wb") as f:
        pickle.dump({"segments": [], "device_traces": [entries]}, f, protocol=4)
    return len(entries)


# peak memory is the child's VmHWM (its own address space's high-water mark), not ru_maxrss: Linux carries
# ru_maxrss over from the parent across fork and exec, so every child would report at least the RSS this
# process had when it built the snapshot
CHILD = """
import sys, time
def vm_hwm_bytes():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
path, mode = sys.argv[1], sys.argv[2]
t, cpu = time.perf_counter(), time.process_time()
if mode == "pickle":
    import pickle
    with open(path, "rb") as f:
        obj = pickle.load(f)
    n = len(obj["device_traces"][0])
else:
    from memlens.io.snapshot.importer import import_snapshot
    n = len(import_snapshot(path).blocks)
print(time.perf_counter() - t, time.process_time() - cpu, vm_hwm_bytes(), n)
"""


def measure(path: Path, mode: str) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS bytes) of reading `path` in a fresh child ("pickle" or "memlens").
    CPU time is reported beside wall time: on a shared machine it is the steadier of the two."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=float, default=97.0, help="snapshot size in MB (default 97, as in the issue)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "distinct.pickle"
        t = time.perf_counter()
        n = make_snapshot(path, int(args.mb * 1e6))
        print(f"snapshot: {path.stat().st_size / 1e6:.1f} MB, {n:,} entries with distinct stacks "
              f"(built in {time.perf_counter() - t:.1f} s)")
        base_t, base_cpu, base_rss = measure(path, "pickle")
        ours_t, ours_cpu, ours_rss = measure(path, "memlens")
    print(f"pickle.load:      {base_t:6.2f} s wall {base_cpu:6.2f} s CPU  peak RSS (VmHWM) {base_rss / 2**20:7.0f} MiB")
    print(f"memlens import:   {ours_t:6.2f} s wall {ours_cpu:6.2f} s CPU  peak RSS (VmHWM) {ours_rss / 2**20:7.0f} MiB")
    print(f"ratio (memlens / pickle.load): time {ours_t / base_t:.2f}x wall, {ours_cpu / base_cpu:.2f}x CPU; "
          f"memory {ours_rss / base_rss:.2f}x")


if __name__ == "__main__":
    main()
