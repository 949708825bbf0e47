"""Import Kineto / Chrome traces (``torch.profiler`` ``export_chrome_trace``) with ``[memory]`` events.

What the trace holds and how it maps to a Trace:

- ``[memory]`` instants: ``Bytes`` (negative = free), ``Device Type`` / ``Device Id`` (c10 DeviceType: 0 CPU,
  1 CUDA, 6 HIP, which PyTorch on ROCm calls ``cuda``), and since 2022 ``Addr``, ``Total Allocated``,
  ``Total Reserved`` and ``Ev Idx``. They are ordered by (ts, Ev Idx).
- With ``Addr``, allocs and frees pair by (device, address) into blocks, exactly. Without it (2021 traces)
  they pair by size, LIFO (`memlens.io.size_pairing`): the live-bytes curve is exact, block identities are
  guesses; the blocks' ``pairing`` column and a note say so.
- ``Total Allocated`` at the first event minus that event's bytes is what was live before profiling began;
  the part not freed during the trace becomes one flagged block per device (``synthetic`` True,
  ``allocated_before`` True, no address), so the live curve equals the profiler's own totals.
- ``ops``: the trace's ``cpu_op`` (2021: ``Operator``) events. Each memory event is attributed to the
  innermost op enclosing it on the same pid/tid (`memlens.io.kineto.attrib`); ``module`` is the innermost
  ``nn.Module:`` python_function around the op (traces recorded with ``with_modules``); ``iteration`` the
  ``ProfilerStep#N`` range containing the op's start.
- ``events``: the memory instants in order (action ``alloc`` / ``free``) with ``total_allocated`` and
  ``total_reserved`` (the reserved curve the blocks alone cannot give).

Times: ``ts`` is in microseconds (int, or float with ns digits); memlens uses ns from the first memory
event or op. ``baseTimeNanoseconds`` (newer traces) is recorded in metadata with the raw first ``ts``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.errors import InputError
from memlens.trace.schema import empty_table, make_clock
from memlens.io.detect import require_kineto
from memlens.io.jsonfile import load_json
from memlens.io.kineto.attrib import innermost_enclosing, nesting
from memlens.io.kineto.comms import comms_columns
from memlens.io.kineto.facts import facts_columns
from memlens.io.kineto.kernels import collect_gpu_events, kernel_columns, launch_frames, launches_outside_ops
from memlens.io.kineto.ops import OpTable, read_ops
from memlens.io.kineto.settings import header_torch_settings, kernel_tf32_evidence, merge_kernel_evidence
from memlens.io.size_pairing import pair_by_size_lifo
from memlens.io.snapshot.pairing import ALLOC, FREE_COMPLETED, Pairing, pair_blocks

SOURCE = "kineto"
_EPOCH_US_2001 = 978_307_200 * 10**6  # ts values past this are epoch microseconds, not a monotonic clock
# c10::DeviceType -> memlens device prefix (ROCm builds report HIP = 6 for what torch calls "cuda")
DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "cuda", 9: "xla", 12: "xpu", 13: "mps", 15: "hpu", 19: "mtia",
                20: "privateuseone"}


def import_kineto(path):
    """Read a Kineto/Chrome trace JSON (plain or gzip) and return a `memlens.Trace`."""
    require_kineto(path)
    return kineto_to_trace(load_json(path, "Kineto/Chrome trace"), source=str(path), path=path)


def _device_names(dev_type: np.ndarray, dev_id: np.ndarray) -> tuple[np.ndarray, list[str]]:
    pairs = pd.MultiIndex.from_arrays([dev_type, dev_id])
    codes, uniques = pd.factorize(pairs)
    names = []
    for t, i in uniques:
        prefix = DEVICE_TYPES.get(int(t), f"devicetype{int(t)}")
        names.append(prefix if prefix == "cpu" else f"{prefix}:{max(int(i), 0)}")
    return codes.astype(np.int64), names


def _memory_columns(events: list, where) -> pd.DataFrame:
    mem = [e for e in events if type(e) is dict and e.get("name") == "[memory]"]
    if not mem:
        return pd.DataFrame()
    try:
        args = [e["args"] for e in mem]
        df = pd.DataFrame({
            "ts": np.array([e["ts"] for e in mem], dtype=np.float64),
            "thread": [f"{e.get('pid')}/{e.get('tid')}" for e in mem],
            "bytes": np.array([a["Bytes"] for a in args], dtype=np.int64),
            "dev_type": np.array([a.get("Device Type", 1) for a in args], dtype=np.int64),
            "dev_id": np.array([a.get("Device Id", 0) for a in args], dtype=np.int64),
        })
        ts = df["ts"].to_numpy()
        if not np.isfinite(ts).all() or (np.abs(ts) >= 2.0**52).any():
            raise InputError("a [memory] event's 'ts' is not a finite time in microseconds", where)
        for key, col in (("Addr", "addr"), ("Total Allocated", "total_allocated"),
                         ("Total Reserved", "total_reserved"), ("Ev Idx", "ev_idx")):
            values = [a.get(key) for a in args]
            if all(v is not None for v in values):
                df[col] = np.array(values, dtype=np.int64)
    except InputError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"malformed [memory] event ({type(exc).__name__}: {str(exc)[:120]})", where) from None
    df["file_order"] = np.arange(len(df))
    keys = ["ts"] + (["ev_idx"] if "ev_idx" in df else []) + ["file_order"]
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def kineto_to_trace(obj, source: str = "<in-memory trace>", path=None, gpu_events=None):
    """Convert a parsed Chrome trace (dict with ``traceEvents`` or a bare event list) to a `memlens.Trace`.
    `gpu_events`: the runtime calls and GPU activity already collected (a streamed read,
    `memlens.io.kineto.kernels.GpuEvents`); else they are read from the events."""
    from memlens.trace import Trace

    where = path if path is not None else source
    if isinstance(obj, dict):
        events = obj.get("traceEvents")
        if not isinstance(events, list):
            raise InputError("JSON object has no 'traceEvents' list; not a Kineto/Chrome trace", where)
    elif isinstance(obj, list):
        events, obj = obj, {}
    else:
        raise InputError(f"JSON holds a {type(obj).__name__}, not a Kineto/Chrome trace", where)
    mem = _memory_columns(events, where)
    collected = collect_gpu_events(events) if gpu_events is None else gpu_events
    frames = launch_frames(collected)
    ops = read_ops(events, where)
    n_recorded_ops = len(ops)
    # a runtime call that started GPU work outside every op (a graph replayed from Python) is an op itself
    outside = launches_outside_ops(*frames, ops.external_id, ops.thread, ops.start_us, ops.end_us)
    ops = ops.with_rows(outside["name"].tolist(), outside["thread"].tolist(), outside["start_us"].to_numpy(),
                        outside["end_us"].to_numpy())
    if len(mem) == 0 and len(ops) == 0:
        raise InputError("trace has no ops, no [memory] events and no GPU work launched in it; there is nothing "
                         "for memlens to show", where)
    t0_us = float(min(mem["ts"].min() if len(mem) else np.inf, ops.start_us.min() if len(ops) else np.inf))
    thread_codes, thread_names = pd.factorize(pd.concat([pd.Series(ops.thread, dtype=object),
                                                         pd.Series(mem["thread"] if len(mem) else [], dtype=object)],
                                                        ignore_index=True))
    op_thread = thread_codes[:len(ops)]
    op_start = np.rint((ops.start_us - t0_us) * 1000).astype(np.int64)
    op_end = np.rint((ops.end_us - t0_us) * 1000).astype(np.int64)
    if len(mem):
        blocks, events, mem_meta = _memory_tables(mem, ops, t0_us, op_thread, op_start, op_end,
                                                  thread_codes[len(ops):])
    else:
        blocks, events, mem_meta = empty_table("blocks"), None, None
    ops_table = ops.table(op_start, op_end, op_thread)
    parent, depth = nesting(op_thread, op_start, op_end)
    facts, fact_counts, carries = facts_columns(ops.names, ops.args, parent, depth, op_thread, op_start, op_end)
    kernels, gpu_counts = kernel_columns(frames, ops.external_id, op_thread, op_start, op_end, parent, depth,
                                         {t: i for i, t in enumerate(thread_names)}, t0_us, carries,
                                         launch_ops_from=n_recorded_ops)
    world = (obj.get("distributedInfo") or {}).get("world_size") if isinstance(obj.get("distributedInfo"), dict) \
        else None
    ops_table = ops_table.assign(parent_op_id=pd.arrays.IntegerArray(parent.clip(0), parent < 0), depth=depth,
                                 **facts, **kernels, **comms_columns(ops.names, ops.args, world))
    metadata = _metadata(obj, mem_meta, source, t0_us, len(ops_table), tf32_from_kernels(collected))
    metadata.update(op_facts=fact_counts, gpu_activity=gpu_counts)
    metadata["notes"] += _gpu_notes(fact_counts, gpu_counts)
    return Trace.from_tables(blocks, ops=ops_table, metadata=metadata, events=events)


def _memory_tables(mem: pd.DataFrame, ops: OpTable, t0_us: float, op_thread, op_start, op_end, mem_thread):
    """(blocks, events, what `_metadata` says of them) from the
    trace's ``[memory]`` events (`_memory_columns`, at least one)."""
    t_ns = np.rint((mem["ts"].to_numpy() - t0_us) * 1000).astype(np.int64)
    dev_code, devices = _device_names(mem["dev_type"].to_numpy(), mem["dev_id"].to_numpy())
    nbytes = mem["bytes"].to_numpy()
    zero = nbytes == 0
    seq = np.arange(len(mem), dtype=np.int64)
    has_addr = "addr" in mem
    if has_addr:
        kind = np.where(nbytes > 0, ALLOC, FREE_COMPLETED)
        kind[zero] = -1
        pairing = pair_blocks(dev_code, kind, mem["addr"].to_numpy(), seq)
    else:
        keep = np.flatnonzero(~zero)
        sub = pair_by_size_lifo(dev_code[keep], np.abs(nbytes[keep]), nbytes[keep] > 0)
        pairing = _lift(sub, keep, len(mem))
    op_of_event = innermost_enclosing(op_thread, op_start, op_end, mem_thread, t_ns)
    blocks = _blocks(pairing, t_ns, seq, dev_code, nbytes, mem, op_of_event, ops, has_addr)
    blocks, before = _pre_profiling_blocks(blocks, mem, dev_code, devices)
    blocks["device"] = np.asarray(devices, dtype=object)[blocks.pop("device_code").to_numpy(np.int64)]
    events = pd.DataFrame({
        "seq": seq, "t_ns": t_ns, "device": np.asarray(devices, dtype=object)[dev_code],
        "action": np.where(nbytes >= 0, "alloc", "free").astype(object),
        "addr": mem["addr"].astype("Int64") if has_addr else pd.array([pd.NA] * len(mem), dtype="Int64"),
        "size": np.abs(nbytes), "stream": 0,
        "block_id": pd.arrays.IntegerArray(pairing.block_of_row.clip(0), pairing.block_of_row < 0),
        "op_id": pd.arrays.IntegerArray(op_of_event.clip(0), op_of_event < 0),
    })
    for col in ("total_allocated", "total_reserved"):
        if col in mem:
            events[col] = mem[col].to_numpy()
    said = {"mem": mem, "devices": devices, "has_addr": has_addr, "zero_events": int(zero.sum()),
            "before": before, "attributed": int((op_of_event >= 0).sum()),
            "freed_unseen": int(blocks["free_without_alloc"].sum())}
    return blocks, events, said


def _lift(sub: Pairing, keep: np.ndarray, n: int) -> Pairing:
    """A pairing computed on rows `keep` re-expressed on all n rows."""
    def up(rows):
        return np.where(rows >= 0, keep[rows.clip(0)], -1) if len(rows) else rows
    block_of_row = np.full(n, -1, dtype=np.int64)
    block_of_row[keep] = sub.block_of_row
    return Pairing(up(sub.first_row), up(sub.alloc_row), up(sub.requested_row), up(sub.completed_row),
                   block_of_row)


def _nullable(values: np.ndarray, rows: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(values[rows.clip(0)].astype(np.int64) if len(rows) else
                                  np.empty(0, np.int64), rows < 0)


def _blocks(pairing: Pairing, t_ns, seq, dev_code, nbytes, mem, op_of_event, ops: OpTable, has_addr) -> pd.DataFrame:
    has_alloc = pairing.alloc_row >= 0
    alloc_op = np.where(has_alloc, op_of_event[pairing.alloc_row.clip(0)], -1) if len(pairing) \
        else np.empty(0, np.int64)
    free_op = np.where(pairing.completed_row >= 0, op_of_event[pairing.completed_row.clip(0)], -1) \
        if len(pairing) else np.empty(0, np.int64)
    names = np.asarray(ops.names, dtype=object)
    modules = np.asarray(ops.modules, dtype=object)
    first = pairing.first_row
    return pd.DataFrame({
        "block_id": np.arange(len(pairing), dtype=np.int64),
        "device_code": dev_code[first],
        "addr": pd.array(mem["addr"].to_numpy()[first], dtype="Int64") if has_addr
        else pd.array([pd.NA] * len(first), dtype="Int64"),
        "size": np.abs(nbytes[first]),
        "alloc_ns": _nullable(t_ns, pairing.alloc_row),
        "alloc_seq": pd.array(np.where(has_alloc, seq[pairing.alloc_row.clip(0)], -1) if len(first) else [],
                              dtype="Int64"),
        "free_ns": _nullable(t_ns, pairing.completed_row), "free_seq": _nullable(seq, pairing.completed_row),
        "op": np.where(alloc_op >= 0, names[alloc_op.clip(0)] if len(names) else "", ""),
        "module": np.where(alloc_op >= 0, modules[alloc_op.clip(0)] if len(modules) else "", ""),
        "alloc_op_id": pd.arrays.IntegerArray(alloc_op.clip(0), alloc_op < 0),
        "free_op_id": pd.arrays.IntegerArray(free_op.clip(0), free_op < 0),
        "allocated_before": ~has_alloc, "free_without_alloc": ~has_alloc,
        "pairing": "address" if has_addr else "size_lifo", "synthetic": False, "source": SOURCE,
    })


def _pre_profiling_blocks(blocks: pd.DataFrame, mem: pd.DataFrame, dev_code: np.ndarray, devices: list[str]):
    """Add, per device, one flagged block for the bytes live before profiling and never freed in it."""
    if "total_allocated" not in mem:
        return blocks, {}
    total = mem["total_allocated"].to_numpy()
    nbytes = mem["bytes"].to_numpy()
    rows, before = [], {}
    for code, name in enumerate(devices):
        idx = np.flatnonzero(dev_code == code)
        live_at_start = int(total[idx[0]] - nbytes[idx[0]])
        freed_unseen = int(blocks.loc[(blocks["device_code"] == code) & blocks["free_without_alloc"], "size"].sum())
        residual = live_at_start - freed_unseen
        before[name] = (live_at_start, residual)
        if residual > 0:
            rows.append({"block_id": len(blocks) + len(rows), "device_code": code, "size": residual,
                         "alloc_seq": -1, "allocated_before": True, "free_without_alloc": False,
                         "synthetic": True, "pairing": "", "op": "(live before profiling)", "module": "",
                         "source": SOURCE})
    if rows:
        added = pd.DataFrame(rows)
        for col in ("alloc_seq",):
            added[col] = added[col].astype("Int64")
        blocks = pd.concat([blocks, added], ignore_index=True)
    return blocks, before


def _us_to_ns(us: float) -> int:
    """Microseconds (float, possibly with ns digits) as exact integer ns (no float rounding of the total)."""
    whole = int(us)
    return whole * 1000 + int(round((us - whole) * 1000))


NO_MEMORY_NOTE = ("This profile has no [memory] events (recorded without torch.profiler.profile(profile_memory="
                  "True)): its ops, GPU kernels, device times and cost facts are here, but no allocation, so the "
                  "memory analyses (live bytes, peak, blocks, planning, simulation) have nothing to show.")


def tf32_from_kernels(collected) -> dict:
    """{"matmul": bool, "conv": bool} as far as the trace's kernel names tell (`kernel_tf32_evidence`): a
    switch is on when one of its fp32 kernels ran on Tensor Cores, off when only CUDA-core ones did."""
    seen: dict = {}
    for name in getattr(collected, "kernel_names", ()):
        said = kernel_tf32_evidence(name)
        if said is not None:
            seen[said[0]] = seen.get(said[0], False) or said[1]
    return seen


def _has_tf32(device_properties) -> bool:
    """Every profiled device is an NVIDIA part with TF32 Tensor Cores (compute capability 8.0 or later)."""
    if not isinstance(device_properties, list) or not device_properties:
        return False
    return all(isinstance(d, dict) and isinstance(d.get("computeMajor"), int) and d["computeMajor"] >= 8
               and "AMD" not in str(d.get("name", "")) for d in device_properties)


def _metadata(obj: dict, said: dict | None, source, t0_us, n_ops, kernel_tf32: dict | None = None) -> dict:
    """The trace's metadata; `said`: what `_memory_tables` found (None without [memory] events);
    `kernel_tf32`: what the kernel names say of the TF32 switches (`tf32_from_kernels`)."""
    mem = said["mem"] if said else None
    meta = {"source_kind": "kineto", "source_path": source, "clock": make_clock("host", source_units="ts_us"),
            "format_era": "no [memory] events" if said is None else "2022+: [memory] events with Addr and totals"
            if said["has_addr"] else "2021: [memory] events without Addr", "t0_trace_ts_us": t0_us,
            "memory_events": 0 if said is None else int(len(mem)),
            "device_types": [] if said is None else sorted({int(t) for t in mem["dev_type"].unique()})}
    if "baseTimeNanoseconds" in obj:  # newer traces: ts counts from this epoch time
        meta["base_time_ns"] = int(obj["baseTimeNanoseconds"])
        meta["t0_unix_ns"] = int(obj["baseTimeNanoseconds"]) + _us_to_ns(t0_us)
    elif t0_us > _EPOCH_US_2001:  # older traces write epoch microseconds directly
        meta["t0_unix_ns"] = _us_to_ns(t0_us)
    for key in ("deviceProperties", "distributedInfo", "traceName"):
        if key in obj:
            meta[key] = obj[key]
    evidence = dict(kernel_tf32 or {})
    if not _has_tf32(obj.get("deviceProperties")):     # CUDA-core kernels there say nothing of the switches
        evidence = {k: v for k, v in evidence.items() if v}
    settings = merge_kernel_evidence(header_torch_settings(obj), evidence)
    if settings:    # TF32 switches / torch version a wrapper wrote into the header (read by the modeled clock)
        meta["torch_settings"] = settings
    meta["notes"] = [NO_MEMORY_NOTE] if said is None else _memory_notes(said, meta["device_types"], n_ops)
    return meta


def _memory_notes(said: dict, device_types: list, n_ops: int) -> list[str]:
    """What the [memory] events could not tell, in sentences."""
    mem = said["mem"]
    notes = ["A profiler trace records allocations and frees, not which op reads or writes each block: the "
             "trace has no accesses, so access-based analyses (idle intervals, swapping) cannot run."]
    if not said["has_addr"]:
        notes.append("This 2021-format trace has no block addresses: allocs and frees were paired by size "
                     "(a free ends the most recent live block of the same size on its device). The live-bytes "
                     "curve is exact; which block each free ended, and so per-block lifetimes, are guesses.")
    if "total_allocated" not in mem:
        notes.append("The trace has no 'Total Allocated': bytes allocated before profiling and never freed "
                     "during it are unknown and not in the live curve.")
    if 6 in device_types:
        notes.append("GPU memory is reported as HIP (ROCm, Device Type 6); memlens names it cuda:N as "
                     "PyTorch on ROCm does.")
    if said["freed_unseen"]:
        notes.append(f"{said['freed_unseen']} blocks were freed without their alloc in the trace (allocated before "
                     "profiling began): their alloc time and op are unknown.")
    for dev, (live_at_start, residual) in said["before"].items():
        if residual > 0:
            notes.append(f"{residual:,} bytes on {dev} were live before profiling began and never freed during "
                         "it; they are one synthetic block (synthetic=True) with no address or op.")
        elif residual < 0:
            notes.append(f"On {dev} the frees of blocks allocated before profiling exceed the profiler's "
                         "'Total Allocated' at the start; the totals and the events disagree.")
    if said["zero_events"]:
        notes.append(f"{said['zero_events']} zero-byte [memory] events were ignored (neither alloc nor free).")
    if n_ops == 0:
        notes.append("The trace has no cpu_op events: blocks cannot be attributed to ops.")
    elif said["attributed"] < len(mem):
        notes.append(f"{len(mem) - said['attributed']} of {len(mem)} memory events lie outside every op on their "
                     "thread and have no op.")
    return notes


def _gpu_notes(facts: dict, gpu: dict) -> list[str]:
    """What the op facts and the GPU activity could not tell, in sentences."""
    notes = []
    if facts["ops_with_shapes"] == 0:
        notes.append("The trace has no op shapes (record with torch.profiler.profile(record_shapes=True)): ops "
                     "carry no cost facts, so it cannot be retimed.")
    elif facts["facts_results_unknown"]:
        notes.append(f"{facts['facts_results_unknown']} ops carrying cost facts have results memlens could not "
                     "derive from the logged arguments (scalars the trace did not log, or no meta kernel): their "
                     "bytes written count only the arguments they write, and flops that need the result are 0.")
    if gpu["launched_before_profiling"]:
        notes.append(f"{gpu['launched_before_profiling']} GPU kernels/copies ran without their launch in the "
                     "trace (launched before profiling began): they belong to no op.")
    if gpu["launched_outside_ops"]:
        notes.append(f"{gpu['launched_outside_ops']} GPU kernels/copies were launched outside every op (a CUDA/HIP "
                     "graph replayed from Python, a launch from an extension): each launching runtime call "
                     "(cudaGraphLaunch, cudaLaunchKernel ...) is an op of its own, holding what it started.")
    return notes
