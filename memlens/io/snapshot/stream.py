"""A streaming reader for snapshot pickles that never holds all device-trace entries as Python dicts.

Unpickling a 100 MB snapshot the ordinary way builds ~450 MB of dicts and lists (each entry is a dict
with its own frames list). This reader interprets the pickle opcodes itself (the subset that builtin
containers and scalars use; nothing that imports or calls) and, whenever a batch of trace entries is
appended to a list (the pickler writes lists in batches of 1,000), converts them into typed columns
(`EntryColumns`) and drops them, together with their memo slots. A frames list's memo slot is replaced by
its stack id, so a later reference to the same list resolves to the id.

With a `CompiledStackInterner` the loop runs in C++ (memlens/io/native/stream_walk.cpp), which also converts
the entries and interns their frames there, and keeps only the memo slots that the stream reads again.

Anything outside the supported subset (a global, a reduce, an unknown opcode), any inconsistency, or a
corrupt stream makes `stream_snapshot` return None; the caller then uses the restricted C unpickler,
which gives the canonical error for bad files. The result is therefore never different from a full load, only cheaper.
"""
from __future__ import annotations

import gc
import mmap
import re
from array import array
from struct import Struct

from memlens import limits
from memlens.errors import InputError
from memlens.io.bounded_text import PlaceholderSeen
from memlens.io.safe_pickle import (MAX_STACK, MAX_TUPLE_NODES, too_deep_message, too_many_loose_message,
                                    tuple_too_big_message)
from memlens.io.snapshot.frames import CompiledStackInterner, StackInterner, StackRef, too_many_frames
from memlens.io.snapshot.limits import DUPLICATE_ENTRY, check_tuple, too_many_loose

MISSING = -(2**63)  # marks an absent/None integer field in EntryColumns
_U32, _I32, _U16, _F64, _U64 = Struct("<I"), Struct("<i"), Struct("<H"), Struct(">d"), Struct("<Q")
_INT_FIELDS = ("addr", "size", "stream", "time_us", "device_free")
_CODED_FIELDS = ("action", "compile_context", "user_metadata")
_RELEASED = object()  # memo slot of an entry already converted to columns
_GET_RUN = re.compile(rb"(?:j....)+", re.DOTALL)  # consecutive LONG_BINGET opcodes


class _Unsupported(Exception):
    """The stream uses something this reader does not interpret (the C unpickler will decide)."""


def _compiled_walk():
    """The compiled opcode loop, or None for the Python one (``MEMLENS_PICKLE_WALKER=python``, or no
    compiler here)."""
    from memlens.io import native

    if native.walker() == "python":
        return None
    try:
        return native.load().walk
    except native.NativeUnavailable:
        return None


def _walk_compiled(walk, data, interner: CompiledStackInterner, drop_read_pages: bool):
    """The compiled walk: the top-level object, with device trace lists as `EntryColumns`."""
    # the walk makes and frees millions of dicts and lists, none in a reference cycle: the cyclic collector
    # would only rescan the survivors again and again (a tenth of the walk's time)
    collecting = gc.isenabled()
    gc.disable()
    try:
        nesting = limits.max_nesting()
        messages = (too_many_loose_message(), too_deep_message(nesting), tuple_too_big_message(),
                    DUPLICATE_ENTRY)
        stack, depth, parts = walk(data, interner.frame_table, _Unsupported, InputError, messages, _RELEASED,
                                   MAX_STACK, nesting, MAX_TUPLE_NODES, drop_read_pages)
    finally:
        if collecting:
            gc.enable()
    if len(stack) != 1 or depth:
        raise _Unsupported("stack not balanced at STOP")
    columns = {id(target): EntryColumns.from_arrays(*arrays) for target, *arrays in parts}
    result = stack[0]
    if columns and type(result) is dict and type(result.get("device_traces")) is list:
        result["device_traces"] = [columns.get(id(t), t) for t in result["device_traces"]]
    elif columns:
        raise _Unsupported("entries outside device_traces")
    del parts  # the device trace lists stay alive (and their ids valid) until here
    return result


class EntryColumns:
    """The entries of one device trace as typed columns: int64 arrays for the integer fields (`MISSING`
    where absent) and, for the string fields, int32 codes into a table of the distinct values."""

    def __init__(self) -> None:
        self.ints = {name: array("q") for name in _INT_FIELDS}
        self.stack_id = array("q")
        self.codes = {name: array("i") for name in _CODED_FIELDS}
        self.names: dict[str, list] = {name: [] for name in _CODED_FIELDS}
        self._code_of: dict[str, dict] = {name: {} for name in _CODED_FIELDS}

    def __len__(self) -> int:
        return len(self.codes["action"])

    @classmethod
    def from_arrays(cls, ints: tuple, stack_ids: bytes, codes: tuple, names: tuple) -> "EntryColumns":
        """Columns from the compiled walker: int64 / int32 arrays as bytes (in `_INT_FIELDS` /
        `_CODED_FIELDS` order) and the distinct values of the coded fields."""
        cols = cls()
        for name, raw in zip(_INT_FIELDS, ints):
            cols.ints[name].frombytes(raw)
        cols.stack_id.frombytes(stack_ids)
        for name, raw, values in zip(_CODED_FIELDS, codes, names):
            cols.codes[name].frombytes(raw)
            cols.names[name] = values
        return cols

    def add(self, entries: list, interner: StackInterner, forget, memo_state: tuple) -> None:
        """Append `entries` (dicts); `forget(obj, replacement)` releases their memo slots, `memo_state` is
        the reader's (memo, memo_index), where the frame dicts' slots are released."""
        int_columns = [(self.ints[name], name) for name in _INT_FIELDS]
        coded = [(self.codes[name], self._code_of[name], self.names[name], name) for name in _CODED_FIELDS]
        stack_ids = self.stack_id
        taken: set[int] = set()  # this batch's entries so far: the first fault decides, as in the compiled walker
        for e in entries:
            if type(e) is not dict:
                raise _Unsupported("entry is not a dict")
            if id(e) in taken:  # the same entry dict again (GETs of it): each copy would be one more row
                raise InputError(DUPLICATE_ENTRY)
            taken.add(id(e))
            get = e.get
            for column, name in int_columns:
                value = get(name)
                if value is True or value is False:  # an int to array('q'); the dict path names it
                    raise _Unsupported("entry field is a bool")
                column.append(MISSING if value is None else value)
            for column, code_of, names, name in coded:
                value = get(name)
                code = code_of.get(value)
                if code is None:
                    code = code_of[value] = len(names)
                    names.append(value)
                column.append(code)
            frames = get("frames")
            sid = interner.intern(frames, forget)  # frees the frame dicts of a new stack
            if type(frames) is list and frames:
                forget(frames, StackRef(sid))  # later references to this list resolve to the id
            stack_ids.append(sid)
            forget(e, _RELEASED)
        interner.release(*memo_state)


def _is_entry(obj) -> bool:
    return type(obj) is dict and "action" in obj


def stream_snapshot(data, interner: StackInterner | CompiledStackInterner, drop_read_pages: bool = False):
    """Parse snapshot pickle bytes (bytes/mmap); device-trace lists come back as `EntryColumns`.
    `drop_read_pages`: `data` is a read-only (``ACCESS_READ``) mmap of a file, whose pages the compiled
    walker may give back to the kernel once read (they stay in the page cache; a later read faults them
    in again), so that the file does not count in the resident set twice over; never for a private or
    writable mapping, whose changes that would discard.
    A `CompiledStackInterner` selects the compiled walker (when it is not there, the Python loop runs
    with a `StackInterner` in its place: the caller's interner then stays empty, so pass one from
    `memlens.io.snapshot.frames.new_stack_interner`).

    Returns None when the stream needs the general unpickler (see module docstring)."""
    try:
        if isinstance(interner, CompiledStackInterner):
            walk = _compiled_walk()
            if walk is None:
                raise _Unsupported("compiled interner without the compiled walker")
            return _walk_compiled(walk, data, interner, drop_read_pages and isinstance(data, mmap.mmap))
        return _parse(data, interner)
    except InputError:  # a limit was hit: the general unpickler would only spend more memory on it
        raise
    except (_Unsupported, IndexError, KeyError, TypeError, ValueError, AttributeError, OverflowError,
            UnicodeDecodeError, MemoryError, RecursionError, PlaceholderSeen):
        # PlaceholderSeen: an interned frames list was used where its content is needed (as a frame): its
        # memo slot holds a stand-in, so the general unpickler, which keeps the list, reads the file
        return None
    except Exception as exc:  # struct.error and friends: treat as corrupt
        if type(exc).__name__ == "error":
            return None
        raise


def _parse(data, interner: StackInterner):
    n = len(data)
    memo: list = []
    memo_index: dict[int, int] = {}   # id(container) -> memo slot, until the container is converted
    columns: dict[int, EntryColumns] = {}  # id(device trace list) -> its columns
    keep: list = []                   # device trace lists, so that their ids stay valid
    stack: list = []
    metastack: list = []
    pos = 0
    u32, i32, u16 = _U32.unpack_from, _I32.unpack_from, _U16.unpack_from
    run_of_gets = _GET_RUN.match
    get_formats: dict[int, Struct] = {}
    max_frames = interner.max_frames
    nesting = limits.max_nesting()
    room = MAX_STACK  # loose objects the current MARK level may hold: the limit less those of the levels below

    def check_frames(target, items):
        # a frames list longer than the limit is refused while it grows, before it costs memory
        if len(target) + len(items) > max_frames and items and (
                type(items[0]) is dict and "filename" in items[0] or interner.is_read_frame(items[0])):
            raise too_many_frames(len(target) + len(items), max_frames)

    def forget(obj, replacement):
        slot = memo_index.pop(id(obj), None)
        if slot is not None:
            memo[slot] = replacement

    def take_entries(target, items):
        cols = columns.get(id(target))
        if cols is None:
            if target:
                raise _Unsupported("entries appended to a list that holds other items")
            cols = columns[id(target)] = EntryColumns()
            keep.append(target)
        cols.add(items, interner, forget, (memo, memo_index))

    def need(count):
        if pos + count > n:
            raise _Unsupported("truncated")

    # branches are ordered by how often snapshot pickles use each opcode
    while True:
        op = data[pos]
        pos += 1
        if op == 0x6A:    # LONG_BINGET, usually a run of them (a frames list): resolve the run at C speed
            end = run_of_gets(data, pos - 1).end()
            count = (end - pos + 1) // 5
            if len(stack) + count > room:  # before the references are made
                raise too_many_loose()
            fmt = get_formats.get(count)
            if fmt is None:
                fmt = get_formats[count] = Struct("<" + "xI" * count)
            values = list(map(memo.__getitem__, fmt.unpack_from(data, pos - 1)))
            if _RELEASED in values:  # an entry read again: refused, as the same entry twice in a batch
                raise InputError(DUPLICATE_ENTRY)
            stack.extend(values)
            pos = end
        elif op == 0x68:  # BINGET
            value = memo[data[pos]]
            if value is _RELEASED:
                raise InputError(DUPLICATE_ENTRY)
            stack.append(value)
            pos += 1
            if len(stack) > room:
                raise too_many_loose()
        elif op == 0x94:  # MEMOIZE
            top = stack[-1]
            if type(top) is dict or type(top) is list:
                memo_index[id(top)] = len(memo)
            memo.append(top)
        elif op == 0x28:  # MARK
            if len(metastack) >= nesting:
                raise InputError(too_deep_message(nesting))
            metastack.append(stack)
            room -= len(stack)
            stack = []
        elif op == 0x8A:  # LONG1
            size = data[pos]
            need(size + 1)
            stack.append(int.from_bytes(data[pos + 1:pos + 1 + size], "little", signed=True))
            pos += 1 + size
        elif op == 0x4A:  # BININT
            stack.append(i32(data, pos)[0])
            pos += 4
        elif op == 0x7D:  # EMPTY_DICT
            stack.append({})
            if len(stack) > room:
                raise too_many_loose()
        elif op == 0x75:  # SETITEMS
            items = stack
            stack = metastack.pop()
            room += len(stack)
            target = stack[-1]
            if type(target) is not dict:
                raise _Unsupported("SETITEMS on a non-dict")
            target.update(zip(items[::2], items[1::2]))
        elif op == 0x4B:  # BININT1
            stack.append(data[pos])
            pos += 1
            if len(stack) > room:
                raise too_many_loose()
        elif op == 0x5D:  # EMPTY_LIST
            stack.append([])
            if len(stack) > room:
                raise too_many_loose()
        elif op == 0x65:  # APPENDS
            items = stack
            stack = metastack.pop()
            room += len(stack)
            target = stack[-1]
            if type(target) is not list:
                raise _Unsupported("APPENDS on a non-list")
            if items and _is_entry(items[0]):
                take_entries(target, items)
            else:
                check_frames(target, items)
                target.extend(items)
        elif op == 0x8C:  # SHORT_BINUNICODE
            size = data[pos]
            need(size + 1)
            stack.append(str(data[pos + 1:pos + 1 + size], "utf-8", "surrogatepass"))
            pos += 1 + size
        elif op == 0x4D:  # BININT2
            stack.append(u16(data, pos)[0])
            pos += 2
        elif op == 0x61:  # APPEND
            value = stack.pop()
            target = stack[-1]
            if type(target) is not list:
                raise _Unsupported("APPEND on a non-list")
            if _is_entry(value):
                take_entries(target, [value])
            else:
                check_frames(target, [value])
                target.append(value)
        elif op == 0x73:  # SETITEM
            value = stack.pop()
            key = stack.pop()
            if type(stack[-1]) is not dict:
                raise _Unsupported("SETITEM on a non-dict")
            stack[-1][key] = value
        elif op == 0x4E:  # NONE
            stack.append(None)
            if len(stack) > room:
                raise too_many_loose()
        elif op == 0x88:  # NEWTRUE
            stack.append(True)
            if len(stack) > room:
                raise too_many_loose()
        elif op == 0x89:  # NEWFALSE
            stack.append(False)
            if len(stack) > room:
                raise too_many_loose()
        elif op == 0x47:  # BINFLOAT
            stack.append(_F64.unpack_from(data, pos)[0])
            pos += 8
        elif op == 0x58:  # BINUNICODE
            size = u32(data, pos)[0]
            need(size + 4)
            stack.append(str(data[pos + 4:pos + 4 + size], "utf-8", "surrogatepass"))
            pos += 4 + size
        elif op == 0x95:  # FRAME: a transport boundary, no object
            pos += 8
        elif op == 0x29:  # EMPTY_TUPLE
            stack.append(())
            if len(stack) > room:
                raise too_many_loose()
        elif op == 0x85:  # TUPLE1
            if type(stack[-1]) is tuple:
                check_tuple((stack[-1],))
            stack[-1:] = [(stack[-1],)]
        elif op == 0x86:  # TUPLE2
            items = tuple(stack[-2:])
            if tuple in map(type, items):
                check_tuple(items)
            stack[-2:] = [items]
        elif op == 0x87:  # TUPLE3
            items = tuple(stack[-3:])
            if tuple in map(type, items):
                check_tuple(items)
            stack[-3:] = [items]
        elif op == 0x74:  # TUPLE (from mark)
            items = tuple(stack)
            if len(items) >= MAX_TUPLE_NODES or tuple in map(type, items):
                check_tuple(items)
            stack = metastack.pop()
            room += len(stack)
            stack.append(items)
        elif op == 0x71 or op == 0x72:  # BINPUT / LONG_BINPUT (protocols 1-3)
            if op == 0x71:
                slot = data[pos]
                pos += 1
            else:
                slot = u32(data, pos)[0]
                pos += 4
            if slot != len(memo):
                raise _Unsupported("memo slots out of order")
            top = stack[-1]
            if type(top) is dict or type(top) is list:
                memo_index[id(top)] = slot
            memo.append(top)
        elif op == 0x80:  # PROTO
            if data[pos] > 5:
                raise _Unsupported("unknown protocol")
            pos += 1
        elif op == 0x2E:  # STOP
            break
        else:
            raise _Unsupported(f"opcode {op:#x}")
    if len(stack) != 1 or metastack:
        raise _Unsupported("stack not balanced at STOP")
    result = stack[0]
    if columns and type(result) is dict and type(result.get("device_traces")) is list:
        result["device_traces"] = [columns.get(id(t), t) for t in result["device_traces"]]
    elif columns:
        raise _Unsupported("entries outside device_traces")
    del keep
    return result
