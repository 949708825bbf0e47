"""Running a user's script in this process as ``python script.py ARGS`` (or ``python -m module ARGS``) would:
`sys.argv` set to the script and its arguments, the script's folder (the working directory for a module)
first on `sys.path`, both restored afterwards, whatever the script does. The one runner behind
`memlens record`, `memlens predict` (one GPU and per rank) and `memlens advise`; each caller decides what
a failure or an exit of the script means for its own answer."""
from __future__ import annotations

import contextlib
import os
import runpy
import sys


@contextlib.contextmanager
def as_main(target: str, args: list | tuple = (), *, module: bool = False):
    """`sys.argv` and `sys.path` as the interpreter sets them for `target` run with `args`, restored on exit."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(target), *map(str, args)]
    sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(target)))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def run_script(target: str, args: list | tuple = (), *, module: bool = False, run_name: str = "__main__") -> dict:
    """Run the script at `target` (or the module named `target`, with `module`) with `args` in this process
    and return its global namespace. `run_name` other than ``"__main__"`` loads the script without running
    its ``if __name__ == "__main__":`` block. The script's exceptions, `SystemExit` included, propagate."""
    with as_main(target, args, module=module):
        if module:
            return runpy.run_module(str(target), run_name=run_name, alter_sys=True)
        return runpy.run_path(str(target), run_name=run_name)
