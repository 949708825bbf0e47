"""One recording: the dispatch-mode hot path that logs ops, accesses, allocations and frees.

Tensors map to blocks through their storage: `tensor.untyped_storage()` is one Python object per
storage (PyTorch preserves it while the storage lives), so `id(storage)` identifies the block and a
weak reference with a callback on it fires exactly when the storage is freed, also for frees that
run no op (``zero_grad(set_to_none=True)``, stolen gradients). Only weak references are kept: the
recorder never extends a tensor's life. Everything is appended to compact int64 streams
(`EventBuffers`); the builder turns them into a Trace afterwards.
"""
from __future__ import annotations

import threading
import warnings
from itertools import repeat
from time import perf_counter_ns

import numpy as np
import torch
from torch._C import _current_autograd_node
from torch._C._autograd import _get_sequence_nr

from memlens.recording.attribution import Attribution
from memlens.recording.dispatch_mode import _orphaned_modes, _orphans_lock, _RecordingMode, reap_orphaned_modes
from memlens.recording.buffers import EventBuffers
from memlens.recording.costs import CostCache, signature_args, signature_value
from memlens.opfacts.opinfo import METADATA, VIEW
from memlens.opfacts.opinfo import classify_cached as classify
from memlens.recording.stacks import StackTable
from memlens.recording.storage_blocks import StorageBlocks, _inner_tensors  # noqa: F401  (importable from here)

Tensor = torch.Tensor
_SEQ_CAP = (1 << 62)           # AccumulateGrad nodes carry UINT64_MAX as sequence number
_ALL_READS = repeat(0)          # write flags of an op whose arguments are all read (zip stops at the args)


def _writes_apply(pos_writes: tuple, write_if: int, args: tuple) -> bool:
    """Whether the schema's written positions apply to this call: the op writes some argument, and its
    conditional-write argument (`write_if` >= 0, e.g. an optional out=) is passed and set."""
    return bool(pos_writes) and (write_if < 0 or (len(args) > write_if and bool(args[write_if])))


def _own_time(name: str):
    """The hook `name` of `Attribution` (looked up at each call), its run logged as the recorder's own time."""
    def timed(self, *args):
        t0 = perf_counter_ns()
        try:
            return getattr(Attribution, name)(self, *args)
        finally:
            self.own_extend((t0, perf_counter_ns()))
    timed.__name__, timed.__doc__ = name, getattr(Attribution, name).__doc__
    return timed


class Session(Attribution, StorageBlocks):
    """State of one recording (the public `Recorder` creates one per `with` block or decorated call)."""

    backend = "python"

    def __init__(self, *, model=None, stacks: bool = False, max_buffer_bytes: int = 512 << 20,
                 module_prefix: str = "model"):
        self.buf = EventBuffers(max_buffer_bytes)
        self.model = model
        self.module_prefix = module_prefix
        self.op_names: list[str] = []
        self.op_funcs: list = []                 # the OpOverload of each name index
        self.costs = CostCache()                 # per-op cost signatures, facts computed at build time
        self._costs_index = self.costs.index
        self._op_cache: dict[int, tuple] = {}    # id(OpOverload) -> learn_op entry
        self.op_cache_get = self._op_cache.get
        self.module_paths: list[str] = [""]
        self._module_idx: dict[int, int] = {}
        self._module_stack: list[tuple[int, int, object]] = []  # (id, caller ctx, module) in forward
        self._ctx = 0                       # (module_idx << 2) | phase bits
        self._live: dict[int, int] = {}     # id(storage) -> block_id
        self._refs: dict[int, tuple] = {}   # id(weakref) -> (weakref, block_id, id(storage))
        self.devices: list[str] = []
        self._device_idx: dict = {}
        self.n_ops = 0
        self.n_blocks = 0
        self.active = False
        self.stop_reason: str | None = None
        self.owner_thread = threading.get_ident()
        self.lock = threading.RLock()   # reentrant: a free callback may run inside an op record (GC)
        self.stack_table = StackTable() if stacks else None
        self.t_start = self.t_stop = 0
        self.peak_buffer_bytes = 0
        self._marked: set[tuple[int, int]] = set()   # (block_id, category) already in `marks`
        self.tensors_without_storage = 0    # tensors skipped because they have no storage (sparse ...)
        self._next_budget_check = 0
        self._mode = _RecordingMode(self)
        self._mode_pushed = False
        b = self.buf
        self._ops_extend = b.ops.data.extend
        self._acc_data = b.accesses.data
        self._acc_append = b.accesses.data.append
        self._blocks_extend = b.blocks.data.extend
        self._frees_extend = b.frees.data.extend
        self._sigs_append = b.op_sigs.data.append
        # the recorder's own time, as (start, end) pairs of perf_counter ns (memlens.recording.own_clock); in the
        # buffers, so that the byte budget and the reported recorder memory count it
        self.own_extend = b.own.data.extend

    # ---- start / stop -----------------------------------------------------------------------
    def start(self) -> None:
        """Begin recording in the calling thread (pushes the dispatch mode)."""
        reap_orphaned_modes()
        self.owner_thread = threading.get_ident()
        self.t_start = perf_counter_ns()
        self.active = True
        self._mode.__enter__()
        self._mode_pushed = True
        if self.model is not None:
            t0 = perf_counter_ns()
            self._register_modules(self.model, self.module_prefix)
            self.own_extend((t0, perf_counter_ns()))

    def stop(self) -> None:
        """Stop recording: pop the mode and drop every weak reference (no callbacks after this)."""
        with self.lock:   # an op record in another thread finishes first; none starts after this
            if self.active:
                self.t_stop = perf_counter_ns()
            self.active = False
        try:
            if self._mode_pushed:
                self._mode_pushed = False
                if threading.get_ident() == self.owner_thread:
                    self._mode.__exit__(None, None, None)
                else:
                    # the dispatch-mode stack is per thread: this thread cannot pop the owner's. The mode
                    # passes every op through from now on (active is False) and the owner thread pops it
                    # at its next memlens call (record, step)
                    with _orphans_lock:
                        _orphaned_modes.append((self.owner_thread, self._mode))
        finally:
            self._release_refs()

    def _release_refs(self) -> None:
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self.buf.nbytes)
        if not self.t_stop:
            self.t_stop = perf_counter_ns()
        self._refs.clear()
        self._live.clear()

    # ---- hooks: their time is the recorder's own, left out of the clock (memlens.recording.own_clock) ---
    enter_module = _own_time("enter_module")
    exit_module = _own_time("exit_module")
    optimizer_pre = _own_time("optimizer_pre")
    optimizer_post = _own_time("optimizer_post")
    mark_step = _own_time("mark_step")

    def onto_own_clock(self, allocator, clock: tuple[int, int]) -> None:
        """After the recording: its times and `allocator`'s moved onto the clock without the recorder's own
        time (`memlens.recording.own_clock.session_onto_own_clock`)."""
        from memlens.recording.own_clock import session_onto_own_clock
        session_onto_own_clock(self, allocator, clock)

    def unix_to_trace_ns(self, clock: tuple[int, int]) -> int:
        """Nanoseconds to add to a unix-ns time (the allocator's and the kernels' clock) to get trace ns;
        `clock` is (time.time_ns(), time.perf_counter_ns()) read together at the start."""
        wall0, perf0 = clock
        return perf0 - wall0 - self.t_start

    # ---- after stop: the accesses a window of ops at a time (the streaming save) -------------------
    def access_windows(self, max_ops: int, max_records: int):
        """Yield (first op, end op, packed accesses of ops [first, end): int64, block << 1 | write) in op
        order, from the start each time it is called: windows of at most `max_ops` ops and, past their
        first op, `max_records` records. This recorder holds them in memory: these are slices of its buffer
        (the compiled one decodes them window by window)."""
        acc_end = self.access_ends()
        n = len(acc_end) - 1
        packed = self.buf.accesses.to_numpy()[:, 0]
        lo = 0
        while lo < n:
            hi = min(lo + max(max_ops, 1), n)
            # the most ops from lo whose records fit max_records (at least one)
            hi = max(lo + 1, min(hi, int(np.searchsorted(acc_end, acc_end[lo] + max_records, side="right")) - 1))
            yield lo, hi, packed[acc_end[lo]:acc_end[hi]]
            lo = hi

    def access_ends(self) -> np.ndarray:
        """[0, accesses recorded up to the end of op 0, ... of op n-1]: int64, n + 1 values (column 5 of the
        op records, as `on_op` writes it; only that column is copied, not the whole records)."""
        ops = self.buf.ops
        n = len(ops)
        if n == 0:
            return np.zeros(1, np.int64)
        flat = np.frombuffer(ops.data, dtype=np.int64, count=n * ops.width)
        ends = np.concatenate([[0], flat[5::ops.width]])
        del flat            # release the buffer export so that the stream can grow again
        return ends

    def load_all_accesses(self) -> None:
        """Make sure every access is in `buf.accesses` (they are, here; see CompiledSession)."""

    def close_windows(self) -> None:
        """Free what `access_windows` reads from (nothing here; see CompiledSession)."""

    def fail(self, exc: BaseException) -> None:
        """An internal error: warn, stop recording, keep what was recorded so far."""
        if self.active:
            self.active = False
            self.t_stop = perf_counter_ns()
            self.stop_reason = f"internal error after {self.n_ops} ops: {type(exc).__name__}: {exc}"
            warnings.warn(f"memlens: recording stopped ({self.stop_reason}); the trace so far is kept",
                          RuntimeWarning, stacklevel=3)
            self._release_refs()

    def _check_budget(self, op: int) -> None:
        """Stop when over budget; else schedule the next check assuming <= 1 KiB of events per op, so
        the budget is overshot by at most what the ops since the last check really used."""
        used = self.buf.nbytes
        if used > self.buf.max_bytes:
            self._stop_on_budget()
        else:
            self._next_budget_check = op + max(1, (self.buf.max_bytes - used) // 1024)

    def _stop_on_budget(self) -> None:
        self.active = False
        self.t_stop = perf_counter_ns()
        self.stop_reason = (f"buffer budget of {self.buf.max_bytes} bytes reached after {self.n_ops} ops; "
                            "raise max_buffer_bytes to record longer")
        warnings.warn(f"memlens: recording stopped ({self.stop_reason}); the trace so far is kept",
                      RuntimeWarning, stacklevel=4)
        self._release_refs()

    # ---- the hot path -----------------------------------------------------------------------
    def on_op(self, entry, args, kwargs, out, start, end) -> None:
        """Log one ATen op (its `learn_op` entry): its reads, its writes, the blocks it created."""
        name_idx, kind, pos_writes, kw_writes, write_if, _, _, resizes = entry
        op = self.n_ops
        self.n_ops = op + 1
        live_get = self._live.get
        acc = self._acc_append
        discover = self._discover
        if kind != VIEW and kind != METADATA:
            writes = pos_writes if _writes_apply(pos_writes, write_if, args) else _ALL_READS
            for a, w in zip(args, writes):
                if isinstance(a, Tensor):
                    st = a.untyped_storage()
                    b = live_get(id(st))
                    if b is None:
                        b = discover(st, op, start, True)
                    if b >= 0:
                        acc((b << 1) | w)
                elif type(a) is list or type(a) is tuple:
                    self._touch(a, w, op, start)
            if kwargs:
                for k, v in kwargs.items():
                    self._touch(v, 1 if k in kw_writes else 0, op, start)
        written = 0 if kind == VIEW else 1
        outs = (out,) if isinstance(out, Tensor) else out if type(out) is tuple or type(out) is list else ()
        for o in outs:
            if isinstance(o, Tensor):
                st = o.untyped_storage()
                b = live_get(id(st))
                if b is None:
                    b = discover(st, op, start, kind == VIEW)
                if b >= 0 and written:
                    acc((b << 1) | 1)
        if resizes and args:
            self._check_reallocated(args[0], op, start, end)
        sig = self._cost_signature(name_idx, kind, args, kwargs, out)
        node = _current_autograd_node()
        aseq = _get_sequence_nr() if node is None else -2 - min(node._sequence_nr(), _SEQ_CAP)
        self._ops_extend((name_idx, self._ctx, start, end, aseq, len(self._acc_data)))
        self._sigs_append(sig)
        if self.stack_table is not None:
            self.buf.op_stacks.data.append(self.stack_table.capture())
        if op >= self._next_budget_check:
            self._check_budget(op)

    def on_op_carefully(self, entry, args, kwargs, out, start, end) -> None:
        """The slow path after `on_op` raised: undo its partial records, then log the op skipping
        tensors that have no storage (sparse, nested, some subclasses); they are counted."""
        if not self.active:
            return
        ops_data = self.buf.ops.data
        self.n_ops = len(ops_data) // self.buf.OPS_WIDTH
        del self._acc_data[ops_data[-1] if len(ops_data) else 0:]
        name_idx, kind, pos_writes, kw_writes, write_if, _, _, resizes = entry
        op = self.n_ops
        self.n_ops = op + 1
        if kind != VIEW and kind != METADATA:
            writes = pos_writes if _writes_apply(pos_writes, write_if, args) else ()
            for i, a in enumerate(args):
                self._touch_safely(a, int(i < len(writes) and writes[i]), op, start)
            for k, v in kwargs.items():
                self._touch_safely(v, int(k in kw_writes), op, start)
        self._touch_safely(out, 0 if kind == VIEW else 1, op, start, fresh=kind != VIEW)
        try:
            sig = self._cost_signature(name_idx, kind, args, kwargs, out)
        except Exception:   # arguments whose shape cannot be read: no cost facts for this op
            sig = -1
        node = _current_autograd_node()
        aseq = _get_sequence_nr() if node is None else -2 - min(node._sequence_nr(), _SEQ_CAP)
        self._ops_extend((name_idx, self._ctx, start, end, aseq, len(self._acc_data)))
        del self.buf.op_sigs.data[self.n_ops - 1:]       # drop the failed fast path's entry, if any
        self._sigs_append(sig)
        if self.stack_table is not None:
            self.buf.op_stacks.data.append(self.stack_table.capture())

    def _cost_signature(self, name_idx: int, kind: int, args, kwargs, out) -> int:
        """The op's cost-signature number (-1 for views: they cost nothing). The signature is the
        op plus each argument's (shape, dtype) or scalar value and the results' (shape, dtype); facts
        are computed once per distinct signature when the trace is built."""
        if kind == VIEW:
            return -1
        a = signature_args(args)
        k = signature_value(tuple(kwargs.items())) if kwargs else ()
        o = (out.shape, out.dtype) if isinstance(out, Tensor) else signature_value(out)
        return self._costs_index((name_idx, a, k, o), self.op_funcs[name_idx], a, dict(k), o)

    def learn_op(self, func) -> tuple:
        """Classify `func` once per session. The entry (a tuple, indexed in the hot path) is
        (0 name index, 1 kind, 2 positional writes as 0/1, 3 keyword writes, 4 conditional-write
        argument, 5 the C++ callable that runs it, 6 `func` itself (immortal; keeps `id` unique),
        7 whether it may reallocate `self` in place)."""
        info = classify(func)
        self.op_names.append(info.name)
        self.op_funcs.append(func)
        call = getattr(func, "_op", func)
        pos_writes = tuple(int(w) for w in info.pos_writes)      # 0/1, ready to pack into accesses
        entry = (len(self.op_names) - 1, info.kind, pos_writes, info.kw_writes, info.write_if_arg, call, func,
                 info.resizes)
        self._op_cache[id(func)] = entry
        return entry

