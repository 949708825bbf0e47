"""A recording session whose per-op hot path is compiled (`memlens.recording.native`, recorder.cpp).

The C++ side logs ops, accesses, blocks, frees and allocator events into fixed-size records, and
tracks the module stack itself (its own forward pre/post hooks, `Recording.enter_module` /
`exit_module`: one C++ call per module call); the Python side names modules the first time they are
met, marks a root module's inputs, and keeps what happens per step (categories from
parameters/gradients/optimizer state, iteration marks: `Attribution`), exactly as the Python
recorder does. At the end the records are drained with numpy into the same int64 streams the Python
`Session` fills, so `memlens.recording.pipeline.build_trace` builds both backends' traces with the same code.

With stacks=True the C++ side also walks the Python frames of each op at its end (native/op_stacks.h:
the same user frames, order, depth and dedup as stacks.StackTable); `_drain_stacks` (compiled_drain.py)
turns them into the same `op_stacks` stream and stack table.

Clock: every time is on the compiled recorder's clock (monotonic ns minus the recorder's own time in
the thread, including the Python hooks below), so a trace's gaps are the program's, not the recorder's.
"""
from __future__ import annotations


import numpy as np

import torch

from memlens.recording.attribution import (ITER_OPTIMIZER, Attribution, MARK_GRADIENT, MARK_INPUT, MARK_OPTIMIZER_STATE,
                                        MARK_PARAMETER, PHASE_OPTIMIZER)
from memlens.recording.compiled_drain import (BLOCK_DTYPE, CTX_DTYPE, FREE_DTYPE, MEM_DTYPE,  # noqa: F401
                                           OP_DTYPE, WIDE_DTYPE, CompiledDrain)
from memlens.recording.compiled_signatures import decode_signature
from memlens.recording.session import Session
from memlens.recording.spill import remove_spill_files, spill_prefix
from memlens.recording.stacks import SKIP_PREFIXES


class CompiledSession(CompiledDrain, Session):
    """`Session` with the C++ hot path; same public behaviour and the same streams after `stop()`."""

    backend = "compiled"
    python_module_hooks = False     # its module hooks are C++ (Recording.enter_module / exit_module)

    def __init__(self, *, native, memory: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.native = native
        self.memory = memory
        self._handle = None
        self._drained = None
        self._ctx_value = 0
        self.memory_events = None          # DataFrame of allocator events (t_ns on this clock)
        self.memory_note = ""
        self.signatures: list[bytes] = []
        self.sig_of_op = np.empty(0, np.int64)
        self.recorder_bytes = 0
        self.spilled_bytes = 0
        self._spill_dir = None
        self._drained_peak = None     # the C++ recording's peak bytes, once drained
        self._own0 = 0
        self._module_hooks: list = []      # torch hook handles of the C++ module hooks
        self.own_ns = 0                    # the recorder's own time subtracted from this thread's clock
        # set before stop() by a recorder that saves as it goes (save_to=): the accesses stay in the C++
        # streams and are read a window at a time (access_windows) instead of all at once into `buf`
        self.stream_accesses = False
        self._windows = None               # the stopped C++ recording that still holds the accesses
        self.accesses_not_in_buffer = 0    # accesses left in C++ (counted in the metadata's buffer bytes)

    # the module context word lives in C++ (copied into every op record; the C++ module hooks change it)
    @property
    def _ctx(self) -> int:
        handle = self.__dict__.get("_handle")
        if handle is not None:
            return handle.ctx()
        return self.__dict__.get("_ctx_value", 0)

    @_ctx.setter
    def _ctx(self, value: int) -> None:
        self.__dict__["_ctx_value"] = value
        handle = self.__dict__.get("_handle")
        if handle is not None:
            handle.set_ctx(value)

    @property
    def n_ops(self) -> int:
        handle = self.__dict__.get("_handle")
        if handle is not None:
            return handle.n_ops()
        return self.__dict__.get("_n_ops", 0)

    @n_ops.setter
    def n_ops(self, value: int) -> None:
        self.__dict__["_n_ops"] = value

    # ---- start / stop -----------------------------------------------------------------------
    def start(self) -> None:
        self._spill_dir = spill_prefix()        # (a prefix of files in the process's spill directory)
        self._handle = self.native.Recording(int(self.buf.max_bytes), self._spill_dir,
                                             bool(self.memory))
        self.t_start = self.native.now()
        self._own0 = self.native.own_ns()
        self.active = True
        self._handle.set_ctx(self._ctx_value)
        if self.stack_table is not None:    # stacks=True: captured in C++ at each op's end (op_stacks.h)
            self._handle.enable_stacks(list(SKIP_PREFIXES), self.stack_table.max_depth)
        self._handle.set_enter_slow(self._enter_module_slow)
        if self.model is not None:
            self._timed(self._register_modules, self.model, self.module_prefix)
        # module enter/exit go straight to C++ (see hooks.py: this session is not in the Python module hooks)
        import torch.nn.modules.module as mm
        self._module_hooks = [mm.register_module_forward_pre_hook(self._handle.enter_module),
                              mm.register_module_forward_hook(self._handle.exit_module, always_call=True)]

    def stop(self) -> None:
        handle = self._handle
        if handle is None:
            return
        if self.active:
            self.t_stop = self.native.now()
        self.active = False
        self.own_ns = self.native.own_ns() - self._own0
        self._remove_module_hooks()
        try:
            handle.stop()           # callbacks and the memory hook are gone after this
        finally:
            if not self.t_stop:
                self.t_stop = self.native.now()
            self._n_ops_final = handle.n_ops()
            self._handle = None
            self.n_ops = self._n_ops_final
            keep = False
            try:
                if self.stream_accesses:
                    d = handle.drain_windowed()
                    self.accesses_not_in_buffer = int(d["parts"]["n_acc"])
                    self._drain(d)
                    self._drain_stacks(handle.drain_stacks())
                    self._windows, keep = handle, True     # its spill files are read by access_windows
                else:
                    self._drain(handle.drain())
                    self._drain_stacks(handle.drain_stacks())
            finally:
                if not keep:
                    self._remove_spill_dir()

    # ---- after a windowed drain: the accesses from the C++ streams ---------------------------------
    def access_windows(self, max_ops: int, max_records: int):
        """As Session.access_windows; after a windowed drain each window is decoded in C++ from the coded
        streams (memory and spill files): only one window's records (4 bytes each) exist at a time."""
        if self._windows is None:
            yield from super().access_windows(max_ops, max_records)
            return
        handle = self._windows
        handle.rewind_accesses()
        n = len(self.buf.ops)
        lo = 0
        while lo < n:
            taken, raw = handle.next_accesses(max_ops, max_records)
            if taken == 0:   # the C++ side has no more ops than buf.ops: never, but never loop forever
                raise RuntimeError(f"memlens: the recorder's access windows ended at op {lo} of {n}")
            yield lo, lo + taken, np.frombuffer(raw, dtype="<i4").astype(np.int64)
            lo += taken

    def load_all_accesses(self) -> None:
        """Read every access into `buf.accesses` (the in-memory path), then free the C++ streams."""
        if self._windows is None:
            return
        parts = [packed for _, _, packed in self.access_windows(1 << 20, 1 << 24)]
        acc = np.concatenate(parts) if parts else np.empty(0, np.int64)
        self.buf.accesses.replace(acc.reshape(-1, 1))
        self.accesses_not_in_buffer = 0
        self.close_windows()

    def close_windows(self) -> None:
        """Free the C++ access streams and remove their spill files."""
        handle, self._windows = self._windows, None
        if handle is not None:
            try:
                handle.close_windows()
            finally:
                self._remove_spill_dir()

    def _remove_module_hooks(self) -> None:
        while self._module_hooks:
            self._module_hooks.pop().remove()

    def _release_refs(self) -> None:      # the Python session's weakrefs: none here
        if not self.t_stop:
            self.t_stop = self.native.now()
        self._remove_module_hooks()
        if self._handle is not None:
            try:
                self._handle.stop()
            except Exception:     # the session is failing already: stopping is best effort, never raised
                pass

    def _remove_spill_dir(self) -> None:
        if self._spill_dir:
            # the C++ side opens a spill file only when a budget check finds it over `max_bytes`, after
            # raising its peak to that use: a drained peak within the budget means no file exists (a
            # directory listing per close saved); before a drain (or after a failed one) always look
            if self._drained_peak is None or self._drained_peak > self.buf.max_bytes:
                remove_spill_files(self._spill_dir)
            self._spill_dir = None

    # ---- hooks: the Python part of the recorder's own time ----------------------------------
    def _timed(self, fn, *args):
        """Run a Python hook `fn` with its time taken out of the recorder's clock.

        The hook's time is read on the recorder's own clock (`native.now()`, ns), not a plain one: the
        compiled calls it makes (`mark`, op callbacks, the memory hook) already take their own time out
        of that clock, and counting them again moved the clock back by that much at every hook (under
        load, by milliseconds: the first allocations of a recording then fell before its start)."""
        t0 = self.native.now()
        try:
            return fn(*args)
        finally:
            self.native.add_own_ns(max(self.native.now() - t0, 0))

    def _enter_module_slow(self, module, args) -> None:
        """The C++ pre-hook's path for a root module (its tensor arguments are inputs) and for a module
        met for the first time (named here, then entered from C++ directly)."""
        self._timed(self._enter_module, module, args)

    def _enter_module(self, module, args) -> None:
        try:
            handle = self._handle
            if not self.active or handle is None:
                return
            idx = self._module_idx.get(id(module))
            if idx is None:
                idx = self._name_unknown_module(module)
            is_root = handle.module_depth() == 0
            handle.push_module(module, idx)
            if is_root:
                for a in args:
                    self.mark(a, MARK_INPUT)
        except Exception as exc:
            self.fail(exc)

    def _name_unknown_module(self, module) -> int:
        """As the Python session's, with the parent taken from the C++ module stack."""
        parent = self._handle.module_top() if self._handle is not None else None
        if parent is not None:
            parent_path = self.module_paths[self._module_idx[id(parent)]]
            child = next((n for n, m in parent.named_children() if m is module), type(module).__name__)
            self._register_modules(module, f"{parent_path}.{child}")
        else:
            self._register_modules(module, type(module).__name__)
        return self._module_idx[id(module)]

    def optimizer_pre(self, optimizer) -> None:
        self._timed(self._optimizer_pre, optimizer)

    def optimizer_post(self, optimizer) -> None:
        self._timed(self._optimizer_post, optimizer)

    def mark_step(self) -> None:
        self._timed(Attribution.mark_step, self)

    def onto_own_clock(self, allocator, clock) -> None:
        """Nothing to move: this recorder's clock leaves its own time out as it records (native/clock.h)."""

    # Categories: the hooks mark the same parameters, gradients and optimizer state at every step; the
    # compiled session hands each hook's tensors to C++ in one call (which keeps the "marked once" set),
    # in the order the Python session marks them, so blocks are discovered in the same order.
    def _mark_locked(self, tensor, category: int, module_idx: int) -> None:
        handle = self._handle
        if handle is not None:
            self.buf.marks.data.extend(handle.mark([tensor], [category], module_idx))

    def _mark_many(self, tensors: list, categories: list, module_idx: int = 0) -> None:
        handle = self._handle
        if handle is None or not self.active or not tensors:
            return
        try:
            with self.lock:
                self.buf.marks.data.extend(handle.mark(tensors, categories, module_idx))
        except Exception as exc:
            self.fail(exc)

    def _optimizer_pre(self, optimizer) -> None:
        if not self.active:
            return
        self._ctx |= PHASE_OPTIMIZER
        tensors, cats = [], []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if isinstance(p, torch.Tensor):
                    tensors.append(p)
                    cats.append(MARK_PARAMETER)
                    if isinstance(p.grad, torch.Tensor):
                        tensors.append(p.grad)
                        cats.append(MARK_GRADIENT)
        self._mark_many(tensors, cats)

    def _optimizer_post(self, optimizer) -> None:
        self._ctx &= ~PHASE_OPTIMIZER
        if not self.active:
            return
        tensors = [v for state in list(optimizer.state.values()) for v in state.values()
                   if isinstance(v, torch.Tensor)]
        self._mark_many(tensors, [MARK_OPTIMIZER_STATE] * len(tensors))
        self.buf.iter_marks.data.extend((self.n_ops, ITER_OPTIMIZER))

    def mark_model_gradients(self) -> None:
        if self.model is None or not self.active:
            return
        grads = [p.grad for p in self.model.parameters() if isinstance(p.grad, torch.Tensor)]
        self._mark_many(grads, [MARK_GRADIENT] * len(grads))

    # ---- signatures (for per-op cost facts) --------------------------------------------------
    def decode_signature(self, sig: int) -> tuple:
        """(op name, inputs, outputs) of signature `sig`: tensors as ("tensor", dtype code, shape), lists
        as lists, scalars as Python values (see recorder.cpp put_value)."""
        return decode_signature(self.signatures[sig], self.op_names)
