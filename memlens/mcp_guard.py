"""The MCP server's trust boundary: which files its tools may read and run, and how large an argument may be.

An MCP client (an AI assistant) is not the user: it may have read a hostile web page or trace. So every tool
reads and runs only inside the server's *roots*: the directories the client announces as its roots (when it
supports them), else the server's working directory, plus every directory named with ``memlens mcp --root
DIR``. A path argument is resolved (symlinks followed) and refused unless it lies inside one of them; the
``predict`` and ``advise`` tools run only a ``.py`` regular file inside them; source lines come only from files
inside them.

String arguments are bounded (`MAX_ARG_CHARS`), and an error quotes at most `ECHO_CHARS` characters of what
it was given, so that a huge argument cannot come back as a huge error.
"""
from __future__ import annotations

import os
from urllib.parse import unquote, urlparse

from memlens.errors import InputError

MAX_ARG_CHARS = 4096  # a path or option longer than this is not a real one
MAX_SCRIPT_ARGS = 256  # arguments the predict and advise tools pass to a script
MAX_WORLD_SIZE = 4096  # ranks the advise tool predicts a step on (each rank is predicted on this machine)
ECHO_CHARS = 120  # characters of an argument an error message quotes
PATH_ARGS = ("path", "path_a", "path_b", "script", "source_root")


def clip(text, limit: int = ECHO_CHARS) -> str:
    """`text` cut to `limit` characters (with a note of how many were left out), for quoting in an error."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


class Roots:
    """The directories the tools may read and run inside (real paths, symlinks resolved)."""

    def __init__(self, dirs):
        self.dirs = tuple(dict.fromkeys(_real(d) for d in dirs))

    def contains(self, path: str) -> bool:
        """Whether `path` (after resolving symlinks) is one of the roots or lies under one."""
        real = _real(path)
        return any(real == d or real.startswith(d.rstrip(os.sep) + os.sep) for d in self.dirs)

    def check(self, name: str, path: str) -> str:
        """`path` resolved, or `InputError` when it lies outside every root (the message names `name`)."""
        if not self.contains(path):
            raise InputError(f"{name} {clip(path)!r} is outside the directories this server may read "
                             f"({', '.join(self.dirs)}); start it with `memlens mcp --root DIR` to allow more")
        return _real(path)


def start_roots(extra=()) -> list[str]:
    """The roots given when the server starts: each ``--root DIR`` (which must be a directory)."""
    out = []
    for d in extra:
        if not os.path.isdir(d):
            raise InputError(f"--root {clip(d)}: not a directory")
        out.append(d)
    return out


def roots_from_uris(uris) -> list[str]:
    """Local directories named by an MCP client's root URIs (``file:///home/me/project``); others ignored."""
    out = []
    for uri in uris:
        u = urlparse(str(uri))
        if u.scheme == "file" and u.netloc in ("", "localhost") and u.path:
            out.append(unquote(u.path))
    return out


def check_arguments(tool: str, kwargs: dict, roots: Roots) -> None:
    """Refuse, with an `InputError`, any argument of `tool` that is too large, of the wrong type, or a path
    outside `roots`; the script of the ``predict`` and ``advise`` tools must be a ``.py`` regular file and its
    GPU a known name or a ``.json`` file inside the roots; ``advise`` takes a world size of 1 to
    `MAX_WORLD_SIZE` and one of its objectives."""
    for name, value in kwargs.items():
        if name == "args":
            if value is None:
                continue
            if not isinstance(value, (list, tuple)) or len(value) > MAX_SCRIPT_ARGS:
                raise InputError(f"args must be a list of at most {MAX_SCRIPT_ARGS} strings")
            for a in value:
                if not isinstance(a, str) or len(a) > MAX_ARG_CHARS:
                    raise InputError(f"args: each must be a string of at most {MAX_ARG_CHARS} characters, "
                                     f"got {clip(a)!r}")
        elif isinstance(value, str):
            if len(value) > MAX_ARG_CHARS or "\x00" in value:
                raise InputError(f"{name}: at most {MAX_ARG_CHARS} characters and no NUL, got {clip(value)!r}")
    for name in PATH_ARGS:
        if kwargs.get(name) is not None:
            if not isinstance(kwargs[name], str):
                raise InputError(f"{name} must be a path (a string), not {type(kwargs[name]).__name__}")
            roots.check(name, kwargs[name])
    if tool == "advise":
        world_size = kwargs.get("world_size")
        if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)
                                       or not 1 <= world_size <= MAX_WORLD_SIZE):
            raise InputError(f"world_size must be a whole number from 1 to {MAX_WORLD_SIZE}, got {clip(world_size)}")
        from memlens.advice.result import OBJECTIVES
        if kwargs.get("objective", "fit") not in OBJECTIVES:
            raise InputError(f"objective must be one of {', '.join(OBJECTIVES)}, got {clip(kwargs['objective'])!r}")
        capacity = kwargs.get("capacity")
        if capacity is not None:
            from memlens.units import parse_bytes
            try:
                if parse_bytes(capacity) <= 0:
                    raise ValueError("not more than 0 bytes")
            except Exception:  # noqa: BLE001 - any unreadable size is the same bad input
                raise InputError(f"capacity must be a size such as 40GiB, got {clip(capacity)!r}") from None
        if kwargs.get("script") is None:
            return          # a recorded trace: its path was checked above
    if tool in ("predict", "advise"):
        script = str(kwargs.get("script", ""))
        if not os.path.exists(script):
            raise InputError(f"{clip(script)}: no such script")
        if not script.endswith(".py") or not os.path.isfile(_real(script)):
            raise InputError(f"{clip(script)}: not a .py file ({tool} runs Python scripts only)")
        timeout_s = kwargs.get("timeout_s", 1)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 3600:
            raise InputError(f"timeout_s must be in (0, 3600] seconds, got {clip(timeout_s)}")
        gpu = kwargs.get("gpu")
        if isinstance(gpu, str) and gpu.strip().lower().endswith(".json"):
            roots.check("gpu", gpu)
        elif isinstance(gpu, str):
            from memlens.devicetime.gpus import gpu as known_gpu
            known_gpu(gpu)  # an unknown name is refused here, before any child starts
