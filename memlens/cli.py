"""The `memlens` command line: a thin layer over the Python API.

Each verb lives in its own module under `memlens.commands` with two functions:
``register(subparsers)`` adds its parser (set ``func=run`` via ``set_defaults``) and ``run(args)`` does
the work, returning an exit code. Modules are discovered, so a new verb needs no edit here.
Command modules must import heavy libraries (torch, plotly) inside ``run``, not at module level.

Exit codes: 0 success, 2 bad input (one-line error on stderr), 1 internal error.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import sys

from memlens._version import __version__
from memlens.commands._output import print_json  # noqa: F401  (memlens.cli.print_json, as before)
from memlens.errors import EscapedStream, InputError, printable

EXIT_OK, EXIT_INTERNAL, EXIT_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        # a bad option value (a type= check of memlens.commands.options) raises ArgumentError, which
        # main() reports like any other bad input: one line, exit 2, returned rather than exited
        kwargs.setdefault("exit_on_error", False)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line (argparse's default adds the usage): what is wrong, where to look
        self.exit(EXIT_INPUT, printable(f"memlens: error: {message} (see '{self.prog} --help')") + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every verb found under `memlens.commands`."""
    parser = _Parser(prog="memlens", description="See what PyTorch memory does, block by block.")
    parser.add_argument("--version", action="version", version=f"memlens {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    import memlens.commands as pkg
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"memlens.commands.{info.name}")
        if hasattr(module, "register"):  # helpers such as commands/options.py are not verbs
            module.register(sub)
    return parser


def main(argv=None) -> int:
    """Entry point of the `memlens` console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except argparse.ArgumentError as exc:
        print(printable(f"memlens: error: {exc}"), file=sys.stderr)
        return EXIT_INPUT
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_INPUT
    if not args.debug:  # library warnings (numpy casts of hostile values) would break the one-line contract
        import warnings
        warnings.simplefilter("ignore")
    try:
        from memlens.limits import check_environment
        check_environment()
        with contextlib.redirect_stdout(EscapedStream(sys.stdout)):  # names from files never print raw
            return int(args.func(args) or 0)
    except InputError as exc:
        if args.debug:  # the one line stays last; the traceback (with its cause) comes before it
            import traceback
            traceback.print_exception(exc, file=sys.stderr)
        print(f"memlens: error: {printable(str(exc))}", file=sys.stderr)
        return EXIT_INPUT
    except (MemoryError, RecursionError) as exc:
        # only input can make memlens this large or this deep: name it, exit as bad input
        if args.debug:
            raise
        what = "ran out of memory" if isinstance(exc, MemoryError) else "input is nested too deeply"
        inputs = [str(v) for k, v in sorted(vars(args).items())
                  if k in ("path", "paths", "trace", "traces", "file", "input", "inputs") and v]
        print(printable(f"memlens: error: {' '.join(inputs) + ': ' if inputs else ''}{what} (the input is "
                        "too large or malformed for this machine)"), file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("memlens: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # internal error: one line, traceback only with --debug
        if args.debug:
            raise
        print(printable(f"memlens: internal error: {type(exc).__name__}: {exc} (rerun with --debug for "
                        "details)"), file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
