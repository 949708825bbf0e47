"""`memlens info --json` on small CUDA snapshots against a plain `pickle.load` of the same file, in one run.

Issue 28's target: on a ~4 MB snapshot, `memlens info` is no slower than a plain ``pickle.load`` plus 1 s.
Each measurement is the wall time (host clock) of a fresh child process, as a user runs it:

- ``pickle``: ``python -c "import pickle; pickle.load(open(F, 'rb'))"`` (the file's floor: no safety, no
  analysis, no pandas);
- ``pandas``: ``python -c "import pandas"`` (the floor of anything built on memlens's data model);
- ``info``: ``python -m memlens info --json F`` (import, safe streaming read, conversion, peak story).

The three alternate, `--repeat` times, and the medians are printed with ``info - pickle`` (the target: <= 1 s)
and ``info / pickle``, so a busy machine slows both sides alike. `--importtime` also prints the slowest
imports of the CLI (``python -X importtime``), cumulative microseconds, for finding what to load lazily.

    python benchmarks/info_speed.py                       # the shared small snapshots (../shared/traces)
    python benchmarks/info_speed.py FILE.pickle ... --repeat 5 --importtime
    python benchmarks/info_speed.py --mosaic-python /tmp/mosaic-venv/bin/python --mosaic-path /tmp/mosaic

``--mosaic-python`` (a Python that can import Meta's Mosaic, with ``--mosaic-path`` put on its PYTHONPATH
for a source checkout) adds ``mosaic``: ``mosaic_get_memory_usage_peak --snapshot F`` (its peak stacks, the
nearest of its commands to ``info``), timed in the same rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces" / "snapshots"
SMALL_BYTES = 5 << 20


def _env(tree: Path = ROOT) -> dict:
    # as a user runs it: that tree's memlens, with its compiled bytecode cached (an installed package has it)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}


def _wall(cmd: list[str], tree: Path = ROOT, check: bool = True) -> float:
    """Wall seconds of the child; NaN when it fails and `check` is off (another tool refusing a file)."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(tree),
                          cwd=tree)
    return time.perf_counter() - t0 if done.returncode == 0 else float("nan")


def measure(path: Path, repeat: int, baseline: Path | None = None, mosaic: tuple | None = None) -> dict:
    """Median wall seconds of the pickle, pandas and info children for `path` (alternating); with `baseline`
    (another checkout) also ``info_baseline``, that tree's `memlens info`; with `mosaic` ((python, path or
    None)) also ``mosaic``, Mosaic's peak command."""
    py = sys.executable
    info = [py, "-m", "memlens", "info", "--json", str(path)]
    runs = {"pickle": [], "pandas": [], "info": []} | ({"info_baseline": []} if baseline else {}) \
        | ({"mosaic": []} if mosaic else {})
    _wall(info)  # warm-up: bytecode written, the file in the page cache
    if baseline:
        _wall(info, baseline)
    if mosaic:
        mosaic_cmd = [mosaic[0], "-m", "mosaic.cmd.get_memory_usage_peak", "--snapshot", str(path)]
        mosaic_tree = Path(mosaic[1]) if mosaic[1] else ROOT
        _wall(mosaic_cmd, mosaic_tree, check=False)
    for _ in range(repeat):
        runs["pickle"].append(_wall([py, "-c", f"import pickle; pickle.load(open({str(path)!r}, 'rb'))"]))
        runs["pandas"].append(_wall([py, "-c", "import pandas"]))
        runs["info"].append(_wall(info))
        if baseline:
            runs["info_baseline"].append(_wall(info, baseline))
        if mosaic:
            runs["mosaic"].append(_wall(mosaic_cmd, mosaic_tree, check=False))
    return {k: statistics.median(v) for k, v in runs.items()}


def slowest_imports(path: Path, n: int = 15) -> list[tuple[int, str]]:
    """The `n` slowest top-level-ish imports of ``memlens info`` (cumulative us, module)."""
    env = _env()
    err = subprocess.run([sys.executable, "-X", "importtime", "-m", "memlens", "info", "--json", str(path)],
                         capture_output=True, text=True, env=env, cwd=ROOT).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line.split("|")
        try:
            rows.append((int(parts[1]), parts[2].rstrip()))
        except ValueError:
            continue
    return sorted(rows, reverse=True)[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, help="snapshots (default: the shared ones under 5 MB)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--importtime", action="store_true")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout of memlens (e.g. before a change): its `info` timed in the same run")
    ap.add_argument("--mosaic-python", default=None, help="a Python that can import Meta's Mosaic: time it too")
    ap.add_argument("--mosaic-path", default=None, help="a Mosaic source checkout put on that Python's path")
    args = ap.parse_args(argv)
    mosaic = (args.mosaic_python, args.mosaic_path) if args.mosaic_python else None
    files = args.files or sorted(p for p in SHARED.glob("*.pickle") if p.stat().st_size <= SMALL_BYTES)
    if not files:
        print(f"no snapshots given and none under {SHARED}", file=sys.stderr)
        return 2
    print(f"{'file':<48} {'MB':>5} {'pickle s':>9} {'pandas s':>9} {'info s':>8} {'info-pickle':>12} {'ratio':>6}"
          + ("  baseline info s" if args.baseline else "") + ("  mosaic s" if mosaic else ""))
    for f in files:
        m = measure(f, args.repeat, args.baseline, mosaic)
        print(f"{f.name:<48} {f.stat().st_size / 1e6:5.1f} {m['pickle']:9.2f} {m['pandas']:9.2f} {m['info']:8.2f} "
              f"{m['info'] - m['pickle']:11.2f}s {m['info'] / m['pickle']:6.1f}"
              + (f"  {m['info_baseline']:16.2f}" if args.baseline else "")
              + ((f"  {m['mosaic']:8.2f}" if m["mosaic"] == m["mosaic"] else "    failed") if mosaic else ""))
    print("(wall seconds on the host clock, medians of fresh child processes; target: info - pickle <= 1 s)")
    if args.importtime:
        print("slowest imports of `memlens info` (cumulative us):")
        for us, name in slowest_imports(files[0]):
            print(f"  {us:>9,}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
