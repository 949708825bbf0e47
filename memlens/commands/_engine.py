"""The --engine / --scheduler / --workers options shared by the commands that can run out of core."""
from __future__ import annotations

from memlens.commands import options


def add_engine_options(p) -> None:
    """Add the engine options to a command's parser."""
    p.add_argument("--engine", choices=["auto", "memory", "dask"], default="auto",
                   help="memory: pandas on the whole trace; dask: out of core, a row-group batch at a time, "
                        "same answers in bounded memory (saved .memlens traces); auto (default): dask when the "
                        "trace would need more than half the available memory")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run the dask engine on this dask.distributed scheduler (tcp://host:8786); the trace and "
                        "--scratch must be readable by its workers. Implies --engine dask")
    p.add_argument("--workers", type=options.count(1, 4096), default=None,
                   help="threads of the local dask scheduler (default: the CPU count)")
    p.add_argument("--scratch", metavar="DIR",
                   help="where the dask engine keeps its intermediate pieces (default: the temp directory)")


def engine_for(args) -> str:
    """"memory" or "dask" for this command's trace and options."""
    from memlens.analysis.outofcore.choose import choose_engine
    from memlens.errors import InputError
    if args.workers is not None and args.workers < 1:
        raise InputError(f"--workers must be at least 1, got {args.workers}")
    engine = args.engine
    if args.scheduler:
        if engine == "memory":
            raise InputError("--scheduler runs the dask engine; it cannot be combined with --engine memory")
        engine = "dask"
    return choose_engine(args.trace, engine)


def runner_for(args):
    """A `Runner` (context manager) for the dask engine with this command's options."""
    from memlens.analysis.outofcore.runner import Runner
    return Runner(scheduler=args.scheduler, workers=args.workers, scratch=args.scratch)


NOTE_ABOVE_BYTES = 1 << 30  # say what a whole-trace analysis will hold from this need up


def require_in_memory(path, what: str, engine: str = "memory") -> None:
    """For an analysis with no out-of-core engine (it needs every block at once: the swap planner, the
    allocator replay, the offset planner; the report with --engine memory): before anything is loaded, refuse `engine` "dask"
    and a saved trace whose estimated in-memory size exceeds the memory available now (`InputError`
    naming both figures), and say on stderr what a big one will hold. Other files are loaded as they are
    (their size in memory is known only after parsing)."""
    import sys

    from memlens.analysis.outofcore.choose import available_memory, memory_needed
    from memlens.errors import InputError
    from memlens.trace.tracedir import is_trace_dir
    from memlens.units import format_bytes
    if not is_trace_dir(path):
        if engine == "dask":
            raise InputError(f"{what} has no out-of-core engine: it needs the whole trace in memory", path)
        return
    from memlens.analysis.outofcore.files import TraceFiles
    rows = TraceFiles.open(path).rows
    need, available = memory_needed(rows)["memory"], available_memory()
    figures = (f"about {format_bytes(need)} for {rows.get('accesses', 0):,} accesses and "
               f"{rows.get('blocks', 0):,} blocks; {format_bytes(available)} available now")
    if engine == "dask":
        raise InputError(f"{what} has no out-of-core engine: it needs every block at once, so the whole trace in "
                         f"memory ({figures}); `memlens info|ati|outliers|report --engine dask` answer out of core", path)
    if need > available:
        raise InputError(f"{what} needs the whole trace in memory ({figures}): not enough memory on this "
                         "machine; `memlens info|ati|outliers|report --engine dask` answer out of core", path)
    if need >= NOTE_ABOVE_BYTES:
        print(f"memlens: {what} loads the whole trace: {figures}", file=sys.stderr)
