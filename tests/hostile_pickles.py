"""Small hand-made hostile snapshot pickles, shared by the hostile tests and the fuzz seeds.

Each builder returns the bytes of a file a few hundred bytes to a few MB long that once cost unbounded
time or memory, crashed the process, or leaked an internal object into the output.
"""
from __future__ import annotations

import pickle
import random

M64 = (1 << 64) - 1
_C1, _C2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix(h: int) -> int:  # the splitmix64 finaliser the walker used, unkeyed
    h ^= h >> 30
    h = h * _C1 & M64
    h ^= h >> 27
    h = h * _C2 & M64
    return h ^ (h >> 31)


def _unmix(h: int) -> int:  # its inverse: what made the old stack hash floodable
    h ^= h >> 31 ^ h >> 62
    h = h * pow(_C2, -1, 1 << 64) & M64
    h ^= h >> 27 ^ h >> 54
    h = h * pow(_C1, -1, 1 << 64) & M64
    return h ^ (h >> 30) ^ (h >> 60)


def _entry(i: int, frames, **extra) -> dict:
    return {"action": "alloc", "addr": 4096 * (i + 1), "size": 512, "stream": 0, "time_us": i, "frames": frames,
            **extra}


def _snapshot(entries: list) -> bytes:
    return pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4)


def hash_flood(count: int, crafted: bool = True, seed: int = 1) -> bytes:
    """`count` one-frame stacks whose lines make every stack's hash under the old unkeyed mix share one
    32-bit tag (``crafted``), or random lines (the baseline of the same size)."""
    rng = random.Random(seed)
    h0 = 0x9E3779B97F4A7C15 ^ 1  # seed of a one-frame stack
    key = (0 << 32) | 1          # name id 0, file id 1
    lines: list[int] = []
    while len(lines) < count:
        if not crafted:
            lines.append(rng.randrange(1 << 62))
            continue
        target = rng.getrandbits(32) << 32 | 0x1234ABCD
        line = _unmix(_unmix(target) ^ h0 ^ key)
        if line < 1 << 63:
            lines.append(line)
    entries = [_entry(i, [{"name": "f", "filename": "x.py", "line": line}]) for i, line in enumerate(lines)]
    return _snapshot(entries)


def mark_flood(count: int) -> bytes:
    """PROTO 4 then `count` MARK opcodes (each one an empty list in a walker without a depth limit)."""
    return b"\x80\x04" + b"(" * count + b"."


def loose_across_marks(per_mark: int = 600_000, marks: int = 3) -> bytes:
    """Loose objects spread over several MARK levels: each level under the per-list bound, the total over
    the loose-object limit."""
    return b"\x80\x04" + (b"(" + b"N" * per_mark) * marks + b"."


def get_flood(count: int) -> bytes:
    """One entry dict, then `count` - 1 references to it, in one APPENDS batch of a device trace."""
    entry = pickle.dumps(_entry(0, []), protocol=4)[2:-1]  # no PROTO, no STOP; its dict is memoized first
    gets = b"j" + (4).to_bytes(4, "little")  # slots 0-3: top dict, "device_traces", outer list, inner list
    return (b"\x80\x04}\x94\x8c\x0ddevice_traces\x94]\x94]\x94(" + entry + gets * (count - 1)
            + b"eas.")


def get_batches(batches: int, per_batch: int) -> bytes:
    """One entry dict appended alone, then referenced `per_batch` times in each of `batches` APPENDS."""
    entry = pickle.dumps(_entry(0, []), protocol=4)[2:-1]
    gets = b"j" + (4).to_bytes(4, "little")
    return (b"\x80\x04}\x94\x8c\x0ddevice_traces\x94]\x94]\x94(" + entry + b"e"
            + (b"(" + gets * per_batch + b"e") * batches + b"as.")


def tuple_dag(levels: int = 40):
    t = None
    for _ in range(levels):
        t = (t, t)
    return t


def list_dag(levels: int = 40):
    t: list = []
    for _ in range(levels):
        t = [t, t]
    return t


def _tuple_dag_ops(base: int, levels: int) -> bytes:
    """Opcodes that push a `levels`-deep DAG of shared pairs, memoizing into slots base, base + 1, ...
    (Python cannot build such a dict key itself: its own dict would hash the key)."""
    out = b"N"
    for i in range(levels):
        out += b"\x94j" + (base + i).to_bytes(4, "little") + b"\x86"
    return out


def dag_dict_key(levels: int = 40) -> bytes:
    """A dict keyed by a tuple DAG: hashing it walks 2**levels nodes."""
    return (b"\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94"
            + _tuple_dag_ops(5, levels) + b"K\x01u.")


def dag_compile_context(levels: int = 40) -> bytes:
    """An entry whose compile_context is a tuple DAG (hashed to code it, printed to report it)."""
    return _snapshot([_entry(0, [], compile_context=tuple_dag(levels))])


def dag_frame(levels: int = 40) -> bytes:
    """A frame that is a list DAG (the reader names odd frames by their text)."""
    return _snapshot([_entry(0, [list_dag(levels)])])


def placeholder_frame() -> bytes:
    """A frames list interned by the first entry, then used as a frame of an entry in a later batch (the
    pickler appends 1,000 items per batch): its memo slot then holds the walker's stand-in for an interned
    list."""
    frames = [{"name": "forward", "filename": "/home/u/model.py", "line": 7}]
    return _snapshot([_entry(0, frames)] + [_entry(i, []) for i in range(1, 1001)] + [_entry(1001, [frames])])


def none_and_huge_int() -> bytes:
    """An integer field None in one entry and beyond int64 in another."""
    return _snapshot([_entry(0, [], size=None), _entry(1, [], size=1 << 63)])


SEEDS = {  # name -> small bytes, for the fuzz targets' corpora
    "hash_flood": lambda: hash_flood(64),
    "mark_flood": lambda: mark_flood(300),
    "dag_dict_key": dag_dict_key,
    "dag_compile_context": dag_compile_context,
    "dag_frame": dag_frame,
    "placeholder_frame": placeholder_frame,
    "none_and_huge_int": none_and_huge_int,
}
