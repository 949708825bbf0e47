"""Load a pickle from a stranger without letting it run code.

A pickle can name any importable callable (``os.system``, ``subprocess.Popen``) and have the loader call
it. CUDA memory snapshots only ever hold dicts, lists, tuples, strings, numbers, booleans and None, all
of which the pickle format builds with its own opcodes. The restricted unpickler below therefore refuses
every global lookup except a handful of harmless builtin containers, so a crafted file fails with a clear
`InputError` before anything runs.

Files are read through `mmap` (or decompressed when gzip), so that no length field in a corrupt file can
make the loader allocate more than the file holds: a length past the end is reported as truncation.
"""
from __future__ import annotations

import builtins
import gzip
import io
import mmap
import pickle
import zlib
from contextlib import contextmanager
from pathlib import Path

from memlens.errors import InputError

# the only globals a snapshot-like pickle may name: builtin containers/scalars with no side effects
_ALLOWED_GLOBALS = {
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"), ("builtins", "complex"),
    ("builtins", "slice"), ("__builtin__", "set"), ("__builtin__", "frozenset"),
}


class ForbiddenGlobal(pickle.UnpicklingError):
    """The pickle asked for a global that is not a builtin container or scalar."""

    def __init__(self, module: str, name: str):
        self.qualname = f"{module}.{name}"
        super().__init__(self.qualname)


class RestrictedUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` (the C implementation) that resolves no globals but builtin containers."""

    def find_class(self, module, name):
        if (module, name) in _ALLOWED_GLOBALS:
            return getattr(builtins, name)
        raise ForbiddenGlobal(module, name)

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not allowed")


class _MmapReader:
    """The file interface the C unpickler needs (read/readinto/readline/peek), over an mmap."""

    def __init__(self, mm: mmap.mmap):
        self._mm = mm

    def read(self, n: int = -1) -> bytes:
        return self._mm.read(n)

    def readline(self) -> bytes:
        return self._mm.readline()

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")
        data = self._mm.read(len(view))
        view[:len(data)] = data
        return len(data)

    def peek(self, n: int = 0) -> bytes:
        pos = self._mm.tell()
        return self._mm[pos:pos + max(n, 1)]


def _run(unpickler: RestrictedUnpickler, path):
    try:
        return unpickler.load()
    except ForbiddenGlobal as exc:
        raise InputError(f"refusing to unpickle: the file asks to call or import '{exc.qualname}' "
                         "(only builtin containers and scalars are allowed, and a memory snapshot needs "
                         "nothing else)", path) from None
    except RecursionError:
        raise InputError("pickle is nested too deeply to be a memory snapshot", path) from None
    except MemoryError:
        raise InputError("pickle declares objects too large to load (corrupt length field?)", path) from None
    except EOFError:
        raise InputError("pickle data is truncated (ran out of input)", path) from None
    except Exception as exc:  # the C unpickler raises many types on corrupt input
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "truncat" in msg:
            raise InputError("pickle data is truncated", path) from None
        raise InputError(f"not a valid pickle ({type(exc).__name__}: {msg[:200]})", path) from None


@contextmanager
def pickle_buffer(path):
    """Context manager giving the pickle bytes of `path`: an mmap of the file, or the decompressed
    bytes of a gzip file. Raises `InputError` when missing, unreadable, empty or corrupt gzip."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror or exc})", path) from None
    with f:
        head = f.read(2)
        if not head:
            raise InputError("file is empty", path)
        if head == b"\x1f\x8b":
            f.seek(0)
            try:
                data = gzip.decompress(f.read())
            except (OSError, EOFError, zlib.error) as exc:
                raise InputError(f"gzip data is corrupt or truncated ({exc})", path) from None
            if not data:
                raise InputError("file is empty (after gzip decompression)", path)
            yield data
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield mm


def loads_buffer(buf, path=None):
    """Unpickle a buffer from `pickle_buffer` (or any bytes) with the restricted unpickler."""
    if isinstance(buf, mmap.mmap):
        buf.seek(0)
        return _run(RestrictedUnpickler(_MmapReader(buf)), path)
    return _run(RestrictedUnpickler(io.BytesIO(buf)), path)


def load_pickle(path):
    """Load the pickle at `path` (plain or gzip-compressed) with the restricted unpickler.

    Raises `InputError` naming the file when it is missing, empty, truncated, corrupt, or asks for any
    global beyond builtin containers.
    """
    with pickle_buffer(path) as buf:
        return loads_buffer(buf, path)
