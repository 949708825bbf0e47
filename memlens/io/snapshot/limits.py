"""What the streaming snapshot walkers refuse or hand back beyond the opcode loop: tuples whose
expansion through shared references is too large to hash or print, and a walked snapshot that still holds
one of the walker's stand-ins (`StackRef`) where content is needed."""
from __future__ import annotations

from memlens import limits
from memlens.errors import InputError
from memlens.io.bounded_text import PlaceholderSeen
from memlens.io.safe_pickle import MAX_TUPLE_NODES, too_many_loose_message, tuple_too_big_message
from memlens.io.snapshot.frames import StackRef

# the same entry dict appended again (GETs of it): each copy would be one more row for 5 bytes of file
DUPLICATE_ENTRY = "a device-trace entry appears more than once (the same dict again; a crafted file)"


def too_many_loose() -> InputError:
    """Loose objects on the stack, counted over every MARK level: the bound of safe_pickle.check_opcodes."""
    return InputError(too_many_loose_message())


def check_tuple(t: tuple) -> None:
    """Refuse a tuple whose expansion (through shared references) is over `MAX_TUPLE_NODES`: hashing it
    as a dict key or a coded field, or printing it, would walk all of it (the compiled walker's tuple_ok)."""
    nodes = 1 + len(t)
    if nodes > MAX_TUPLE_NODES:
        raise InputError(tuple_too_big_message())
    todo = [x for x in t if type(x) is tuple]
    while todo:
        x = todo.pop()
        nodes += len(x)
        if nodes > MAX_TUPLE_NODES:
            raise InputError(tuple_too_big_message())
        todo.extend(y for y in x if type(y) is tuple)


def check_streamed(obj, where=None, *, columns_type: type) -> None:
    """`limits.check_nesting` of a streamed snapshot, which also makes sure that no `StackRef` is left
    anywhere but as a ``frames`` value (where the interner reads it as its stack id) or among the coded
    values of `columns_type` (the streaming reader's `EntryColumns`, passed in: the reader imports this
    module): anywhere else it would be read as text. Raises `PlaceholderSeen` then (the caller reads the
    file with the general unpickler)."""
    EntryColumns = columns_type

    def visit(item) -> None:
        if type(item) is EntryColumns:
            if any(type(v) is StackRef for values in item.names.values() for v in values):
                raise PlaceholderSeen("StackRef")
        elif type(item) is dict and StackRef in map(type, item):
            raise PlaceholderSeen("StackRef")

    def stack_ref(parent, ref) -> None:
        if not (type(parent) is dict and parent.get("frames") is ref):
            raise PlaceholderSeen("StackRef")

    limits.check_nesting(obj, where, also_walk=(EntryColumns,), visit=visit, watch=(StackRef,),
                         on_watched=stack_ref)


def check_shared(snapshot, where=None) -> None:
    """Refuse a snapshot read from a file that uses one object in two places where each place becomes rows:
    a device trace, a trace entry, a segment, a segment's blocks list or a block. A pickle repeats an object
    with a 5-byte reference, so a 230 KB file listing one 1,000-block segment 100,000 times expanded to 10^8
    rows (6.8 GB before it was stopped); the same for one trace list. Frames lists may be shared (they are
    interned). A snapshot built in memory may share objects: it is the caller's own."""
    traces = snapshot.get("device_traces") if type(snapshot) is dict else None
    traces = traces if type(traces) is list else []
    _unique(traces, "device trace", where)
    for entries in traces:
        if type(entries) is list:
            _unique(entries, "device-trace entry", where, DUPLICATE_ENTRY)
    segments = snapshot if type(snapshot) is list else snapshot.get("segments") if type(snapshot) is dict else None
    segments = segments if type(segments) is list else []
    _unique(segments, "segment", where)
    lists = [seg.get("blocks") for seg in segments if type(seg) is dict]
    lists = [b for b in lists if type(b) is list]
    _unique(lists, "segment's blocks list", where)
    blocks = [blk for blocks in lists for blk in blocks if type(blk) is dict]
    _unique(blocks, "block", where)
    histories = [blk.get("history") for blk in blocks]  # the 2023 format: each block's own list, scanned per block
    _unique([h for h in histories if type(h) is list and h], "block history", where)


def _unique(objects: list, what: str, where, message: str | None = None) -> None:
    if len(objects) < 2:
        return
    import numpy as np
    ids = np.fromiter(map(id, objects), dtype=np.uint64, count=len(objects))
    if len(np.unique(ids)) != len(ids):
        raise InputError(message or f"a {what} appears more than once (one object used again; a crafted file)",
                         where)
