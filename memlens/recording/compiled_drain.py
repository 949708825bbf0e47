"""Draining the compiled recorder: its fixed-size C++ records (ops, accesses, blocks, frees, allocator events,
stacks) decoded with numpy into the same int64 streams the Python `Session` fills, so that one trace
builder (`memlens.recording.assemble`) serves both backends. Mixed into `CompiledSession`."""
from __future__ import annotations

import numpy as np

from memlens.recording.columns import Columns
from memlens.recording.stacks import StackTable

OP_DTYPE = np.dtype([("dstart", "<i4"), ("dur", "<u4"), ("aseq", "<i4"), ("sig_nacc", "<u4")])
WIDE_DTYPE = np.dtype([("op", "<i8"), ("kind", "<i8"), ("value", "<i8")])
CTX_DTYPE = np.dtype([("op", "<i8"), ("ctx", "<i8")])
BLOCK_DTYPE = np.dtype([("ptr", "<i8"), ("size_dev", "<i8"), ("op_before", "<u4"), ("alloc_dt", "<u4")])
_U32_MAX = (1 << 32) - 1
_NO_START = np.iinfo(np.int64).min    # an op with no escaped (absolute) start
FREE_DTYPE = np.dtype([("t", "<i8"), ("block", "<i4")])
MEM_DTYPE = np.dtype([("t", "<i8"), ("ptr", "<i8"), ("delta_dev", "<i8")])
_NATIVE_SEQ_CAP = 1 << 30       # recorder.cpp caps backward node numbers here (int32 records)
_SEQ_CAP = 1 << 62              # the Python recorder's cap (session._SEQ_CAP)


class CompiledDrain:
    """The drain half of `memlens.recording.compiled.CompiledSession` (its `stop()` calls `_drain` and
    `_drain_stacks` with what the C++ recording hands over)."""

    def _drain(self, d: dict) -> None:
        ops = np.frombuffer(d["ops"], dtype=OP_DTYPE)
        acc = np.frombuffer(d["accesses"], dtype="<i4").astype(np.int64)
        blocks = np.frombuffer(d["blocks"], dtype=BLOCK_DTYPE)
        frees = np.frombuffer(d["frees"], dtype=FREE_DTYPE)
        mem = np.frombuffer(d["memory"], dtype=MEM_DTYPE)
        self.op_names = list(d["op_names"])
        self.signatures = list(d["sigs"])
        self.devices = list(d["devices"])
        self.tensors_without_storage += int(d["tensors_without_storage"])
        self.recorder_bytes = self._drained_peak = int(d["peak_bytes"])
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
        raw = self._decode_ops(ops, np.frombuffer(d["wide"], dtype=WIDE_DTYPE),
                               np.frombuffer(d["ctx"], dtype=CTX_DTYPE), int(d["first_start"]))
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
        self.buf.ops.replace(table)
        self.buf.accesses.replace(acc.reshape(-1, 1))
        nb = len(blocks)
        size = blocks["size_dev"] & ((1 << 48) - 1)
        dev = blocks["size_dev"] >> 48
        before = (blocks["op_before"] >> 31).astype(np.int64)
        op = (blocks["op_before"] & 0x7FFFFFFF).astype(np.int64)
        safe = np.minimum(np.maximum(op, 0), max(n - 1, 0))   # (np.clip: ~3x the call cost)
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
        self.buf.blocks.replace(btable)
        # Each thread's clock leaves out the recorder's own time in that thread, so clocks of threads
        # feeding one recording drift apart by the difference; a free found in another thread than the
        # block's (a storage that died where no memory hook runs, found by a later op's sweep) can then
        # read earlier than the block's making: it is put at the making (it happened after, unseen).
        free_t = frees["t"].astype(np.int64)
        if len(frees):
            made_at = np.maximum(btable[:, 4], np.where(claimed, self._block_cols["alloc_t"], -1))
            free_t = np.maximum(free_t, made_at[frees["block"]])
        ftable = np.stack([frees["block"], free_t], axis=1) if len(frees) else np.empty((0, 2), np.int64)
        self.buf.frees.replace(ftable)
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
        self.buf.op_stacks.replace(per_op.reshape(-1, 1))
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
        if len(wide) == 0:       # nothing escaped the 16-byte records (the usual short recording)
            start = first_start + np.cumsum(d)
        else:
            for kind, target in ((1, dur), (2, nacc), (3, sig)):
                w = wide[wide["kind"] == kind]
                target[w["op"]] = w["value"]
            absolute = np.full(n, _NO_START, dtype=np.int64)
            w = wide[wide["kind"] == 0]
            absolute[w["op"]] = w["value"]
            escaped = absolute != _NO_START
            cs = np.cumsum(d)
            # start[j] = absolute start of the last escaped op i <= j, plus the deltas after it (cs[j] - cs[i]);
            # first_start + cs[j] before any escaped op
            last = np.maximum.accumulate(np.where(escaped, np.arange(n), -1))
            offset = np.where(last >= 0, (absolute - cs)[np.maximum(last, 0)], first_start)
            start = offset + cs
        ctx = np.zeros(n, dtype=np.int64)
        if len(ctxs) and n:
            # a change recorded when `op` ops existed applies from op `op` on (the last one wins)
            at = np.searchsorted(ctxs["op"], np.arange(n), side="right") - 1
            ctx = np.where(at >= 0, ctxs["ctx"][np.maximum(at, 0)], 0)
        return start, start + dur, sig, nacc, ctx

    def _memory_events(self, mem, blocks, frees) -> Columns:
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
        order = np.argsort(t_all, kind="stable")
        dev_all = np.concatenate(dev).astype(np.int64)[order]
        return Columns(len(t_all), {"t_ns": t_all[order],
                                    "device": devices[np.where(dev_all < len(self.devices), dev_all, len(self.devices))],
                                    "addr": np.concatenate(ptr).astype(np.int64)[order],
                                    "delta": np.concatenate(delta).astype(np.int64)[order]})
