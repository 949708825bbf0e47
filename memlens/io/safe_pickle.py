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
import struct
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


# argument layout of every opcode of protocols 0-5: a fixed byte count, or a kind of variable argument
_FIXED = {b"(": 0, b".": 0, b"0": 0, b"1": 0, b"2": 0, b"J": 4, b"K": 1, b"M": 2, b"N": 0, b"R": 0, b"}": 0,
          b"e": 0, b"]": 0, b"a": 0, b"b": 0, b"d": 0, b"l": 0, b"o": 0, b"s": 0, b"t": 0, b")": 0, b"u": 0,
          b"G": 8, b"\x80": 1, b"\x81": 0, b"\x82": 1, b"\x83": 2, b"\x84": 4, b"\x85": 0, b"\x86": 0,
          b"\x87": 0, b"\x88": 0, b"\x89": 0, b"\x8f": 0, b"\x90": 0, b"\x91": 0, b"\x92": 0, b"\x93": 0,
          b"\x94": 0, b"\x95": 8, b"\x97": 0, b"\x98": 0, b"h": 1, b"q": 1, b"j": 4, b"r": 4}
_LENGTH = {b"\x8a": 1, b"\x8c": 1, b"C": 1, b"U": 1, b"\x8b": 4, b"X": 4, b"B": 4, b"T": 4, b"\x8d": 8,
           b"\x8e": 8, b"\x96": 8}  # length-prefixed: size of the length field
_LINES = {b"I": 1, b"L": 1, b"F": 1, b"S": 1, b"V": 1, b"g": 1, b"p": 1, b"c": 2, b"i": 2}
_POPS_MARK = frozenset(b"etld1\x90\x91oiu")
# per opcode byte: ("fixed", n) / ("length", n) / ("lines", n) / None (unknown)
_TABLE = [None] * 256
for _table, _kind in ((_FIXED, 0), (_LENGTH, 1), (_LINES, 2)):
    for _op, _n in _table.items():
        _TABLE[_op[0]] = (_kind, _n)
# net stack effect of each opcode (ops that pop to a MARK are handled apart), from pickletools' descriptions
_NET = [0] * 256
for _opcode in __import__("pickletools").opcodes:
    if _opcode.name != "MARK" and __import__("pickletools").markobject not in _opcode.stack_before:
        _NET[ord(_opcode.code.encode("latin-1"))] = len(_opcode.stack_after) - len(_opcode.stack_before)
MAX_STACK = 1_000_000  # loose objects on the unpickler's stack: real pickles hold a few thousand at most
# nodes in the expansion of one tuple (it, its items, theirs, counted through shared references): hashing
# a tuple (a dict key) or printing it walks all of them, and a DAG of shared pairs 40 levels deep is a few
# hundred bytes of pickle with 2**40 nodes. Snapshot tuples are pairs (segment_pool_id). Each use of a tuple
# as a key then costs at most this many steps, so the work stays linear in the file's size.
MAX_TUPLE_NODES = 256
_TUPLE1, _TUPLE2, _TUPLE3, _TUPLE, _DUP = 0x85, 0x86, 0x87, 0x74, 0x32
_MEMO_OPS = frozenset((0x94, 0x68, 0x6A, 0x71, 0x72, 0x70, 0x67))  # MEMOIZE, GETs and PUTs


def too_many_loose_message() -> str:
    return f"pickle piles up more than {MAX_STACK:,} loose objects (a flood of tiny opcodes); not a memory snapshot"


def too_deep_message(nesting: int) -> str:
    return f"pickle nests more than {nesting} levels deep (set MEMLENS_MAX_NESTING to raise the limit)"


def tuple_too_big_message() -> str:
    return (f"pickle builds a tuple that expands to more than {MAX_TUPLE_NODES} items through shared references "
            "(a crafted file: hashing or printing it would never finish)")
_MEMOIZE, _BINGET, _LONG_BINGET, _BINPUT, _LONG_BINPUT, _MARK = 0x94, 0x68, 0x6A, 0x71, 0x72, 0x28
_PUT, _GET, _STOP = 0x70, 0x67, 0x2E


def check_opcodes(buf, path=None) -> None:
    """Walk the pickle opcodes of `buf` (bytes or mmap) without building objects; raise `InputError` for
    a memo index that is not the next free slot (or a reference to a slot never filled), a length field
    past the end of the data, MARKs nested deeper than `limits.max_nesting`, persistent ids, unknown
    opcodes, or data after STOP is missing. What passes can be given to the C unpickler without it
    allocating more than the data could describe (its memo table is sized by the largest index)."""
    nesting = limits.max_nesting()
    data = buf
    n = len(data)
    table, pops_mark = _TABLE, _POPS_MARK
    u32 = struct.Struct("<I").unpack_from
    u64 = struct.Struct("<Q").unpack_from
    pos = filled = depth = 0
    marks: list[int] = []
    # the stack as the weight of each object: the nodes of a tuple's expansion, 1 for anything else (only
    # tuples are hashed through their items); memo_weight: the same for each memo slot
    stack: list[int] = []
    memo_weight: list[int] = []
    net = _NET
    cap = MAX_TUPLE_NODES

    def bad(message):
        raise InputError(message, path)

    while True:
        if pos >= n:
            bad("pickle data is truncated (no STOP opcode)")
        op = data[pos]
        entry = table[op]
        if entry is None:
            bad(f"not a valid pickle (unknown opcode {op:#04x} at byte {pos})")
        kind, size = entry
        at = pos
        pos += 1
        if op == _MARK:
            marks.append(len(stack))
        elif op in pops_mark:
            if not marks:
                bad(f"not a valid pickle (no MARK for the opcode at byte {at})")
            mark = marks.pop()
            weight = 1 + sum(stack[mark:]) if op == _TUPLE else 1
            del stack[mark:]
            if op != 0x31:  # POP_MARK leaves nothing; the others one object
                stack.append(weight)
            if weight > cap:
                bad(tuple_too_big_message())
        elif _TUPLE1 <= op <= _TUPLE3:
            take = op - _TUPLE1 + 1
            weight = 1 + sum(stack[-take:])
            del stack[-take:]
            stack.append(weight)
            if weight > cap:
                bad(tuple_too_big_message())
        elif op == _DUP:
            stack.append(stack[-1] if stack else 1)
        elif op in _MEMO_OPS:
            pass  # below, with their argument
        else:
            change = net[op]
            if change > 0:
                stack.extend([1] * change)
                if len(stack) > MAX_STACK:
                    bad(too_many_loose_message())
            elif change < 0:
                del stack[change:]
        if kind == 0:
            if op == _MEMOIZE:
                filled += 1
                memo_weight.append(stack[-1] if stack else 1)
            elif op == _MARK:
                depth += 1
                if depth > nesting:
                    bad(too_deep_message(nesting))
            elif op in pops_mark:
                depth -= 1
            elif op == _STOP:
                return
            elif op == _BINGET or op == _LONG_BINGET or op == _BINPUT or op == _LONG_BINPUT:
                if pos + size > n:
                    bad("pickle data is truncated")
                index = data[pos] if size == 1 else u32(data, pos)[0]
                if op == _BINPUT or op == _LONG_BINPUT:
                    if index > filled:
                        bad(f"pickle memo index {index} at byte {at} skips ahead of the {filled} objects stored so "
                            "far (corrupt or crafted file)")
                    _put(memo_weight, index, stack)
                    filled = max(filled, index + 1)
                elif index >= filled:
                    bad(f"pickle refers to memo slot {index} at byte {at}, which was never stored (corrupt file)")
                else:
                    stack.append(memo_weight[index])
                    if len(stack) > MAX_STACK:
                        bad(too_many_loose_message())
            pos += size
        elif kind == 1:
            if pos + size > n:
                bad("pickle data is truncated")
            length = data[pos] if size == 1 else u32(data, pos)[0] if size == 4 else u64(data, pos)[0]
            pos += size + length
            if pos > n:
                bad(f"pickle data is truncated (a length field at byte {at} points past the end)")
        else:
            if op == 0x50:  # PERSID
                bad("refusing to unpickle: the file uses persistent ids")
            for _ in range(size):
                end = data.find(b"\n", pos)
                if end < 0:
                    bad("pickle data is truncated (a text argument has no end of line)")
                if op == _PUT or op == _GET:
                    try:
                        index = int(bytes(data[pos:end]).decode("ascii"))
                    except (ValueError, UnicodeDecodeError):
                        bad(f"pickle memo index at byte {at} is not a number")
                    if op == _PUT:
                        if index > filled or index < 0:
                            bad(f"pickle memo index {index} at byte {at} skips ahead of the {filled} objects stored "
                                "so far (corrupt or crafted file)")
                        _put(memo_weight, index, stack)
                        filled = max(filled, index + 1)
                    elif not 0 <= index < filled:
                        bad(f"pickle refers to memo slot {index} at byte {at}, which was never stored")
                    else:
                        stack.append(memo_weight[index])
                        if len(stack) > MAX_STACK:
                            bad(too_many_loose_message())
                pos = end + 1
        if op == 0x51:  # BINPERSID
            bad("refusing to unpickle: the file uses persistent ids")


def _put(memo_weight: list, index: int, stack: list) -> None:
    weight = stack[-1] if stack else 1
    if index == len(memo_weight):
        memo_weight.append(weight)
    else:
        memo_weight[index] = weight


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
