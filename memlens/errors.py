"""Exceptions memlens raises on purpose.

`InputError` means the user's input is at fault (missing file, wrong format, bad option); the CLI turns
it into a one-line message and exit code 2. Anything else escaping a command is an internal error
(exit code 1).
"""
from __future__ import annotations

import os


class MemlensError(Exception):
    """Base class of memlens's own errors."""


class InputError(MemlensError, ValueError):
    """Bad input: names the file (when there is one) and what is wrong with it."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        self.path = None if path is None else os.fspath(path)
        self.message = message
        super().__init__(f"{self.path}: {message}" if self.path else message)


class NeedsAccessesError(InputError):
    """An analysis that needs per-access data was given a trace without accesses."""
