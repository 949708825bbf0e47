"""`memlens record -o OUT.memlens -- python script.py args`: run a script under the recorder.

The script runs in this process (the recorder must see its PyTorch calls), with `sys.argv` set to
its own arguments, `__name__ == "__main__"`, and `memlens.step()` available as usual. The trace is
saved even when the script fails or calls `sys.exit()`; the script's exit status becomes ours.
"""
from __future__ import annotations

import os
import sys


def register(sub) -> None:
    p = sub.add_parser("record", help="run a Python script under the memlens recorder and save its trace",
                       description="Run `python script.py args` (or `python -m module args`) in this process "
                                   "under memlens.record() and save the trace.")
    p.add_argument("-o", "--output", required=True, help="trace directory to write (NAME.memlens)")
    p.add_argument("--force", action="store_true", help="replace an existing trace at OUTPUT")
    p.add_argument("--stacks", action="store_true", help="record Python stacks of every op (slower)")
    p.add_argument("--allocator", choices=["auto", "none"], default="auto",
                   help="allocator-level events: auto (default) or none (tensor level only, fastest)")
    p.add_argument("--max-buffer", default="512MiB", help="bound on the recorder's event memory (default 512MiB)")
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


def run(args) -> int:
    import runpy
    import traceback
    from pathlib import Path

    import memlens
    from memlens.errors import InputError
    from memlens.units import format_bytes, parse_bytes

    out = Path(args.output)
    if out.exists() and not args.force:
        raise InputError("already exists (use --force to replace it)", out)
    kind, target, script_args = _target(args.command)
    status = 0
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [target] + script_args
    # as `python script.py` / `python -m module` would: the script's directory or the cwd comes first
    sys.path.insert(0, os.path.dirname(os.path.abspath(target)) if kind == "path" else os.getcwd())
    rec = memlens.record(stacks=args.stacks, allocator=args.allocator,
                         max_buffer_bytes=parse_bytes(args.max_buffer))
    try:
        with rec:
            if kind == "path":
                runpy.run_path(target, run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
    except Exception:  # the user's script failed: show its traceback, keep the partial trace
        traceback.print_exc()
        status = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    if rec.trace is None:
        print("memlens: no trace was recorded", file=sys.stderr)
        return 1
    path = rec.trace.save(out, overwrite=args.force)
    s = rec.trace.summary()
    peaks = ", ".join(f"{d} {format_bytes(v)}" for d, v in s["peak_live_bytes"].items()) or "none"
    print(f"memlens: saved {path} ({s['blocks']:,} blocks, {s['accesses']:,} accesses, {s['ops']:,} ops; "
          f"peak live {peaks})", file=sys.stderr)
    return status
