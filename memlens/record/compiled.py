"""A recording session whose per-op hot path is compiled (`memlens.record.native`, recorder.cpp).

The C++ side logs ops, accesses, blocks, frees and allocator events into fixed-size records, and
tracks the module stack itself (its own forward pre/post hooks, `Recording.enter_module` /
`exit_module`: one C++ call per module call); the Python side names modules the first time they are
met, marks a root module's inputs, and keeps what happens per step (categories from
parameters/gradients/optimizer state, iteration marks: `Attribution`), exactly as the Python
recorder does. At the end the records are drained with numpy into the same int64 streams the Python
`Session` fills, so `assemble_trace` builds both backends' traces with the same code.

With stacks=True the C++ side also walks the Python frames of each op at its end (native/op_stacks.h:
the same user frames, order, depth and dedup as stacks.StackTable); `_drain_stacks` turns them into the
same `op_stacks` stream and stack table.

Clock: every time is on the compiled recorder's clock (monotonic ns minus the recorder's own time in
the thread, including the Python hooks below), so a trace's gaps are the program's, not the recorder's.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pandas as pd

import torch

from memlens.record.attribution import (ITER_OPTIMIZER, MARK_GRADIENT, MARK_INPUT, MARK_OPTIMIZER_STATE,
                                        MARK_PARAMETER, PHASE_OPTIMIZER)
from memlens.record.session import Session
from memlens.record.stacks import SKIP_PREFIXES, StackTable

OP_DTYPE = np.dtype([("dstart", "<i4"), ("dur", "<u4"), ("aseq", "<i4"), ("sig_nacc", "<u4")])
WIDE_DTYPE = np.dtype([("op", "<i8"), ("kind", "<i8"), ("value", "<i8")])
CTX_DTYPE = np.dtype([("op", "<i8"), ("ctx", "<i8")])
BLOCK_DTYPE = np.dtype([("ptr", "<i8"), ("size_dev", "<i8"), ("op_before", "<u4"), ("alloc_dt", "<u4")])
_U32_MAX = (1 << 32) - 1
FREE_DTYPE = np.dtype([("t", "<i8"), ("block", "<i4")])
MEM_DTYPE = np.dtype([("t", "<i8"), ("ptr", "<i8"), ("delta_dev", "<i8")])
_NATIVE_SEQ_CAP = 1 << 30       # recorder.cpp caps backward node numbers here (int32 records)
_SEQ_CAP = 1 << 62              # the Python recorder's cap (session._SEQ_CAP)


class CompiledSession(Session):
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
        self._spill_dir = tempfile.mkdtemp(prefix="memlens-spill-")
        self._handle = self.native.Recording(int(self.buf.max_bytes), os.path.join(self._spill_dir, "rec"),
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
        self._fill(self.buf.accesses, acc.reshape(-1, 1))
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
            except Exception:
                pass

    def _remove_spill_dir(self) -> None:
        if self._spill_dir:
            for name in os.listdir(self._spill_dir):
                try:
                    os.remove(os.path.join(self._spill_dir, name))
                except OSError:
                    pass
            try:
                os.rmdir(self._spill_dir)
            except OSError:
                pass
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
        self._timed(super().mark_step)

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

    # ---- drain: C++ records -> the Session's int64 streams ----------------------------------
    def _drain(self, d: dict) -> None:
        ops = np.frombuffer(d["ops"], dtype=np.uint8).view(OP_DTYPE)
        acc = np.frombuffer(d["accesses"], dtype=np.uint8).view("<i4").astype(np.int64)
        blocks = np.frombuffer(d["blocks"], dtype=np.uint8).view(BLOCK_DTYPE)
        frees = np.frombuffer(d["frees"], dtype=np.uint8).view(FREE_DTYPE)
        mem = np.frombuffer(d["memory"], dtype=np.uint8).view(MEM_DTYPE)
        self.op_names = list(d["op_names"])
        self.signatures = list(d["sigs"])
        self.devices = list(d["devices"])
        self.tensors_without_storage += int(d["tensors_without_storage"])
        self.recorder_bytes = int(d["peak_bytes"])
        self.spilled_bytes = int(d["spilled_bytes"])
        self.recorder_parts = dict(d["parts"])
        self.memory_note = d["memory_note"]
        if d["late_frees"]:
            note = (f"{d['late_frees']} storages were freed in threads without the memory hook; their free "
                    "time is the end of the recording")
            self.memory_note = f"{self.memory_note}; {note}" if self.memory_note else note
        if d["stop_reason"] and not self.stop_reason:
            self.stop_reason = d["stop_reason"]
        n = len(ops)
        raw = self._decode_ops(ops, np.frombuffer(d["wide"], dtype=np.uint8).view(WIDE_DTYPE),
                               np.frombuffer(d["ctx"], dtype=np.uint8).view(CTX_DTYPE), int(d["first_start"]))
        start, end, sig, nacc, ctx = raw
        sig_name = np.asarray([int.from_bytes(s[:8], "little", signed=True) for s in self.signatures],
                              dtype=np.int64)
        self.sig_of_op = sig
        aseq = ops["aseq"].astype(np.int64)
        aseq = np.where(aseq == -2 - _NATIVE_SEQ_CAP, -2 - _SEQ_CAP, aseq)
        table = np.empty((n, 6), dtype=np.int64)
        table[:, 0] = sig_name[sig] if n else 0
        table[:, 1] = ctx
        table[:, 2] = start
        table[:, 3] = end
        table[:, 4] = aseq
        table[:, 5] = np.cumsum(nacc)
        self._fill(self.buf.ops, table)
        self._fill(self.buf.accesses, acc.reshape(-1, 1))
        nb = len(blocks)
        size = blocks["size_dev"] & ((1 << 48) - 1)
        dev = blocks["size_dev"] >> 48
        before = (blocks["op_before"] >> 31).astype(np.int64)
        op = (blocks["op_before"] & 0x7FFFFFFF).astype(np.int64)
        safe = np.clip(op, 0, max(n - 1, 0))
        made_t = np.where((before == 0) & (op < n), start[safe] if n else -1, -1)
        claimed = blocks["alloc_dt"] != _U32_MAX
        self._block_cols = {"ptr": blocks["ptr"], "size": size, "dev": dev, "claimed": claimed,
                            "alloc_t": np.where(claimed & (op < n), (start[safe] if n else 0)
                                                + blocks["alloc_dt"].astype(np.int64), -1)}
        btable = np.empty((nb, 7), dtype=np.int64)
        btable[:, 0] = np.arange(nb)
        btable[:, 1] = dev
        btable[:, 2] = blocks["ptr"]
        btable[:, 3] = size
        btable[:, 4] = np.where(before == 1, -1, made_t)
        btable[:, 5] = op
        btable[:, 6] = before
        self._fill(self.buf.blocks, btable)
        # Each thread's clock leaves out the recorder's own time in that thread, so clocks of threads
        # feeding one recording drift apart by the difference; a free found in another thread than the
        # block's (a storage that died where no memory hook runs, found by a later op's sweep) can then
        # read earlier than the block's making: it is put at the making (it happened after, unseen).
        free_t = frees["t"].astype(np.int64)
        if len(frees):
            made_at = np.maximum(btable[:, 4], np.where(claimed, self._block_cols["alloc_t"], -1))
            free_t = np.maximum(free_t, made_at[frees["block"]])
        ftable = np.stack([frees["block"], free_t], axis=1) if len(frees) else np.empty((0, 2), np.int64)
        self._fill(self.buf.frees, ftable)
        self.n_blocks = nb
        self.memory_events = self._memory_events(mem, self._block_cols, frees) if self.memory else None

    def _drain_stacks(self, d: dict | None) -> None:
        """stacks=True: one stack id per op into `buf.op_stacks` (-1 for ops recorded before the capture
        was on) and the C++ table's stacks into `stack_table` (same ids, same frames as StackTable)."""
        if d is None or self.stack_table is None:
            return
        n = self.buf.ops.to_numpy().shape[0]
        ids = np.frombuffer(d["ids"], dtype="<i4").astype(np.int64)
        first = min(int(d["first_op"]), n)
        per_op = np.full(n, -1, dtype=np.int64)
        take = min(len(ids), n - first)
        per_op[first:first + take] = ids[:take]
        self._fill(self.buf.op_stacks, per_op.reshape(-1, 1))
        self.stack_table = StackTable.from_frames(d["stacks"], self.stack_table.max_depth)
        self.recorder_bytes += int(d["bytes"])
        if getattr(self, "recorder_parts", None) is not None:
            self.recorder_parts["stacks"] = int(d["bytes"])

    @staticmethod
    def _decode_ops(ops, wide, ctxs, first_start: int):
        """Absolute (start, end, signature, access count, context) per op from the 16-byte records."""
        n = len(ops)
        d = ops["dstart"].astype(np.int64)
        dur = ops["dur"].astype(np.int64)
        sig = (ops["sig_nacc"] >> 8).astype(np.int64)
        nacc = (ops["sig_nacc"] & 0xFF).astype(np.int64)
        absolute = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        for kind, target in ((1, dur), (2, nacc), (3, sig)):
            w = wide[wide["kind"] == kind]
            target[w["op"]] = w["value"]
        w = wide[wide["kind"] == 0]
        absolute[w["op"]] = w["value"]
        escaped = absolute != np.iinfo(np.int64).min
        d[escaped] = 0
        cs = np.cumsum(d)
        # start[j] = offset + cs[j], the offset reset at each escaped (absolute) start
        offset_at = np.where(escaped, absolute - cs, first_start)
        last = np.maximum.accumulate(np.where(escaped, np.arange(n), -1)) if n else np.empty(0, np.int64)
        offset = np.where(last >= 0, offset_at[np.clip(last, 0, None)], first_start)
        start = offset + cs
        ctx = np.zeros(n, dtype=np.int64)
        if len(ctxs) and n:
            # a change recorded when `op` ops existed applies from op `op` on (the last one wins)
            at = np.searchsorted(ctxs["op"], np.arange(n), side="right") - 1
            ctx = np.where(at >= 0, ctxs["ctx"][np.clip(at, 0, None)], 0)
        return start, start + dur, sig, nacc, ctx

    @staticmethod
    def _fill(stream, table: np.ndarray) -> None:
        stream.data = stream.data.__class__("q")
        stream.data.frombytes(np.ascontiguousarray(table, dtype=np.int64).tobytes())

    def _memory_events(self, mem, blocks, frees) -> pd.DataFrame:
        """Every allocator event as the profiler would list it: the raw ones plus the allocations (and
        frees) folded into block records, put back."""
        claimed = np.flatnonzero(blocks["claimed"])
        t = [mem["t"], blocks["alloc_t"][claimed]]
        ptr = [mem["ptr"], blocks["ptr"][claimed]]
        delta = [mem["delta_dev"] >> 8, blocks["size"][claimed]]
        dev = [mem["delta_dev"] & 0xFF, blocks["dev"][claimed].astype(np.int64)]
        fb = frees["block"]
        fc = blocks["claimed"][fb] if len(fb) else np.zeros(0, bool)
        t.append(frees["t"][fc])
        ptr.append(blocks["ptr"][fb[fc]])
        delta.append(-blocks["size"][fb[fc]])
        dev.append(blocks["dev"][fb[fc]].astype(np.int64))
        devices = np.asarray(self.devices + ["?"], dtype=object)
        t_all = np.concatenate(t).astype(np.int64)
        # sorted as arrays, then one frame (a sorted copy of a frame held two frames: ~70 bytes per event)
        order = np.argsort(t_all, kind="stable")
        dev_all = np.concatenate(dev).astype(np.int64)[order]
        return pd.DataFrame({"t_ns": t_all[order],
                             "device": devices[np.where(dev_all < len(self.devices), dev_all, len(self.devices))],
                             "addr": np.concatenate(ptr).astype(np.int64)[order],
                             "delta": np.concatenate(delta).astype(np.int64)[order]})

    # ---- signatures (for per-op cost facts) --------------------------------------------------
    def decode_signature(self, sig: int) -> tuple:
        """(op name, inputs, outputs) of signature `sig`: tensors as ("tensor", dtype code, shape), lists
        as lists, scalars as Python values (see recorder.cpp put_value)."""
        return decode_signature(self.signatures[sig], self.op_names)


def decode_signature(raw: bytes, op_names: list) -> tuple:
    """Decode one signature from recorder.cpp into (op name, inputs, outputs)."""
    words = np.frombuffer(raw, dtype="<i8")

    def read(w, i):
        tag = int(w[i])
        if tag == ord("T"):
            dtype = int(w[i + 1])
            ndim = int(w[i + 2])
            if ndim < 0:
                return ("tensor", dtype, None), i + 3
            return ("tensor", dtype, tuple(int(x) for x in w[i + 3:i + 3 + ndim])), i + 3 + ndim
        if tag == ord("L"):
            k = int(w[i + 1])
            items, j = [], i + 2
            for _ in range(k):
                item, j = read(w, j)
                items.append(item)
            return items, j
        if tag == ord("W"):       # a Python number wrapped as a 0-d tensor by the binding
            return ("scalar", int(w[i + 1])), i + 2
        if tag == ord("I"):
            return int(w[i + 1]), i + 2
        if tag == ord("D"):
            return float(np.frombuffer(np.int64(w[i + 1]).tobytes(), "<f8")[0]), i + 2
        if tag == ord("B"):
            return bool(w[i + 1]), i + 2
        if tag == ord("N"):
            return None, i + 1
        return "?", i + 1

    name = op_names[int(words[0])]
    inputs, outputs, i, side = [], [], 1, 0
    while i < len(words):
        if side == 0 and int(words[i]) == ord("|"):
            side, i = 1, i + 1
            continue
        item, i = read(words, i)
        (outputs if side else inputs).append(item)
    return name, inputs, outputs
