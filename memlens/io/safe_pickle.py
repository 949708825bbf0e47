"""Load a pickle from a stranger without letting it run code.

A pickle can name any importable callable (``os.system``, ``subprocess.Popen``) and have the loader call
it. CUDA memory snapshots only ever hold dicts, lists, tuples, strings, numbers, booleans and None, all
of which the pickle format builds with its own opcodes. The restricted unpickler below therefore refuses
every global lookup except a handful of harmless builtin containers, so a crafted file fails with a clear
`InputError` before anything runs.

Files are read through `mmap` (or decompressed when gzip, up to `memlens.limits.max_decompressed` bytes,
counted before anything is kept), and before the C unpickler runs, `check_opcodes` walks the opcodes
without building objects: memo indices must be dense (a huge ``LONG_BINPUT`` index would make the C
unpickler allocate gigabytes for its memo table), every length field must fit in the bytes that remain,
and MARKs may nest only `memlens.limits.max_nesting` deep. The loaded object's nesting is checked too.
`bytearray` is not among the allowed globals: ``bytearray(2**32)`` is a 32-byte pickle.
"""
from __future__ import annotations

import builtins
import mmap
import pickle
import pickletools
from contextlib import contextmanager
from pathlib import Path

from memlens import limits
from memlens.errors import InputError
from memlens.io.gzipfile import gunzip_limited

# the only globals a snapshot-like pickle may name: builtin containers/scalars with no side effects
_ALLOWED_GLOBALS = {
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"),
    ("__builtin__", "set"), ("__builtin__", "frozenset"),
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


_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_MEMOIZE = "MEMOIZE"


def check_opcodes(buf, path=None) -> None:
    """Walk the pickle opcodes of `buf` (bytes or mmap) without building objects; raise `InputError` for
    a memo index that is not the next free slot (or a reference to a slot never filled), a length field
    past the end of the data, MARKs nested deeper than `limits.max_nesting`, persistent ids, or a
    corrupt stream. What passes can be given to the C unpickler without it allocating more than the
    data could describe."""
    nesting = limits.max_nesting()
    stream = buf if isinstance(buf, mmap.mmap) else _ViewReader(buf)
    if isinstance(buf, mmap.mmap):
        buf.seek(0)
    filled = 0
    depth = 0
    try:
        for opcode, arg, pos in pickletools.genops(stream):
            name = opcode.name
            if name in _PUTS:
                if not isinstance(arg, int) or arg < 0 or arg > filled:
                    raise InputError(f"pickle memo index {arg} at byte {pos} skips ahead of the {filled} "
                                     "objects stored so far (corrupt or crafted file)", path)
                filled = max(filled, arg + 1)
            elif name == _MEMOIZE:
                filled += 1
            elif name in _GETS:
                if not isinstance(arg, int) or arg < 0 or arg >= filled:
                    raise InputError(f"pickle refers to memo slot {arg} at byte {pos}, which was never "
                                     "stored (corrupt file)", path)
            elif name in ("PERSID", "BINPERSID"):
                raise InputError("refusing to unpickle: the file uses persistent ids", path)
            if name == "MARK":
                depth += 1
                if depth > nesting:
                    raise InputError(f"pickle nests more than {nesting} levels deep (set MEMLENS_MAX_NESTING "
                                     "to raise the limit)", path)
            elif pickletools.markobject in opcode.stack_before:
                depth -= 1
    except InputError:
        raise
    except Exception as exc:  # genops raises ValueError for truncated/unknown opcodes
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "remain" in msg or "truncat" in msg or "EOF" in msg or "end of" in msg:
            raise InputError("pickle data is truncated (a length field points past the end)", path) from None
        raise InputError(f"not a valid pickle ({msg[:160]})", path) from None
    finally:
        if isinstance(buf, mmap.mmap):
            buf.seek(0)


class _ViewReader:
    """The same file interface over bytes/bytearray, without copying them (io.BytesIO copies a bytearray)."""

    def __init__(self, data):
        self._view = memoryview(data).cast("B")
        self._pos = 0

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        out = self._view[self._pos:end].tobytes()
        self._pos = end
        return out

    def readline(self) -> bytes:
        end, step, size = self._pos, 4096, len(self._view)
        while end < size:
            chunk = self._view[end:end + step].tobytes()
            nl = chunk.find(b"\n")
            if nl >= 0:
                end += nl + 1
                break
            end += len(chunk)
            step *= 2
        return self.read(end - self._pos)

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def peek(self, n: int = 0) -> bytes:
        return self._view[self._pos:self._pos + max(n, 1)].tobytes()


def _reader(buf):
    if isinstance(buf, mmap.mmap):
        buf.seek(0)
        return _MmapReader(buf)
    return _ViewReader(buf)


def _run(unpickler: RestrictedUnpickler, path):
    try:
        obj = unpickler.load()
        limits.check_nesting(obj, path)
        return obj
    except InputError:
        raise
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
            data = gunzip_limited(f, path)
            if not data:
                raise InputError("file is empty (after gzip decompression)", path)
            yield data
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield mm


def loads_buffer(buf, path=None):
    """Unpickle a buffer from `pickle_buffer` (or any bytes) with the restricted unpickler, after
    `check_opcodes` has cleared it."""
    check_opcodes(buf, path)
    return _run(RestrictedUnpickler(_reader(buf)), path)


def load_pickle(path):
    """Load the pickle at `path` (plain or gzip-compressed) with the restricted unpickler.

    Raises `InputError` naming the file when it is missing, empty, truncated, corrupt, or asks for any
    global beyond builtin containers.
    """
    with pickle_buffer(path) as buf:
        return loads_buffer(buf, path)
