"""Exceptions memlens raises on purpose.

`InputError` means the user's input is at fault (missing file, wrong format, bad option); the CLI turns
it into a one-line message and exit code 2. Anything else escaping a command is an internal error
(exit code 1).
"""
from __future__ import annotations

import contextlib
import os
import unicodedata

# C0/C1 controls, and format characters such as bidi overrides (U+202E) and zero-width joiners
_UNSAFE_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}


def printable(text: str) -> str:
    """`text` with every control, bidi/format, separator or unassigned character written as an escape
    (``\\x1b``, ``\\u202e``), so that a message built from a hostile file's content cannot drive a
    terminal or reorder text. Printable characters, including non-ASCII letters, are kept."""
    text = str(text)
    if text.isprintable() and text.isascii():
        return text
    out = []
    for ch in text:
        if ch == " " or (ch.isprintable() and unicodedata.category(ch) not in _UNSAFE_CATEGORIES):
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                       else f"\\U{code:08x}")
    return "".join(out)


def visible_format_chars(text: str) -> str:
    """`text` with invisible format characters (category Cf: bidi overrides such as U+202E that reorder
    what follows, zero-width characters) and C0/C1 controls other than tab and newline written as
    visible ``\\uXXXX`` text. For HTML and other output where newlines must stay."""
    text = str(text)
    if text.isascii() and text.isprintable():
        return text
    return "".join(ch if ch in "\t\n" or unicodedata.category(ch) not in ("Cf", "Cc") else f"\\u{ord(ch):04x}"
                   for ch in text)


# ASCII controls other than tab and newline, as escapes: the fast path of `terminal_text`
_ASCII_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0, 9), *range(11, 32), 127]}
_LINE_UNSAFE = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def terminal_text(text: str) -> str:
    """`text` as it may reach a terminal: tabs and newlines kept, every other control character, format
    character (bidi overrides, zero-width), lone surrogate and line/paragraph separator written as an escape.
    The one escaping path of everything memlens prints (`EscapedStream`)."""
    if text.isascii():
        return text.translate(_ASCII_CONTROLS)
    return "".join(ch if ch in "\t\n" or unicodedata.category(ch) not in _LINE_UNSAFE else
                   (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}" if ord(ch) < 0x10000
                    else f"\\U{ord(ch):08x}") for ch in text)


class EscapedStream:
    """A text stream (the CLI's stdout) whose every write goes through `terminal_text`, so that no name read
    from a trace or input file can print a raw control character. Other attributes (``buffer``, ``fileno``,
    ``flush``) are the wrapped stream's: binary writers and the MCP transport bypass it."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text) -> int:
        return self._stream.write(terminal_text(str(text)))

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class MemlensError(Exception):
    """Base class of memlens's own errors."""


class InputError(MemlensError, ValueError):
    """Bad input: names the file (when there is one) and what is wrong with it."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        self.path = None if path is None else os.fspath(path)
        self.message = message
        super().__init__(printable(f"{self.path}: {message}" if self.path else message))


class NeedsAccessesError(InputError):
    """An analysis that needs per-access data was given a trace without accesses."""


@contextlib.contextmanager
def reading_file(path):
    """Turn the ways reading the file at `path` can fail (missing, a directory, unreadable, too large for
    memory) into one-line `InputError`s naming it."""
    try:
        yield
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror or exc})", path) from None
    except MemoryError:
        raise InputError("file is too large to read into memory", path) from None


def _kind(mode: int) -> str:
    import stat
    return ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def check_user_file(path, max_bytes: int | None = None, what: str = "file") -> int:
    """Size in bytes of the regular file at `path` (symlinks followed), or `InputError` naming it: missing,
    not a regular file (a FIFO blocks until a writer comes, a device such as /dev/zero never ends), or larger
    than `max_bytes` (`what` names the file's kind in the message)."""
    import stat
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"no such {what if what.endswith('file') else 'file'}", path) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read ({getattr(exc, 'strerror', None) or exc})", path) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"is a directory, not a {what}", path)
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"is {_kind(st.st_mode)}, not a {what} memlens can read (save it to a file first)", path)
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputError(f"{st.st_size:,} bytes: a {what} holds at most {max_bytes:,}", path)
    return st.st_size


def read_user_file(path, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes`; every other case an `InputError` naming
    the file (see `check_user_file`). The file is opened without blocking and checked again on the open
    descriptor, so a FIFO or device swapped in after the first check is refused too."""
    import stat
    check_user_file(path, max_bytes, what)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror or exc})", path) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"is {_kind(os.fstat(fd).st_mode)}, not a {what} memlens can read", path)
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError(f"over {max_bytes:,} bytes: a {what} holds at most {max_bytes:,}", path)
    return data
