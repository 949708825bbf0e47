"""The allocator-only rows of the allocator join (record/join.py): allocations no tensor showed (temporaries
inside ops, workspace buffers), each attributed to the op whose interval contains it.

Vectorised over the rows, on int64 times with missing masks; built for the fixed per-call cost of the few
hundred rows of a one-step close (see record/join.py).
"""
from __future__ import annotations

import numpy as np

from memlens.recording.columns import Columns, Nullable, objects

MATCH_TOLERANCE_NS = 200_000     # clock skew allowed between the instruments before correction
_TEMPORARY_OR_UNKNOWN = objects(["unknown", "temporary"])
_ALLOCATOR_ONLY_RULES = objects(["seen only by the allocator",
                                 "seen only by the allocator, freed inside the op that made it"])


def allocator_only(alloc_blocks: Columns, rows: np.ndarray, ops: Columns, blocks: Columns,
                   name: str) -> Columns:
    """Rows for the allocations of `alloc_blocks` (allocator blocks, times in trace ns) that no dispatch block
    matched (`rows`: each dispatch block's matched allocator row, -1 none), attributed to the op of `ops`
    whose interval contains them, with the columns of `blocks`; `name` is their `source`."""
    used = np.zeros(len(alloc_blocks), dtype=bool)
    used[rows[rows >= 0]] = True
    alloc_col, free_col = alloc_blocks["alloc_t"], alloc_blocks["free_t"]
    rest = (~(used | alloc_col.missing)).nonzero()[0]
    n = len(rest)
    a_t = alloc_col.values[rest]
    f_missing = free_col.missing[rest]
    f_val = free_col.values[rest]          # int64; meaningless where f_missing (never read there)
    rest_size = alloc_blocks["size"][rest]
    n_ops = len(ops)
    if n_ops:
        starts, ends = ops["start_ns"], ops["end_ns"]
        idx = np.searchsorted(starts, a_t, side="right") - 1
        inside = (idx >= 0) & (a_t <= ends[np.maximum(idx, 0)])
        # made between two ops and freed inside the next one: an argument the next op's binding converted
        # (a Python number wrapped as a tensor) before the op reached the dispatch mode
        nxt = np.minimum(idx + 1, n_ops - 1)          # idx >= -1, so idx + 1 >= 0
        before_next = ~(inside | f_missing) & (idx + 1 < n_ops)
        before_next &= (f_val >= starts[nxt]) & (f_val <= ends[nxt] + MATCH_TOLERANCE_NS)
        idx[before_next] += 1
        inside |= before_next
        safe = np.minimum(np.maximum(idx, 0), n_ops - 1)
        op_end = ends[safe]
        a_t = np.where(inside, np.minimum(np.maximum(a_t, starts[safe]), op_end), a_t)
        freed_inside = inside & ~f_missing & (f_val <= op_end + MATCH_TOLERANCE_NS)
    else:
        idx = safe = np.full(n, -1)
        inside = freed_inside = np.zeros(n, bool)
    f_t = np.where(f_missing, 0, np.maximum(f_val, a_t))
    if n_ops:
        f_t = np.where(freed_inside, np.minimum(f_t, op_end), f_t)
    first_id = int(blocks["block_id"].max()) + 1 if len(blocks) else 0
    kind = freed_inside.astype(np.int64)
    outside = ~inside
    if n_ops:
        op_names, op_modules = ops["name"][safe], ops["module"][safe]
        if np.count_nonzero(outside):
            op_names, op_modules = op_names.astype(object), op_modules.astype(object)
            op_names[outside] = ""
            op_modules[outside] = ""
        else:
            op_names, op_modules = objects(op_names), objects(op_modules)
    else:
        op_names = op_modules = np.full(n, "", dtype=object)
    none = np.zeros(n, dtype=bool)     # shared by the all-False columns (a table's arrays are never edited)
    columns = {
        "block_id": np.arange(first_id, first_id + n, dtype=np.int64),
        "device": np.asarray(alloc_blocks["device"], dtype=object)[rest],
        "addr": Nullable(np.asarray(alloc_blocks["addr"], dtype=np.int64)[rest], none),
        "size": rest_size,
        "alloc_ns": Nullable(a_t.astype(np.int64, copy=False), none),
        "free_ns": Nullable(f_t.astype(np.int64, copy=False), f_missing),
        "category": _TEMPORARY_OR_UNKNOWN[kind],
        "op": op_names,
        "alloc_op_id": Nullable(np.where(inside, idx, 0).astype(np.int64, copy=False), outside),
        "module": op_modules,
        "stream": np.zeros(n, dtype=np.int64), "allocated_before": none, "free_without_alloc": none,
        "source": np.full(n, name, dtype=object),
        "category_rule": _ALLOCATOR_ONLY_RULES[kind],
        "allocator_size": Nullable(np.asarray(rest_size, dtype=np.int64), none),
    }
    if "stack_id" in ops:   # stacks=True: the allocating op's stack, as for the blocks tensors showed
        stack = ops["stack_id"].filled(-1)[safe] if n_ops else np.full(n, -1, dtype=np.int64)
        sid = np.where(inside, stack, -1)
        columns["stack_id"] = Nullable(sid.astype(np.int64, copy=False), sid < 0)
    # every column the blocks table has, in its order (a column only the blocks have stays missing here)
    out = Columns(n)
    for col in blocks.columns:
        if col in columns:
            out.cols[col] = columns[col]
        elif isinstance(blocks[col], Nullable):
            out.cols[col] = Nullable.absent(n)
        else:
            raise ValueError(f"allocator-only blocks have no value for column {col!r}")
    return out
