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
