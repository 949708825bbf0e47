"""How both stack interners read a frame that is not the usual {"name": str, "filename": str, "line": int}
dict, and what makes two stacks with such frames the same stack as written (memlens/io/snapshot/frames.py).
Text of odd values is bounded (`memlens.io.bounded_text`): a frame may be a DAG of shared lists whose
full text would never end."""
from __future__ import annotations

from memlens.io.bounded_text import bounded_repr, safe_str, short_str

_INT64_MAX = 2**63 - 1


def read_odd_frame(f) -> tuple[str, str, int, int, int]:
    """(name, filename, line, unknown_line, odd) of a frame that is not the usual {"name": str,
    "filename": str, "line": 0 <= int < 2**63} dict: a non-dict is a frame named by its text (odd = 1); a
    line that is not a non-negative int64 is read as 0, "unknown" (unknown_line = 1), as for C++ frames."""
    if type(f) is not dict:
        return (short_str(f, 200), "", 0, 0, 1)  # bounded: a DAG of shared lists has an endless text
    line = f.get("line")
    if type(line) is not int:
        try:
            line = int(line or 0)
        except (TypeError, ValueError, OverflowError):
            line = -1
    unknown = 0
    if not 0 <= line <= _INT64_MAX:
        unknown, line = 1, 0
    name, filename = f.get("name", ""), f.get("filename", "")
    return (safe_str(name), safe_str(filename), line, unknown, 0)


def _is_usual_frame(f) -> bool:
    if type(f) is not dict:
        return False
    line = f.get("line")
    return (type(line) is int and 0 <= line <= _INT64_MAX and type(f.get("name", "")) is str
            and type(f.get("filename", "")) is str)


def repair_key(sid: int, frames) -> tuple:
    """What makes two frame lists with repaired frames the same stack as written: the stack id and, per
    frame, what the repair lost (a bad line's value, an odd frame's type). Repairs are counted once per key,
    so a stack repeated in thousands of entries counts once, and two stacks that differ only in their bad
    line values (2**64-1 and -1 both read as 0) count twice."""
    lost = []
    for f in frames:
        if type(f) is dict:
            lost.append(None if _is_usual_frame(f) else ("dict", bounded_repr(f.get("line"), 64)))
        elif type(f) is tuple and len(f) == 3 and type(f[2]) is int:  # a frame read before (see `release`)
            lost.append(None)
        else:
            lost.append((type(f).__name__,))
    return (sid, *lost)
