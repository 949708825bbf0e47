"""Which block each storage is (the Python recorder): a storage met for the first time becomes a block,
a weak reference on it records its free, and resize_/set_ that give a storage new bytes end its block and
begin another. Mixed into `memlens.recording.session.Session`, whose hot path calls these."""
from __future__ import annotations

from time import perf_counter_ns
from weakref import ref as _weakref

import numpy as np
import torch

Tensor = torch.Tensor


def _inner_tensors(value) -> list:
    """The tensors a traceable wrapper subclass holds (``__tensor_flatten__``), e.g. a jagged nested
    tensor's values and offsets; [] for ordinary tensors."""
    if type(value) is Tensor or not hasattr(value, "__tensor_flatten__"):
        return []
    try:
        names, _ = value.__tensor_flatten__()
        return [x for x in (getattr(value, n, None) for n in names) if isinstance(x, Tensor)]
    except Exception:
        return []



class StorageBlocks:
    """Block bookkeeping of `Session`: expects its `_live`, `_refs`, `buf`, `devices`, `_device_idx`,
    `n_blocks`, `n_ops` and stream appenders (`_acc_append`, `_blocks_extend`, `_frees_extend`)."""

    def _touch_safely(self, value, write: int, op: int, t: int, fresh: bool = False) -> None:
        if isinstance(value, Tensor):
            inner = _inner_tensors(value)
            if inner:  # a wrapper subclass (jagged nested tensor, ...): its memory is in its inner tensors
                for x in inner:
                    self._touch_safely(x, write, op, t, fresh)
                return
            try:
                st = value.untyped_storage()
                b = self._live.get(id(st))
                if b is None:
                    b = self._discover(st, op, t, not fresh)
            except Exception:
                self.tensors_without_storage += 1
                return
            if b >= 0:
                self._acc_append((b << 1) | write)
        elif type(value) is list or type(value) is tuple:
            for x in value:
                self._touch_safely(x, write, op, t, fresh)

    def _touch(self, value, write: int, op: int, t: int) -> None:
        """Log an access to every tensor in `value` (a tensor or a list/tuple of them)."""
        if isinstance(value, Tensor):
            st = value.untyped_storage()
            b = self._live.get(id(st))
            if b is None:
                b = self._discover(st, op, t, True)
            if b >= 0:
                self._acc_append((b << 1) | write)
        elif type(value) is list or type(value) is tuple:
            for x in value:
                if isinstance(x, Tensor):
                    self._touch(x, write, op, t)

    def run_reallocating_op(self, entry, args, kwargs, t_in: int):
        """Run resize_/set_ and log it, seeing `self`'s allocation before and after the op; `t_in`: when the
        dispatch mode took over (perf_counter ns), the start of the recorder's own time before the op."""
        st = args[0].untyped_storage()
        had_bytes = True
        try:
            had_bytes = st.nbytes() > 0
            if had_bytes and id(st) not in self._live:
                self._discover(st, self.n_ops, perf_counter_ns(), True)
        except Exception as exc:
            self.fail(exc)
        start = perf_counter_ns()
        out = entry[5](*args, **kwargs)
        end = perf_counter_ns()
        with self.lock:
            if not self.active:
                return out
            try:
                if not had_bytes and id(st) not in self._live:   # its first bytes: made by this op
                    self._discover(st, self.n_ops, start, False)
                self.on_op(entry, args, kwargs, out, start, end)
            except Exception as exc:
                self.fail(exc)
        self.own_extend((t_in, start, end, perf_counter_ns()))
        return out

    def _check_reallocated(self, tensor, op: int, start: int, end: int) -> None:
        """After resize_/set_: if `tensor`'s storage now holds other bytes (same storage object, new
        allocation), the old block is freed at the op's end and a new block made by this op begins."""
        if not isinstance(tensor, Tensor):
            return
        st = tensor.untyped_storage()
        b = self._live.get(id(st))
        if b is None:
            return
        # read the array itself, or a copy of it (slicing is atomic under the GIL), never a numpy view: another
        # thread may append a block now, and an array exporting its buffer refuses to grow (BufferError)
        data = self.buf.blocks.data
        if b * 7 + 7 <= len(data) and data[b * 7] == b:
            addr, size = data[b * 7 + 2], data[b * 7 + 3]
        else:
            blocks = np.frombuffer(data[:len(data) // 7 * 7], dtype=np.int64).reshape(-1, 7)
            row = blocks[blocks[:, 0] == b][0]
            addr, size = int(row[2]), int(row[3])
        if st.nbytes() == size and (size == 0 or st.data_ptr() == addr):
            return
        for ref_id, (_, bid, _) in list(self._refs.items()):
            if bid == b:
                del self._refs[ref_id]
                break
        del self._live[id(st)]
        self._frees_extend((b, end))
        new = self._discover(st, op, start, False)
        if new >= 0:
            self._acc_append((new << 1) | 1)

    def _discover(self, st, op: int, t: int, before: bool) -> int:
        """A storage seen for the first time: give it a block id and watch for its free.

        `before`: first seen as an input (it existed before this op, possibly before recording);
        otherwise it is a fresh output allocated by op `op`. Returns -1 for storages with no bytes.
        """
        size = st.nbytes()
        device = st.device
        if size == 0 or device.type == "meta":
            return -1
        try:                        # before any state changes: it raises for the storage of a
            addr = st.data_ptr()    # wrapper subclass (a jagged nested tensor): no block of its own
        except RuntimeError:
            self.tensors_without_storage += 1
            return -1
        return self._new_block(st, device, addr, size, op, t, before)

    def _new_block(self, st, device, addr: int, size: int, op: int, t: int, before: bool) -> int:
        """Give storage `st` (on `device`, `size` bytes at `addr`) a block id, watch for its free and
        append its block record; returns the id."""
        di = self._device_idx.get(device)
        if di is None:
            di = self._device_idx[device] = len(self.devices)
            self.devices.append(str(device))
        bid = self.n_blocks
        self.n_blocks = bid + 1
        key = id(st)
        self._live[key] = bid
        ref = _weakref(st, self._on_free)      # a plain C weakref: ~4x cheaper than a KeyedRef
        self._refs[id(ref)] = (ref, bid, key)
        self._blocks_extend((bid, di, addr, size, -1 if before else t, op, 1 if before else 0))
        return bid

    def _on_free(self, ref) -> None:
        """Weak-reference callback: the storage died (runs in whichever thread dropped it)."""
        t = perf_counter_ns()
        entry = self._refs.pop(id(ref), None)
        if entry is None:          # recording already stopped and released its references
            return
        _, bid, key = entry
        self._live.pop(key, None)
        self._frees_extend((bid, t))
        self.own_extend((t, perf_counter_ns()))
