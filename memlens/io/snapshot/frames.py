"""Stack frames of CUDA memory snapshots: deduplicated into the `stacks` table, with per-stack hints.

Snapshots repeat the same stacks thousands of times (torch shares the frame dicts, so the unpickled
objects are shared too). `StackInterner` turns each entry's ``frames`` list into a small integer id, first
by the identities of its frame dicts (C-speed ``map(id, ...)``), and only for new identities by content,
so a 100 MB snapshot's millions of frame references cost one tuple and one dict lookup per entry. It keeps
no reference to the lists themselves (only to one list per distinct identity tuple), so that the
streaming reader can drop each entry once converted.

`CompiledStackInterner` is the same interner in C++ (memlens/io/native/stream_walk.cpp), which the compiled
pickle walker feeds directly: names and file names are interned once, each distinct stack is a run of
(name id, filename id, line) rows, so no Python object is kept per frame; the `stacks` table is built from
those arrays with numpy.
`new_stack_interner` picks the one that goes with the walker in use. Both read every frame by the same
rules (`read_odd_frame` for anything but the usual dict), give the same ids in the same order, and count
repairs once per stack as written (`repair_key`).

Frame order follows the snapshot: ``frames[0]`` is the innermost frame (the allocator itself, or the
innermost Python function for Python-only stacks), which becomes depth 0 in `stacks`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter

import numpy as np
import pandas as pd
import pyarrow as pa

from memlens import limits
from memlens.errors import InputError
from memlens.io.bounded_text import Placeholder
from memlens.io.snapshot.odd_frames import _INT64_MAX, read_odd_frame, repair_key  # noqa: F401 (re-exported)

NO_STACK = -1


@dataclass
class StackCodes:
    """The `stacks` table's name and filename columns as codes into arrays of distinct str (what
    `pd.factorize` gives, without hashing millions of strings again): row i's name is
    ``names[name_codes[i]]``. Valid for the table's rows in (stack_id, depth) order."""

    name_codes: np.ndarray
    names: np.ndarray     # object array of str
    file_codes: np.ndarray
    files: np.ndarray     # object array of str
    op_candidates: np.ndarray | None = None  # codes of the names starting "at::_ops::" (None: not known)
    # the plain names (ASCII, no newline) as (bool per name, Arrow string array of those), when known
    plain_names: tuple[np.ndarray, pa.Array] | None = None


class StackRef(Placeholder):
    """Stands for a frames list that was already interned (the streaming reader's memo holds these). Only
    an entry's or a block's ``frames`` may hold one; read anywhere else it raises `PlaceholderSeen`."""

    __slots__ = ("sid",)

    def __init__(self, sid: int):
        self.sid = sid

# `at::_ops::zeros_like::call(...)` -> the ATen operator the user called (outermost such frame)
_ATEN_OP = re.compile(r"^at::_ops::([A-Za-z0-9_]+)::call\b")


class StackInterner:
    """Maps frame lists to dense stack ids (0, 1, ...); identical content gets the same id."""

    def __init__(self) -> None:
        self._by_ids: dict[tuple, int] = {}
        self._by_content: dict[tuple, int] = {}
        self._keepalive: list = []  # frames whose ids are keys above must stay alive
        self._pending: list = []  # (ids, frames, stack id) of lists whose dicts `release` will let go
        self._read_ids: set[int] = set()  # ids of the frame tuples `release` put in place of dicts (kept
        # alive by `_content`): such a tuple is a frame already read, any other tuple an odd frame
        self._odd_ids: set[int] = set()  # ids of odd frame dicts (`release` keeps them: their repairs are
        # counted again in each new stack that holds them)
        self._new_unknown = 0  # repairs seen while reading the list being interned
        self._new_odd = 0
        self._repairs_seen: set[tuple] = set()  # `repair_key`s already counted
        self._content: list[tuple] = []  # stack_id -> tuple of (name, filename, line)
        self.unknown_lines = 0  # frames whose line was negative, beyond int64 (C++ frames write -1 as
        # an unsigned 2**64-1) or not a number: kept with line 0, "unknown", as for other C++ frames
        self.odd_frames = 0  # frames that were not dicts (kept as a frame named by their text)
        self.max_frames = limits.max_frames()
        self._done = False

    def __len__(self) -> int:
        return len(self._content)

    def done_interning(self) -> None:
        """Free the lookups (every stack is interned); `table` and the counts stay, `intern` refuses."""
        self._done = True
        for lookup in (self._by_ids, self._by_content, self._read_ids, self._odd_ids):
            lookup.clear()
        self._keepalive.clear()

    def intern(self, frames, forget=None) -> int:
        """Stack id of `frames` (a list of {"name", "filename", "line"} dicts); `NO_STACK` when empty.

        With `forget` true (the streaming reader), a newly seen list of frame dicts is not kept to the end
        of the import: `release` lets its dicts go."""
        if self._done:
            raise RuntimeError("done_interning() ran: no more stacks can be interned")
        if not frames:
            return NO_STACK
        if type(frames) is StackRef:
            return frames.sid
        if type(frames) not in (list, tuple):
            self.odd_frames += 1
            return NO_STACK
        if len(frames) > self.max_frames:
            raise too_many_frames(len(frames), self.max_frames)
        ids = tuple(map(id, frames))
        sid = self._by_ids.get(ids)
        if sid is None:
            self._new_unknown = self._new_odd = 0
            content = tuple(map(self._frame, frames))
            sid = self._by_content.get(content)
            if sid is None:
                sid = len(self._content)
                self._by_content[content] = sid
                self._content.append(content)
            if self._new_unknown or self._new_odd:  # counted once per stack as written
                key = repair_key(sid, frames)
                if key not in self._repairs_seen:
                    self._repairs_seen.add(key)
                    self.unknown_lines += self._new_unknown
                    self.odd_frames += self._new_odd
            self._by_ids[ids] = sid
            if forget is not None and type(frames) is list and self._all_frames(frames):
                self._pending.append((ids, frames, sid))  # released by `release(forget)`
            else:
                self._keepalive.append(frames)
        return sid

    def is_read_frame(self, obj) -> bool:
        """True for a frame tuple that `release` put in place of a frame dict."""
        return type(obj) is tuple and id(obj) in self._read_ids

    def _all_frames(self, frames: list) -> bool:
        """Every item a frame dict or a frame already read (not some other object)."""
        types = set(map(type, frames))
        if types == {dict}:
            return True
        read = self._read_ids
        return types <= {dict, tuple} and all(id(f) in read for f in frames if type(f) is tuple)

    def release(self, memo: list, memo_index: dict) -> None:
        """Let the frame dicts of the stacks interned with `forget` since the last call be freed: each is
        replaced by its frame tuple in its list and in the streaming reader's memo (`memo_index`: id of a
        container -> its memo slot), and
        the identity key moves from the dicts' ids (which a freed dict would leave to be reused) to the
        frame tuples' ids (kept alive by `_content`). Called after each batch of entries, so that lists
        within a batch sharing frame dicts still hit the identity key."""
        by_ids, contents, pop = self._by_ids, self._content, memo_index.pop
        for ids, frames, sid in self._pending:
            content = contents[sid]
            if self._odd_ids and not self._odd_ids.isdisjoint(ids):  # odd dicts stay (see `_odd_ids`)
                self._keepalive.append(frames)
                continue
            for slot, read in zip(map(pop, ids, repeat(None)), content):  # only dicts have memo_index slots
                if slot is not None:
                    memo[slot] = read
            frames[:] = content
            del by_ids[ids]
            content_ids = tuple(map(id, content))
            by_ids[content_ids] = sid
            self._read_ids.update(content_ids)
        self._pending.clear()

    def _frame(self, f) -> tuple[str, str, int]:
        """(name, filename, line) of one frame dict; anything unreadable becomes "unknown" and is counted."""
        if type(f) is dict:  # the usual frame, answered without the checks below
            name, filename, line = f.get("name", ""), f.get("filename", ""), f.get("line")
            if type(line) is int and 0 <= line <= _INT64_MAX and type(name) is str and type(filename) is str:
                return (name, filename, line)
        elif type(f) is tuple and id(f) in self._read_ids:  # a frame already read (see `release`)
            return f
        return self._odd_frame(f)

    def _odd_frame(self, f) -> tuple[str, str, int]:
        name, filename, line, unknown, odd = read_odd_frame(f)
        self._new_unknown += unknown
        self._new_odd += odd
        if type(f) is dict:
            self._odd_ids.add(id(f))
        return (name, filename, line)

    def intern_many(self, frame_lists) -> np.ndarray:
        """Stack ids (int64, `NO_STACK` for none) of an iterable of frame lists."""
        intern = self.intern
        return np.fromiter((intern(f) for f in frame_lists), dtype=np.int64)

    def table(self) -> pd.DataFrame:
        """The `stacks` table: one row per (stack_id, depth), depth 0 innermost."""
        lengths = np.fromiter((len(c) for c in self._content), dtype=np.int64, count=len(self._content))
        flat = list(chain.from_iterable(self._content))
        names, files = (_objects(list(map(itemgetter(k), flat))) for k in range(2))
        lines = np.fromiter(map(itemgetter(2), flat), dtype=np.int64, count=len(flat))
        return _stacks_table(lengths, names, files, lines)

    def table_and_codes(self) -> tuple[pd.DataFrame, StackCodes]:
        """The `stacks` table and its `StackCodes`."""
        table = self.table()
        name_codes, names = pd.factorize(table["name"].to_numpy(dtype=object))
        file_codes, files = pd.factorize(table["filename"].to_numpy(dtype=object))
        return table, StackCodes(name_codes, _objects(list(names)), file_codes, _objects(list(files)))

    def hints(self) -> pd.DataFrame:
        """Per stack: `op` and `location` (see `stack_hints`)."""
        table, codes = self.table_and_codes()
        return stack_hints(table, codes, len(self))


class CompiledStackInterner:
    """`StackInterner` in C++ (memlens/io/native/stream_walk.cpp ``FrameTable``): the same ids, table,
    repairs and limits; the compiled walker interns into `frame_table` without calling back."""

    def __init__(self) -> None:
        from memlens.io import native

        self.max_frames = limits.max_frames()
        self.frame_table = native.load().FrameTable(self.max_frames, read_odd_frame, too_many_frames, StackRef,
                                                    repair_key)

    def __len__(self) -> int:
        return self.frame_table.counts()[2]

    @property
    def unknown_lines(self) -> int:
        return self.frame_table.counts()[0]

    @property
    def odd_frames(self) -> int:
        return self.frame_table.counts()[1]

    def intern(self, frames) -> int:
        """Stack id of `frames` (see `StackInterner.intern`)."""
        return self.frame_table.intern(frames)

    def done_interning(self) -> None:
        """Free the lookups (every stack is interned); `table` and the counts stay, `intern` refuses."""
        self.frame_table.drop_index()

    def intern_many(self, frame_lists) -> np.ndarray:
        """Stack ids (int64, `NO_STACK` for none) of an iterable of frame lists."""
        intern = self.frame_table.intern
        return np.fromiter((intern(f) for f in frame_lists), dtype=np.int64)

    def table(self) -> pd.DataFrame:
        """The `stacks` table, built from the interned arrays (one str object per distinct string)."""
        return self.table_and_codes()[0]

    def table_and_codes(self) -> tuple[pd.DataFrame, StackCodes]:
        """The `stacks` table and its `StackCodes` (the interned string ids: names and file names share
        one table of distinct strings)."""
        strings, rows, stack_start, aten = self.frame_table.columns()
        rows = np.frombuffer(rows, dtype=np.dtype([("name", np.int32), ("file", np.int32), ("line", np.int64)]))
        strings = _objects(strings)
        name_codes, file_codes, lines = rows["name"].copy(), rows["file"].copy(), rows["line"].copy()
        del rows
        table = _stacks_table(np.diff(np.frombuffer(stack_start, dtype=np.int64)), strings[name_codes],
                              strings[file_codes], lines)
        # file names are few: their own short array, so that per-file tests do not run over every name
        used = np.bincount(file_codes, minlength=len(strings)) > 0
        file_codes = (np.cumsum(used) - 1)[file_codes]
        return table, StackCodes(name_codes, strings, file_codes, strings[used], np.frombuffer(aten, dtype=np.int32),
                                 self._plain_names())

    def _plain_names(self):
        buffers = self.frame_table.plain_utf8()
        if buffers is None:
            return None
        plain, offsets, data = buffers
        plain = np.frombuffer(plain, dtype=np.uint8).astype(bool)
        arrow = pa.StringArray.from_buffers(int(plain.sum()), pa.py_buffer(offsets), pa.py_buffer(data))
        return plain, arrow

    def hints(self) -> pd.DataFrame:
        """Per stack: `op` and `location` (see `stack_hints`)."""
        table, codes = self.table_and_codes()
        return stack_hints(table, codes, len(self))


def new_stack_interner():
    """The interner for the pickle walker in use: compiled (``MEMLENS_PICKLE_WALKER`` unset or
    ``compiled``, and the C++ walker builds here) or the Python one."""
    from memlens.io import native

    if native.walker() == "compiled" and native.available():
        return CompiledStackInterner()
    return StackInterner()


def _objects(values: list) -> np.ndarray:
    """A list as a 1-d object array (np.asarray would make a 2-d array of a list of tuples)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _stacks_table(lengths: np.ndarray, names: np.ndarray, files: np.ndarray, lines: np.ndarray) -> pd.DataFrame:
    """The `stacks` table from per-stack frame counts and per-row frame columns (object arrays of str,
    kept as object columns: pandas would otherwise copy every string into Arrow)."""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    # copy=False: the columns are fresh arrays; consolidating them into blocks would copy each once more
    return pd.DataFrame({
        "stack_id": np.repeat(np.arange(len(lengths), dtype=np.int64), lengths),
        "depth": np.arange(int(lengths.sum()), dtype=np.int64) - starts,
        "name": pd.Series(names, dtype=object, copy=False), "filename": pd.Series(files, dtype=object, copy=False),
        "line": lines,
    }, copy=False)


def stack_hints(stacks: pd.DataFrame, codes: StackCodes, count: int) -> pd.DataFrame:
    """Per stack id 0..count-1 of a `stacks` table in (stack_id, depth) order: `op` (the outermost ATen
    operator on the stack, e.g. "zeros_like"; "" when the stack has no C++ frames) and `location`
    ("file.py:line function" of the innermost Python frame outside torch itself, i.e. the user's code;
    "" when none). Each distinct name and file name is tested once."""
    ops = np.full(count, "", dtype=object)
    locations = np.full(count, "", dtype=object)
    if len(stacks):
        stack_of_row = stacks["stack_id"].to_numpy(dtype=np.int64)
        name_codes, file_codes = codes.name_codes, codes.file_codes
        rows = np.arange(len(stacks), dtype=np.int64)
        # op: the ATen operator of the last (outermost) matching frame of each stack
        op_of_name = np.full(max(len(codes.names), 1), "", dtype=object)
        candidates = codes.op_candidates
        if candidates is None:
            candidates = [i for i, n in enumerate(codes.names) if n.startswith("at::_ops::")]
        for i in candidates:
            m = _ATEN_OP.match(codes.names[i])
            op_of_name[i] = m.group(1) if m else ""
        op_row = np.full(count, -1, dtype=np.int64)
        has_op = op_of_name[name_codes] != ""
        np.maximum.at(op_row, stack_of_row[has_op], rows[has_op])
        found = op_row >= 0
        ops[found] = op_of_name[name_codes[op_row[found]]]
        # location: the first (innermost) user Python frame of each stack
        user_file = np.zeros(max(len(codes.files), 1), dtype=bool)
        for i in np.unique(file_codes):  # only the file names in use (names may share the array)
            f = codes.files[i]
            user_file[i] = f.endswith(".py") and not _is_torch_internal(f)
        user = user_file[file_codes]
        loc_row = np.full(count, len(stacks), dtype=np.int64)
        np.minimum.at(loc_row, stack_of_row[user], rows[user])
        lines = stacks["line"].to_numpy(dtype=np.int64)
        for sid in np.flatnonzero(loc_row < len(stacks)):
            r = loc_row[sid]
            base = codes.files[file_codes[r]].replace("\\", "/").rsplit("/", 1)[-1]
            locations[sid] = f"{base}:{lines[r]} {codes.names[name_codes[r]]}"
    return pd.DataFrame({"stack_id": np.arange(count, dtype=np.int64), "op": ops, "location": locations})


def too_many_frames(count: int, limit: int) -> InputError:
    """The error for a stack longer than `limits.max_frames` (real stacks hold tens to hundreds)."""
    return InputError(f"a stack has {count} frames or more, over the limit of {limit} frames per stack "
                      "(set MEMLENS_MAX_FRAMES to raise it)")


def _is_torch_internal(filename: str) -> bool:
    f = filename.replace("\\", "/")
    return "/torch/" in f or f.startswith("torch/") or "/site-packages/" in f and "/torch" in f


