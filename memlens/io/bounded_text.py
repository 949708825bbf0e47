"""Text of an object read from a file, in time bounded by the text's length.

``str()`` of a container walks its whole expansion: a pickle of a few hundred bytes can hold a DAG of
shared lists 40 levels deep, whose text is 2**40 items long, so ``str(frame)[:200]`` never returns. These
functions render the same text as ``str`` / ``repr`` for ordinary values, but stop after `limit` characters
and never look at more items than they can show.
"""
from __future__ import annotations

_SCALARS = (bool, float, type(None), complex)


class PlaceholderSeen(Exception):
    """A reader's internal stand-in (a `Placeholder`) was about to be shown as text: the reader lost the
    content it stands for, so the file must be read another way (never the stand-in's own text, which
    would put an address into the output)."""


class Placeholder:
    """Base of the readers' internal stand-ins (memlens.io.snapshot.frames.StackRef)."""

    __slots__ = ()

    def __repr__(self):
        raise PlaceholderSeen(type(self).__name__)

    __str__ = __repr__
_BIG_INT_BITS = 4096  # int -> str is quadratic in the digits (and refused past 4300 digits since 3.11)


def safe_str(obj, limit: int = 200) -> str:
    """``str(obj)`` for a str (unchanged, whatever its length), else `bounded_repr`."""
    if type(obj) is str:
        return obj
    return bounded_repr(obj, limit)


def short_str(obj, limit: int = 200) -> str:
    """``str(obj)[:limit]``, in bounded time."""
    if type(obj) is str:
        return obj[:limit]
    return bounded_repr(obj, limit)


def bounded_repr(obj, limit: int = 200) -> str:
    """``repr(obj)`` for builtin containers and scalars (other objects by their type name), cut at `limit`
    characters ("..." where items were left out). Each step writes at least one character, so the work
    is O(limit) whatever the object's expanded size."""
    out: list[str] = []
    size = 0
    todo: list = [(obj, False)]  # (object, True when it is literal text to write)
    while todo and size < limit:
        item, literal = todo.pop()
        if literal:
            text = item
        else:
            text = _open(item, todo, limit - size)
        out.append(text)
        size += len(text)
    return "".join(out)[:limit]


def _open(obj, todo: list, room: int) -> str:
    """The text that starts `obj`; its items and closing text are pushed onto `todo` (last first)."""
    kind = type(obj)
    if kind is str:
        return repr(obj[:room])
    if kind is int:
        return repr(obj) if obj.bit_length() < _BIG_INT_BITS else f"<int of {obj.bit_length()} bits>"
    if kind in _SCALARS:
        return repr(obj)
    if kind is bytes:
        return repr(obj[:room])
    if kind is dict:
        items, opening, closing = list(_first(obj.items(), room)), "{", "}"
    elif kind is list:
        items, opening, closing = list(_first(obj, room)), "[", "]"
    elif kind is tuple:
        items, opening, closing = list(_first(obj, room)), "(", ",)" if len(obj) == 1 else ")"
    elif kind in (set, frozenset):
        if not obj:
            return f"{kind.__name__}()"
        items = list(_first(obj, room))
        opening, closing = ("{", "}") if kind is set else ("frozenset({", "})")
    elif isinstance(obj, Placeholder):
        raise PlaceholderSeen(kind.__name__)
    else:
        return f"<{kind.__name__}>"
    todo.append((closing, True))
    if len(items) < len(obj):
        todo.append((", ...", True))
    for i in range(len(items) - 1, -1, -1):
        if kind is dict:
            key, value = items[i]
            todo.append((value, False))
            todo.append((": ", True))
            todo.append((key, False))
        else:
            todo.append((items[i], False))
        if i:
            todo.append((", ", True))
    return opening


def _first(iterable, count: int):
    """The first `count` items (each shown item takes at least one character, so no more can show)."""
    for i, item in enumerate(iterable):
        if i >= count:
            return
        yield item


def within(obj, max_nodes: int) -> bool:
    """True when `obj` expands (through shared references, as JSON or text would write it) to at most
    `max_nodes` containers and items; the count stops there, so the work is O(max_nodes)."""
    nodes = 1
    todo = [obj]
    while todo:
        item = todo.pop()
        kind = type(item)
        if kind is dict:
            children = item.values()
            nodes += len(item)
        elif kind in (list, tuple, set, frozenset):
            children = item
            nodes += len(item)
        else:
            continue
        if nodes > max_nodes:
            return False
        todo.extend(c for c in children if type(c) in (dict, list, tuple, set, frozenset))
    return True


def bounded_value(obj, max_nodes: int = 1_000_000, limit: int = 1000):
    """`obj` itself when `within` `max_nodes`, else its `bounded_repr` (kept as text)."""
    return obj if within(obj, max_nodes) else bounded_repr(obj, limit)
