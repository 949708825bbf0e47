"""`memlens demo [-o DIR]`: record a small transformer trained for a few steps on CPU, save the trace
and write the HTML report, printing where they are."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("demo", help="record a built-in small transformer training run and write its report",
                       description="Train a small transformer LM for a few steps on CPU under memlens.record, "
                                   "save DIR/demo.memlens and write DIR/report.html.")
    p.add_argument("-o", "--output", default="memlens-demo", help="output directory (default: memlens-demo)")
    p.add_argument("--steps", type=int, default=4, help="training steps to record (default 4)")
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.demo import run_demo
    from memlens.errors import InputError
    from memlens.units import format_bytes, format_ns

    if args.steps < 1:
        raise InputError(f"--steps must be at least 1, not {args.steps}")
    import os
    try:  # fail fast, before recording, when the output directory cannot be made
        os.makedirs(args.output, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the output directory ({exc.strerror or exc})", args.output) from None
    result = run_demo(args.output, steps=args.steps)
    s = result["summary"]
    print(f"recorded a small transformer LM, {args.steps} AdamW training steps on CPU: {s['blocks']:,} blocks, "
          f"{s['accesses']:,} accesses, {s['ops']:,} ops in {format_ns(s['duration_ns'])}")
    for dev, peak in s["peak_live_bytes"].items():
        print(f"peak live bytes on {dev}: {format_bytes(peak)}")
    print(f"trace:  {result['trace']}")
    if result["report"] is not None:
        print(f"report: {result['report']}")
    else:
        print(f"report: not written: {result['report_error']}")
    print(f"next:   {cli_command()} info {result['trace']}")
    return 0


def cli_command() -> str:
    """How to type the memlens CLI from this shell: `memlens` when it is on PATH, else its path in the
    interpreter's bin directory (a venv that is not activated), else `python -m memlens`."""
    import os
    import shutil
    import sys
    from pathlib import Path

    beside = Path(sys.executable).parent / "memlens"
    if shutil.which("memlens") and (not beside.exists() or Path(shutil.which("memlens")).resolve() == beside.resolve()):
        return "memlens"
    if beside.exists():
        return os.path.relpath(beside) if not os.path.relpath(beside).startswith("../..") else str(beside)
    return f"{sys.executable} -m memlens"
