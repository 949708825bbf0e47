"""`memlens record -o OUT.memlens -- python script.py args`: run a script under the recorder.

The script runs in this process (the recorder must see its PyTorch calls), with `sys.argv` set to
its own arguments, `__name__ == "__main__"`, and `memlens.step()` available as usual. The trace is
saved even when the script fails, calls `sys.exit()`, or is interrupted by Ctrl-C (SIGINT) or SIGTERM
(then the trace is marked ``metadata["interrupted"]``); the script's exit status becomes ours (130 and
143 for the two signals, as a shell reports them). The output path is checked before the script runs,
and a save that fails anyway falls back to a path in the temporary directory, so no recording is lost.
"""
from __future__ import annotations

import os
import signal
import sys

from memlens.commands import options


def register(sub) -> None:
    p = sub.add_parser("record", help="run a Python script under the memlens recorder and save its trace",
                       description="Run `python script.py args` (or `python -m module args`) in this process "
                                   "under memlens.record() and save the trace.")
    p.add_argument("-o", "--output", required=True, type=options.output_path, help="trace directory to write (NAME.memlens)")
    p.add_argument("--force", action="store_true", help="replace an existing trace at OUTPUT")
    p.add_argument("--stacks", action="store_true", help="record Python stacks of every op (slower)")
    p.add_argument("--allocator", choices=["auto", "none"], default="auto",
                   help="allocator-level events: auto (default) or none (tensor level only, fastest)")
    p.add_argument("--max-buffer", default="512MiB", type=options.positive_size, help="bound on the recorder's event memory (default 512MiB)")
    p.add_argument("command", nargs="+", metavar="-- python script.py ARGS",
                   help="the command to run, after `--`")
    p.set_defaults(func=run)


def _target(command: list[str]):
    """('path', script, args) or ('module', name, args) from `python script.py ...` / `script.py ...`."""
    from memlens.errors import InputError
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv and (os.path.basename(argv[0]).startswith("python") or argv[0] == sys.executable):
        argv = argv[1:]
    if not argv:
        raise InputError("no script given: use `memlens record -o OUT.memlens -- python script.py ARGS`")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise InputError("`-m` needs a module name")
        return "module", argv[1], argv[2:]
    if argv[0].startswith("-"):
        raise InputError(f"unsupported interpreter option {argv[0]!r}; only `python script.py` and "
                         "`python -m module` can be recorded")
    if not os.path.isfile(argv[0]):
        raise InputError("no such script", argv[0])
    return "path", argv[0], argv[1:]


class _Terminated(BaseException):
    """Raised in the main thread by the SIGTERM handler while the script runs."""


def _check_output(out, force: bool) -> None:
    """Everything about OUT that would make the save fail, checked before the script runs."""
    from memlens.errors import InputError
    from memlens.trace.tracedir import is_trace_dir
    if out.exists():
        if not force:
            raise InputError("already exists (use --force to replace it)", out)
        if not is_trace_dir(out):
            raise InputError("exists and is not a memlens trace; refusing to replace it", out)
    options.check_output(out, "-o/--output")


def _fallback_path(out):
    """Where the recording goes when OUT cannot be written: a path in the temporary directory."""
    import tempfile
    from pathlib import Path
    return Path(tempfile.gettempdir()) / f"{out.name.removesuffix('.memlens')}.{os.getpid()}.memlens"


def run(args) -> int:
    import traceback
    from pathlib import Path

    from memlens.errors import printable
    from memlens.recording import record
    from memlens.script_runner import run_script
    from memlens.units import format_bytes

    out = Path(args.output)
    _check_output(out, args.force)
    kind, target, script_args = _target(args.command)
    status, interrupted = 0, None
    # saved as it is built (memlens.recording.streamsave): the accesses a window of ops at a time, so a long
    # recording never has all its accesses in memory
    rec = record(stacks=args.stacks, allocator=args.allocator, max_buffer_bytes=args.max_buffer,
                 save_to=out, overwrite=args.force)
    rec.save_fallback = _fallback_path(out)

    def on_sigterm(signum, frame):
        raise _Terminated()

    in_main = threading_is_main()
    old_term = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    failure = None
    try:
        rec.__enter__()
        try:
            run_script(target, script_args, module=kind != "path")   # as `python script.py` / `python -m` would
        except SystemExit as exc:
            code = exc.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
            failure = exc
        except KeyboardInterrupt as exc:
            status, interrupted, failure = 128 + signal.SIGINT, "SIGINT", exc
        except _Terminated as exc:
            status, interrupted, failure = 128 + signal.SIGTERM, "SIGTERM", exc
        except Exception as exc:  # the user's script failed: show its traceback, keep the partial trace
            traceback.print_exc()
            status, failure = 1, exc
    except KeyboardInterrupt:  # Ctrl-C before the recorder was fully started
        status, interrupted = 128 + signal.SIGINT, "SIGINT"
    finally:
        # from here on, signals must not cost the recording: finish and save, then exit
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        exc_info = (type(failure), failure, failure.__traceback__) if failure else (None, None, None)
        if interrupted:
            rec.save_metadata["interrupted"] = interrupted
            rec.save_metadata["notes"] = [
                f"The recording was interrupted by {interrupted}: the script did not finish; the trace holds "
                "everything up to the interruption."]
        rec.__exit__(*exc_info)
        if rec.saved_path is None:
            print("memlens: no trace was recorded", file=sys.stderr)
            return status or 1
        path, error = rec.saved_path, rec.save_error
    finally:
        if in_main:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
    s = rec.saved_summary
    peaks = ", ".join(f"{d} {format_bytes(v)}" for d, v in s["peak_live_bytes"].items()) or "none"
    if error is not None:
        print(printable(f"memlens: error: could not save to {out} ({error}); the recording was saved to {path}"),
              file=sys.stderr)
        return status or 2
    print(f"memlens: saved {path} ({s['blocks']:,} blocks, {s['accesses']:,} accesses, {s['ops']:,} ops; "
          f"peak live {peaks}){' - interrupted by ' + interrupted if interrupted else ''}", file=sys.stderr)
    return status


def threading_is_main() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()
