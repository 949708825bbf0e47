"""The drain stage of a recording's build: a stopped Session's int64 streams as the Trace's tables (all
vectorised numpy/pandas): `drain_tables` (every access in memory) or `drain_windowed` (the accesses a window of
ops at a time, for the windowed save), and `with_session_events` (the compiled recorder's memory-hook events
added to the allocator's).

What is decided here, and how (the `category_rule` column says which rule gave each category):
- Backward ops get the module of the forward op that created their autograd node (matched by the
  autograd sequence number), so ``model.layers.3.attn`` shows up in backward too.
- Iterations come from `memlens.step()` markers; without them from optimizer steps; else missing.
- Categories: parameter/buffer (known modules), optimizer_state (`optimizer.state`), gradient
  (``param.grad`` at an optimizer step, `memlens.step()` or the end), input (tensor argument of a root
  module not made inside a module), activation (made by a forward op inside a module, or one that
  recorded autograd history), temporary (made in backward or in the optimizer and none of the above),
  autograd_detail (made outside modules with no history and first read by backward: the gradient
  seed of ``backward()``), unknown otherwise (e.g. made before recording and never identified).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memlens.recording.attribution import (ITER_OPTIMIZER, ITER_STEP, MARK_BUFFER, MARK_GRADIENT, MARK_INPUT,
                                        MARK_OPTIMIZER_STATE, MARK_PARAMETER, PHASE_OPTIMIZER)
from memlens.recording.columns import FRAME_DTYPES, Columns, Nullable, first_occurrences, objects
from memlens.recording.instruments import AllocatorData
from memlens.recording.session import Session

_MARK_CATEGORY = {
    MARK_PARAMETER: ("parameter", "tensor of a module's parameters (or an optimizer's params)"),
    MARK_BUFFER: ("buffer", "tensor of a module's buffers"),
    MARK_OPTIMIZER_STATE: ("optimizer_state", "value in optimizer.state"),
    MARK_GRADIENT: ("gradient", "a parameter's .grad"),
    MARK_INPUT: ("input", "tensor argument of a root module, made outside any module"),
}
# lower wins when one block got several marks
_MARK_PRIORITY = [MARK_PARAMETER, MARK_BUFFER, MARK_OPTIMIZER_STATE, MARK_GRADIENT, MARK_INPUT]

OPS_PER_WINDOW = 1 << 17        # most ops in one window (each window's accesses are one Parquet row group)
RECORDS_PER_WINDOW = 1 << 18    # most access records in one window past its first op (~25 MB at its peak)
_NONE = np.iinfo(np.int64).max


@dataclass
class Drained:
    """A stopped session's records as tables. The build hands each table on (`take`), so that each copy a
    later stage makes can replace the table before it."""

    ops: Columns | None
    blocks: Columns | None
    accesses: "Columns | AccessWindows | None"
    iteration_source: str        # what numbered the iterations: "memlens.step", "optimizer.step" or "none"

    def take(self, name: str):
        """The table `name` ("ops", "blocks" or "accesses"), no longer held here."""
        table = getattr(self, name)
        setattr(self, name, None)
        return table


def drain_tables(session: Session) -> Drained:
    """The ops, accesses and blocks tables of a stopped session, every access in memory."""
    session.load_all_accesses()
    ops, op_module_idx, iteration_source = build_ops(session)
    accesses = build_accesses(session, ops)
    blocks = build_blocks(session, ops, op_module_idx)
    return Drained(ops, blocks, accesses, iteration_source)


def drain_windowed(session: Session, ops_per_window: int | None = None,
                   records_per_window: int | None = None) -> Drained:
    """The ops and blocks tables of a stopped session, and its accesses as `AccessWindows` (decoded a window
    of at most `ops_per_window` ops and `records_per_window` records at a time, defaults `OPS_PER_WINDOW`,
    `RECORDS_PER_WINDOW`, as they are read)."""
    ops, op_module_idx, iteration_source = build_ops(session)
    blocks = build_blocks(session, ops, op_module_idx)
    del op_module_idx
    windows = AccessWindows(session, ops, blocks["alloc_op_id"].filled(-1), int(ops_per_window or OPS_PER_WINDOW),
                            int(records_per_window or RECORDS_PER_WINDOW))
    return Drained(ops, blocks, windows, iteration_source)


def with_session_events(session: Session, allocator: AllocatorData | None, clock: tuple[int, int]) -> AllocatorData:
    """The allocator data with the compiled recorder's memory-hook events (on the wall clock, unix ns: `clock`
    is (time.time_ns(), time.perf_counter_ns()) read together at the start) and the session's notes added,
    once per recording (a second build of the same recording finds them there). None (the instruments failed
    to stop, warned) gives allocator data that says so: the dispatch-level trace is kept."""
    if allocator is None:
        allocator = AllocatorData(notes=["allocator events lost: the instruments failed to stop"])
    if getattr(allocator, "_session_added", False):
        return allocator
    allocator._session_added = True
    mem_events = getattr(session, "memory_events", None)
    if mem_events is not None and (allocator.events is None or len(mem_events)):  # compiled hook
        wall0, clock0 = clock
        ev = session.memory_events
        allocator.events = Columns(len(ev), {"t_unix_ns": ev["t_ns"] - clock0 + wall0,
                                             "device": ev["device"], "addr": ev["addr"],
                                             "delta": ev["delta"]})
        allocator.sources.append("memory_hook")
    if getattr(session, "memory_note", ""):
        allocator.notes.append(session.memory_note)
    if getattr(session, "backend_note", None):
        allocator.notes.append(session.backend_note)
    return allocator


def build_ops(session: Session) -> tuple[Columns, np.ndarray, str]:
    """The ops table, each op's module index (backward mapped to forward), and the iteration source."""
    raw = session.buf.ops.to_numpy()
    n = len(raw)
    name_idx, ctx, start, end, aseq = raw[:, 0], raw[:, 1], raw[:, 2], raw[:, 3], raw[:, 4]
    module_idx = ctx >> 2
    backward = aseq < 0
    module_idx = _backward_modules(module_idx, aseq, backward)
    phase = np.where(backward, "backward",
                     np.where((ctx & PHASE_OPTIMIZER) != 0, "optimizer",
                              np.where(module_idx > 0, "forward", "other")))
    iteration, source = _iterations(session, n)
    names = np.asarray(session.op_names, dtype=object)
    paths = np.asarray(session.module_paths, dtype=object)
    columns = {
        "op_id": np.arange(n, dtype=np.int64),
        "name": names[name_idx] if n else np.empty(0, object),
        "start_ns": start - session.t_start,
        "end_ns": end - session.t_start,
        "module": paths[module_idx] if n else np.empty(0, object),
        "iteration": iteration,
        "phase": phase,
        # >= 0: autograd sequence counter after a non-backward op; < 0: -2 - the backward node's number
        "autograd_seq": aseq,
    }
    columns.update(_cost_columns(session, n))
    if session.stack_table is not None:   # one stack id per op, appended right after the op record
        stack = session.buf.op_stacks.to_numpy()[:n, 0]
        stack = np.concatenate([stack, np.full(n - len(stack), -1, dtype=np.int64)])
        columns["stack_id"] = Nullable.of(stack, stack < 0)
    return Columns(n, columns), module_idx, source


def _cost_columns(session: Session, n: int) -> dict:
    """flops / bytes_read / bytes_written / dtype / shapes per op, from the deduplicated cost signatures
    (computed here, once per distinct signature, not while recording)."""
    from memlens.recording.compiled_signatures import signature_facts
    from memlens.recording.costs import facts_columns, per_op_columns
    if getattr(session, "backend", "python") == "compiled":
        # the C++ recorder logged one signature per distinct (op, shapes, dtypes, scalars): facts once per
        # signature, and once per process for a signature met in an earlier recording
        sig = np.asarray(session.sig_of_op, dtype=np.int64)[:n]
        facts = facts_columns(signature_facts(session.signatures, session.op_names, session.decode_signature))
    else:
        sig = session.buf.op_sigs.to_numpy()[:n, 0]
        facts = session.costs.facts()
    sig = np.concatenate([sig, np.full(n - len(sig), -1, dtype=np.int64)])
    columns = per_op_columns(facts, sig)
    causal = _causal_signatures(session)
    if causal.any():        # only traces with a causal attention call carry the column (absent = False)
        columns["causal"] = np.where(sig >= 0, causal[np.maximum(sig, 0)] if len(causal) else False, False)
    return columns


def _causal_signatures(session: Session) -> np.ndarray:
    """Per cost signature: whether it is a fused attention call that masks causally (its scalar arguments,
    `memlens.opfacts.attention`), so the cost model prices the key blocks a causal kernel visits."""
    from memlens.opfacts.attention import CAUSAL_ARG, causal_call
    if getattr(session, "backend", "python") == "compiled":
        from memlens.recording.compiled_signatures import compiled_record
        out = np.zeros(len(session.signatures), dtype=bool)
        for i, raw in enumerate(session.signatures):
            name = session.op_names[int.from_bytes(raw[:8], "little", signed=True)]
            if name.split(".")[0] in CAUSAL_ARG:      # decode only the attention signatures
                op, args, kwargs, _ = compiled_record(*session.decode_signature(i))
                out[i] = causal_call(op, args, kwargs)
        return out
    return np.array([causal_call(op, args, kwargs or {}) for op, args, kwargs, _ in session.costs.records],
                    dtype=bool)


def _backward_modules(module_idx: np.ndarray, aseq: np.ndarray, backward: np.ndarray) -> np.ndarray:
    """Give each backward op the module of the forward op that created its autograd node.

    A forward op sees the sequence counter *after* its node was created, so node `s` belongs to the
    first forward op whose counter reads `s + 1`.
    """
    out = module_idx.copy()
    fwd = np.flatnonzero(~backward)
    bwd = np.flatnonzero(backward)
    if len(fwd) == 0 or len(bwd) == 0:
        return out
    values, first = first_occurrences(aseq[fwd])     # each counter value and the first forward op reading it
    node = -2 - aseq[bwd]
    pos = np.searchsorted(values, node + 1)
    pos_ok = pos < len(values)
    hit = np.zeros(len(bwd), dtype=bool)
    hit[pos_ok] = values[pos[pos_ok]] == node[pos_ok] + 1
    out[bwd[hit]] = module_idx[fwd[first[pos[hit]]]]
    return out


def _iterations(session: Session, n: int) -> tuple[Nullable, str]:
    marks = session.buf.iter_marks.to_numpy()
    for kind, source in ((ITER_STEP, "memlens.step"), (ITER_OPTIMIZER, "optimizer.step")):
        at = np.sort(marks[marks[:, 1] == kind, 0]) if len(marks) else np.empty(0, np.int64)
        if len(at):
            return Nullable.of(np.searchsorted(at, np.arange(n), side="right")), source
    return Nullable.absent(n), "none"


def build_accesses(session: Session, ops: Columns) -> Columns:
    """One row per (op, block) the op touched; reads at the op's start, writes at its end."""
    raw = session.buf.ops.to_numpy()
    acc_end = raw[:, 5] if len(raw) else np.empty(0, np.int64)
    packed = session.buf.accesses.to_numpy()[:, 0]
    counts = np.diff(np.concatenate([[0], acc_end]))
    return accesses_of_ops(packed, counts, 0, ops["start_ns"], ops["end_ns"])


def accesses_of_ops(packed: np.ndarray, counts: np.ndarray, first_op: int, start: np.ndarray,
                    end: np.ndarray) -> Columns:
    """The accesses rows of the ops `first_op`, `first_op` + 1, ... (`counts[i]` packed records, block << 1 |
    write, each, in op order in `packed`), `start`/`end` every op's times (trace ns). Rows come sorted by
    (op, block), so the rows of consecutive op ranges, concatenated, are the rows of the whole range (the
    streaming save builds them a window of ops at a time)."""
    total = int(counts.sum()) if len(counts) else 0
    packed = np.asarray(packed, dtype=np.int64)[:total]   # drop accesses of an op cut short by a failure
    op_id = np.repeat(np.arange(first_op, first_op + len(counts), dtype=np.int64), counts)
    block_id = packed >> 1
    is_write = (packed & 1).astype(bool)
    # one row per (op, block): a block passed twice (x * x) is one access; write wins over read
    order = np.lexsort((~is_write, block_id, op_id))
    op_id, block_id, is_write = op_id[order], block_id[order], is_write[order]
    keep = np.ones(len(op_id), dtype=bool)
    keep[1:] = (op_id[1:] != op_id[:-1]) | (block_id[1:] != block_id[:-1])
    op_id, block_id, is_write = op_id[keep], block_id[keep], is_write[keep]
    t = np.where(is_write, end[op_id], start[op_id]) if len(op_id) else np.empty(0, np.int64)
    return Columns(len(op_id), {"block_id": block_id, "t_ns": t, "op_id": op_id, "is_write": is_write})


def build_blocks(session: Session, ops: Columns, op_module_idx: np.ndarray) -> Columns:
    """The blocks the dispatch mode saw, with frees, attribution and categories."""
    raw = session.buf.blocks.to_numpy()
    raw = raw[np.argsort(raw[:, 0], kind="stable")]
    n = len(raw)
    bid, dev, addr, size, alloc_t, alloc_op, before = (raw[:, i] for i in range(7))
    before = before.astype(bool)
    frees = session.buf.frees.to_numpy()
    free_t = np.full(n, -1, dtype=np.int64)
    if len(frees):
        free_t[frees[:, 0]] = frees[:, 1]
    t0 = session.t_start
    alloc_ns = Nullable.of(np.where(before, 0, alloc_t - t0), before)
    free_ns = Nullable.of(np.where(free_t >= 0, free_t - t0, 0), free_t < 0)
    n_ops = len(ops)
    made_here = ~before & (alloc_op < n_ops)
    safe_op = np.minimum(np.maximum(alloc_op, 0), max(n_ops - 1, 0))   # (np.clip: ~3x the call cost)
    names, phases = ops["name"], ops["phase"]
    op_name = objects(np.where(made_here, names[safe_op] if n_ops else "", ""))
    module_idx = np.where(made_here, op_module_idx[safe_op] if n_ops else 0, 0)
    phase = np.where(made_here, phases[safe_op] if n_ops else "", "")
    category, rule, module_idx = _categories(session, n, before, made_here, phase, module_idx, ops, safe_op)
    paths = np.asarray(session.module_paths, dtype=object)
    devices = np.asarray(session.devices, dtype=object)
    columns = {
        "block_id": bid, "device": devices[dev] if n else np.empty(0, object),
        "addr": Nullable.of(addr), "size": size,
        "alloc_ns": alloc_ns, "free_ns": free_ns,
        "category": category, "op": op_name,
        "alloc_op_id": Nullable.of(np.where(made_here, alloc_op, 0), ~made_here),
        "module": paths[module_idx] if n else np.empty(0, object),
        "stream": np.zeros(n, dtype=np.int64), "allocated_before": before,
        "free_without_alloc": np.zeros(n, dtype=bool), "source": np.full(n, "dispatch", dtype=object),
        "category_rule": rule,
    }
    if "stack_id" in ops:
        stack = ops["stack_id"].filled(-1)
        sid = np.where(made_here, stack[safe_op], -1) if n_ops else np.full(n, -1, dtype=np.int64)
        columns["stack_id"] = Nullable.of(sid, sid < 0)
    return Columns(n, columns)


def _categories(session, n, before, made_here, phase, module_idx, ops, safe_op):
    """Resolve each block's category from the hook marks and how it was made; also its rule."""
    category = np.full(n, "unknown", dtype=object)
    rule = np.full(n, "allocated before recording and never identified", dtype=object)
    rule[~before] = "allocated outside any module, no autograd history"
    marks = session.buf.marks.to_numpy()
    marked = np.zeros(n, dtype=bool)
    if len(marks):
        prio = np.asarray([_MARK_PRIORITY.index(c) for c in range(len(_MARK_PRIORITY))])
        m = marks[np.lexsort((prio[marks[:, 1]], marks[:, 0]))]
        first = np.ones(len(m), dtype=bool)
        first[1:] = m[1:, 0] != m[:-1, 0]
        m = m[first]
        for code, (cat, why) in _MARK_CATEGORY.items():
            sel = m[m[:, 1] == code]
            if code == MARK_INPUT:   # an input made by an op inside a module is that module's activation
                sel = sel[(~made_here[sel[:, 0]]) | (module_idx[sel[:, 0]] == 0)]
            category[sel[:, 0]] = cat
            rule[sel[:, 0]] = why
            marked[sel[:, 0]] = True
            owner = sel[sel[:, 3] > 0]
            module_idx[owner[:, 0]] = owner[:, 3]
    free = ~marked & made_here
    autograd = _records_history(ops, safe_op)
    act = free & (phase == "forward")
    category[act], rule[act] = "activation", "made by a forward op inside a module"
    act2 = free & (phase == "other") & autograd
    category[act2], rule[act2] = "activation", "made by a forward op that recorded autograd history"
    tmp = free & (phase == "backward")
    category[tmp], rule[tmp] = "temporary", "made in backward and not a parameter's .grad"
    tmp = free & (phase == "optimizer")
    category[tmp], rule[tmp] = "temporary", "made in the optimizer step and not optimizer state"
    return category, rule, module_idx


def _records_history(ops: Columns, safe_op: np.ndarray) -> np.ndarray:
    """Per block: did its allocating op create an autograd node (i.e. is it part of the graph)?"""
    if "autograd_seq" not in ops or len(ops) == 0:
        return np.zeros(len(safe_op), dtype=bool)
    seq = ops["autograd_seq"]
    seen = np.maximum.accumulate(np.where(seq >= 0, seq, -1))
    prev = np.concatenate([[seq[0] if seq[0] >= 0 else -1], seen[:-1]])
    created = (seq >= 0) & (seq > prev)
    return created[safe_op]


class AccessWindows:
    """A stopped session's accesses table a window of ops at a time (`frames`: one DataFrame per window, in op
    order; the session's `access_windows` decodes each from its streams). As the windows pass it keeps what the
    join reads of them (`first`: each block's first accesses) and counts their rows (`rows`). Read again, the
    windows start over."""

    def __init__(self, session: Session, ops: Columns, alloc_op: np.ndarray, ops_per_window: int,
                 records_per_window: int):
        self.session = session
        self.start, self.end = ops["start_ns"].copy(), ops["end_ns"].copy()
        self.ops_per_window, self.records_per_window = ops_per_window, records_per_window
        self.first = FirstAccesses(alloc_op)
        self.rows = 0

    def frames(self):
        acc_end = self.session.access_ends()
        for lo, hi, packed in self.session.access_windows(self.ops_per_window, self.records_per_window):
            window = accesses_of_ops(packed, np.diff(acc_end[lo:hi + 1]), lo, self.start, self.end)
            self.first.add(window)
            self.rows += len(window)
            yield window.to_frame(FRAME_DTYPES["accesses"])


class FirstAccesses:
    """Per block, as windows of accesses pass: the first access (lowest (t_ns, op_id)) and the first
    access by another op than `alloc_op` (the op that made the block, -1: none). 32 bytes per block.

    `frame()` gives those rows as an accesses table: `joining.refine_autograd_seeds` and `join._first_seen`,
    given it instead of every access, answer the same (they read exactly these two facts)."""

    def __init__(self, alloc_op: np.ndarray):
        n = len(alloc_op)
        self.alloc_op = np.asarray(alloc_op, dtype=np.int64)
        self.any_t, self.any_op = np.full(n, _NONE), np.full(n, _NONE)
        self.other_t, self.other_op = np.full(n, _NONE), np.full(n, _NONE)

    def add(self, accesses: Columns) -> None:
        """Take in one window's accesses (any order)."""
        block = np.asarray(accesses["block_id"], dtype=np.int64)
        t = np.asarray(accesses["t_ns"], dtype=np.int64)
        op = np.asarray(accesses["op_id"], dtype=np.int64)
        self._lower(self.any_t, self.any_op, block, t, op)
        other = op != self.alloc_op[block]
        self._lower(self.other_t, self.other_op, block[other], t[other], op[other])

    @staticmethod
    def _lower(best_t, best_op, block, t, op) -> None:
        if len(block) == 0:
            return
        order = np.lexsort((op, t, block))
        block, t, op = block[order], t[order], op[order]
        first = np.ones(len(block), dtype=bool)
        first[1:] = block[1:] != block[:-1]
        block, t, op = block[first], t[first], op[first]
        lower = (t < best_t[block]) | ((t == best_t[block]) & (op < best_op[block]))
        best_t[block[lower]] = t[lower]
        best_op[block[lower]] = op[lower]

    def frame(self) -> Columns:
        """The rows kept, as an accesses table (is_write is not kept: False)."""
        parts = []
        for best_t, best_op in ((self.any_t, self.any_op), (self.other_t, self.other_op)):
            rows = np.flatnonzero(best_t != _NONE)
            parts.append(Columns(len(rows), {"block_id": rows.astype(np.int64), "t_ns": best_t[rows],
                                             "op_id": best_op[rows], "is_write": np.zeros(len(rows), dtype=bool)}))
        return Columns.concat(parts)
