"""Which engine runs an analysis: the in-memory one (pandas, whole trace) or the out-of-core one (Dask).

``auto`` picks Dask when the in-memory engine would need more than `MEMORY_FRACTION` of the memory
available now. The in-memory need is estimated from the table sizes with factors measured on this
code: `memlens ati` held 4.2 GB of RSS on a 20M-access trace, ~210 bytes per access while the intervals
exist; a block row costs ~400 bytes across its pandas columns (strings included).
"""
from __future__ import annotations

from pathlib import Path

from memlens.errors import InputError

ENGINES = ("auto", "memory", "dask")
MEMORY_FRACTION = 0.5
BYTES_PER_ACCESS = 210
BYTES_PER_BLOCK = 400
BYTES_PER_OP = 200
BYTES_PER_EVENT_CURVE = 16  # out of core, a device's whole live curve: (t_ns, live) per alloc/free


def available_memory() -> int:
    """Bytes of memory available to a new process now (psutil, else /proc/meminfo; 8 GiB if unknown)."""
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def memory_needed(rows: dict[str, int]) -> dict[str, int]:
    """Estimated bytes each engine needs for a trace with these table row counts:
    ``memory`` (the whole trace and its intervals in pandas) and ``dask_outliers_curve`` (the one
    whole-trace structure of the out-of-core outliers: each device's live curve)."""
    accesses, blocks, ops = rows.get("accesses", 0), rows.get("blocks", 0), rows.get("ops", 0)
    return {"memory": accesses * BYTES_PER_ACCESS + blocks * BYTES_PER_BLOCK + ops * BYTES_PER_OP,
            "dask_outliers_curve": 2 * blocks * BYTES_PER_EVENT_CURVE}


def choose_engine(path, engine: str = "auto") -> str:
    """"memory" or "dask" for the trace at `path`. Only saved ``.memlens`` directories can go out of
    core; "dask" on another file is bad input (convert it with `memlens import` first)."""
    if engine not in ENGINES:
        raise InputError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    from memlens.trace.tracedir import is_trace_dir
    if engine == "memory":
        return "memory"
    if not is_trace_dir(path):
        if engine == "dask":
            raise InputError("--engine dask reads saved memlens traces (a NAME.memlens directory); convert "
                             "this file with `memlens import` first", path)
        return "memory"
    if engine == "dask":
        return "dask"
    from memlens.analysis.outofcore.files import TraceFiles
    need = memory_needed(TraceFiles.open(path).rows)["memory"]
    return "dask" if need > MEMORY_FRACTION * available_memory() else "memory"
