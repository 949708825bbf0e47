"""IPython magics: ``%load_ext memlens`` registers ``%%memlens`` (record a cell) and ``%memlens VERB ...``.

    %%memlens [-o NAME] [-m MODEL] [--stacks] [--save PATH] [--show|--no-show] [--gpu GPU]
    <cell body>                      # recorded; the Trace lands in NAME (default `memlens_trace`);
                                     # with --gpu it is put on that GPU's modeled clock (memlens.retime)
                                     # and the recorded (host-clock) trace is kept in NAME_recorded

    %memlens load PATH [-o NAME]     # memlens.load -> NAME (default `memlens_trace`)
    %memlens explore TRACE [--gpu G] # the explorer widget for a trace (variable name or path)
    %memlens save TRACE PATH         # Trace.save
    %memlens VERB ARGS...            # any CLI verb (info, report, simulate, plan, swap, ati, retime, gpus
                                     # ...); ati, outliers, swap, report, simulate take --gpu NAME

CLI verbs run through `memlens.cli.main`, so the magic accepts exactly the CLI's arguments; a TRACE argument
may name a Trace held in a notebook variable, which is written to a temporary ``.memlens`` directory for the
verb. Errors in the recorded cell propagate as usual, after the partial trace has been stored.
"""
from __future__ import annotations

import argparse
import ast
import shlex
import sys
import tempfile
from pathlib import Path

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

DEFAULT_NAME = "memlens_trace"


class _ArgParser(argparse.ArgumentParser):
    """argparse that reports usage errors as IPython `UsageError` instead of exiting the kernel."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage()}")

    def exit(self, status=0, message=None):
        if message:
            print(message, file=sys.stderr)
        raise UsageError(f"{self.prog}: stopped") if status else _HelpShown()


class _HelpShown(Exception):
    """`--help` was printed; nothing else to do."""


def cell_parser() -> argparse.ArgumentParser:
    """The options of ``%%memlens``."""
    p = _ArgParser(prog="%%memlens", description="Record the cell with memlens.record and show the explorer.")
    p.add_argument("-o", "--output", default=DEFAULT_NAME, metavar="NAME",
                   help=f"variable that receives the Trace (default {DEFAULT_NAME})")
    p.add_argument("-m", "--model", metavar="VAR", help="notebook variable holding the nn.Module being run")
    p.add_argument("--stacks", action="store_true", help="record the Python stack of every op (slower)")
    p.add_argument("--save", metavar="PATH", help="also write the trace to PATH (a .memlens directory)")
    p.add_argument("--gpu", metavar="GPU", help="put the trace on this GPU's modeled clock (see `memlens gpus`); "
                                               "the recorded trace is kept in NAME_recorded")
    show = p.add_mutually_exclusive_group()
    show.add_argument("--show", dest="show", action="store_true", default=True,
                      help="display the explorer widget after the cell (default)")
    show.add_argument("--no-show", dest="show", action="store_false", help="do not display the widget")
    return p


def _load_parser() -> argparse.ArgumentParser:
    p = _ArgParser(prog="%memlens load", description="Load any supported trace file into a variable.")
    p.add_argument("path")
    p.add_argument("-o", "--output", default=DEFAULT_NAME, metavar="NAME")
    return p


def _explore_parser() -> argparse.ArgumentParser:
    p = _ArgParser(prog="%memlens explore", description="Show the explorer widget for a trace.")
    p.add_argument("trace", nargs="?", default=DEFAULT_NAME, help="variable name or path")
    p.add_argument("--device", help="device to show first (e.g. cuda:0)")
    p.add_argument("--gpu", metavar="GPU", help="show the trace on this GPU's modeled clock")
    return p


def _save_parser() -> argparse.ArgumentParser:
    p = _ArgParser(prog="%memlens save", description="Save a trace variable as a .memlens directory.")
    p.add_argument("trace")
    p.add_argument("path")
    p.add_argument("--overwrite", action="store_true")
    return p


def split_last_expression(source: str, filename: str = "<memlens cell>"):
    """Compile `source` as (body, last expression or None), like IPython shows a cell's last value.

    A trailing semicolon suppresses the value, as in IPython.
    """
    tree = ast.parse(source, filename=filename)
    last = None
    shown = not source.rstrip().endswith(";")
    if shown and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec")
    return body, (compile(last, filename, "eval") if last is not None else None)


@magics_class
class MemlensMagics(Magics):
    """``%memlens`` / ``%%memlens``; see the module docstring."""

    @line_cell_magic
    def memlens(self, line: str = "", cell: str | None = None):
        """Record a cell (``%%memlens``) or run a memlens verb (``%memlens VERB ...``)."""
        try:
            if cell is None:
                return self._line(line)
            return self._record_cell(line, cell)
        except _HelpShown:
            return None

    # ---- %%memlens -----------------------------------------------------------------------------
    def _record_cell(self, line: str, cell: str):
        from memlens.recording import record

        args = cell_parser().parse_args(shlex.split(line))
        if not args.output.isidentifier():
            raise UsageError(f"%%memlens: -o needs a variable name, not {args.output!r}")
        ns = self.shell.user_ns
        model = None
        if args.model:
            if args.model not in ns:
                raise UsageError(f"%%memlens: no variable named {args.model!r} for --model")
            model = ns[args.model]
        if args.gpu:   # a bad GPU name is a usage error before the cell runs
            from memlens.devicetime.gpus import gpu
            _user_errors(gpu, args.gpu)
        body, last = split_last_expression(self.shell.transform_cell(cell))
        recorder = record(model, stacks=args.stacks)
        value = None
        try:
            with recorder:
                exec(body, ns)
                if last is not None:
                    value = eval(last, ns)
        finally:
            # stored even when the cell raised: the recorder keeps the partial trace
            ns[args.output] = recorder.trace
            if recorder.trace is not None and args.gpu:
                from memlens.devicetime.retiming import retime
                ns[f"{args.output}_recorded"] = recorder.trace
                ns[args.output] = _user_errors(retime, recorder.trace, gpu=args.gpu)
            if ns[args.output] is not None and args.save:
                path = ns[args.output].save(args.save, overwrite=True)
                print(f"memlens: trace saved to {path}")
        if value is not None:
            display(value)
        if recorder.trace is None:
            print("memlens: the recorder could not build a trace (see the warning above)", file=sys.stderr)
        elif args.show:
            from memlens.widgets import explore
            display(explore(ns[args.output]))
        return None

    # ---- %memlens VERB ---------------------------------------------------------------------------
    def _line(self, line: str):
        argv = shlex.split(line)
        if not argv or argv[0] in ("-h", "--help", "help"):
            print(__doc__)
            return None
        verb, rest = argv[0], argv[1:]
        if verb == "load":
            return self._load(rest)
        if verb in ("explore", "show"):
            return self._explore(rest)
        if verb == "save":
            return self._save(rest)
        return self._cli(verb, rest)

    def _load(self, argv):
        from memlens.io.detect import load
        args = _load_parser().parse_args(argv)
        trace = _user_errors(load, args.path)
        self.shell.user_ns[args.output] = trace
        return trace

    def _explore(self, argv):
        from memlens.widgets import explore
        args = _explore_parser().parse_args(argv)
        trace = self._trace(args.trace)
        if args.gpu:
            from memlens.devicetime.retiming import retime
            trace = _user_errors(retime, trace, gpu=args.gpu)
        return explore(trace, device=args.device)

    def _save(self, argv):
        args = _save_parser().parse_args(argv)
        path = _user_errors(self._trace(args.trace).save, args.path, overwrite=args.overwrite)
        print(f"memlens: trace saved to {path}")
        return None

    def _trace(self, name_or_path: str):
        """The Trace in variable `name_or_path`, else the file at that path loaded."""
        from memlens.io.detect import load
        from memlens.trace import Trace
        value = self.shell.user_ns.get(name_or_path)
        if isinstance(value, Trace):
            return value
        if name_or_path.isidentifier() and not Path(name_or_path).exists():
            raise UsageError(f"%memlens: {name_or_path!r} is neither a Trace variable nor a file")
        return _user_errors(load, name_or_path)

    def _cli(self, verb: str, argv: list[str]):
        """Run CLI verb `verb`, replacing arguments that name Trace variables by temporary copies; what it
        prints names the variables, never the copies (they are deleted when it returns)."""
        import contextlib
        import io

        from memlens.cli import main
        from memlens.trace import Trace
        with tempfile.TemporaryDirectory(prefix="memlens-magic-") as tmp:
            resolved, copies = [], {}
            for i, arg in enumerate(argv):
                value = self.shell.user_ns.get(arg) if arg.isidentifier() else None
                if isinstance(value, Trace):
                    path = str(value.save(Path(tmp) / f"{arg}_{i}.memlens"))
                    copies[path] = f"{arg} (a Trace variable)"
                    arg = path
                resolved.append(arg)
            out, err = io.StringIO(), io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code = main([verb, *resolved])
            except SystemExit as exc:   # argparse --help / usage errors exit
                code = exc.code if isinstance(exc.code, int) else 2
            finally:
                for stream, text in ((sys.stdout, out.getvalue()), (sys.stderr, err.getvalue())):
                    for path, name in copies.items():
                        text = text.replace(path, name)
                    stream.write(text)
        if code:
            raise UsageError(f"memlens {verb} failed (exit {code}); see the message above")
        return None


def _user_errors(fn, *args, **kwargs):
    """Call fn, turning memlens's InputError into a one-line UsageError (no traceback for bad input)."""
    from memlens.errors import InputError
    try:
        return fn(*args, **kwargs)
    except InputError as exc:
        raise UsageError(f"memlens: {exc}") from None


def _display_trace(trace) -> None:
    """Show a Trace evaluated at the end of a cell as the explorer widget."""
    from memlens.widgets import explore
    display(explore(trace))


def load_ipython_extension(ipython) -> None:
    """Called by ``%load_ext memlens``: register the magics, and show Traces as the explorer widget."""
    from memlens.trace import Trace
    ipython.register_magics(MemlensMagics)
    ipython.display_formatter.ipython_display_formatter.for_type(Trace, _display_trace)
