"""The GPU work of a Kineto / Chrome trace, per op: which kernels, memcpys and memsets each op launched.

Kineto links three levels by ids, in every era memlens reads:

- GPU activity: complete events of category ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` (2021 traces:
  ``Kernel`` / ``Memcpy`` / ``Memset``), each with ``args.correlation``;
- the runtime call that started it (``cuda_runtime`` / ``cuda_driver``; 2021: ``Runtime``; ROCm traces use the
  same categories with HIP names), with the same ``correlation`` and the launching op's ``External id``
  (2021: ``external id``);
- the op (``cpu_op``; 2021: ``Operator``) with that ``External id``, else the innermost op on the runtime
  call's thread whose span contains the call.

An activity whose runtime call is not in the trace was launched before profiling began (the profiler saw the
kernel run, not its launch): it belongs to no op and is counted in ``metadata["gpu_activity"]``, as are
activities launched outside every op. Per op, the activity of the op and of every op nested in it is summed
into it (`per_op_kernels`): ``kernel_busy_ns`` of a top-level op is the device time of all it launched.
"""
from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from memlens.gpu_activity import ACTIVITY_CATEGORIES, RUNTIME_CATEGORIES, rows_by_external_id
from memlens.io.kineto.attrib import innermost_enclosing
from memlens.io.kineto.transfer import DIRECTIONS, direction_code, transfer_device_columns
KERNEL_COLUMNS = ("kernel_start_ns", "kernel_end_ns", "kernels", "kernel_busy_ns")


def _arg_int(args: dict, *keys) -> int:
    for key in keys:
        value = args.get(key)
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                return -1
    return -1


class GpuEvents:
    """The runtime calls and GPU activity of a trace, collected one event at a time into flat arrays (8 bytes
    a field: a streamed read of a trace of millions of kernels keeps no dict per kernel); `frames` gives the
    tables. Categories are matched without case (2021 traces capitalise them)."""

    _CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

    def __init__(self):
        self.threads: dict = {}
        self.names: dict = {}     # runtime call name -> code (a few distinct names: cudaLaunchKernel ...)
        self.launch = {k: array(t) for k, t in (("ts", "d"), ("end", "d"), ("thread", "q"), ("corr", "q"),
                                                ("ext", "q"), ("name", "q"))}
        self.act = {k: array(t) for k, t in (("cat", "b"), ("ts", "d"), ("end", "d"), ("corr", "q"),
                                               ("stream", "q"), ("ext", "q"), ("dir", "b"))}
        self.kernel_names: set = set()      # distinct kernel names (a few hundred), for what they tell

    def add(self, e) -> bool:
        """Collect `e` when it is a runtime call or a GPU activity; whether it was one."""
        if type(e) is not dict or e.get("ph") != "X":
            return False
        cat = str(e.get("cat") or "").lower()
        runtime = cat in RUNTIME_CATEGORIES
        if not runtime and cat not in ACTIVITY_CATEGORIES:
            return False
        args = e.get("args") if type(e.get("args")) is dict else {}
        try:
            ts = float(e["ts"])
            dur = float(e.get("dur") or 0.0)
        except (KeyError, TypeError, ValueError):
            return True
        ext = _arg_int(args, "External id", "external id")
        if runtime:
            thread = self.threads.setdefault(f"{e.get('pid')}/{e.get('tid')}", len(self.threads))
            name = self.names.setdefault(str(e.get("name", "")), len(self.names))
            for key, value in (("ts", ts), ("end", ts + dur), ("thread", thread),
                               ("corr", _arg_int(args, "correlation")), ("ext", ext), ("name", name)):
                self.launch[key].append(value)
        else:
            code = self._CATEGORIES.index(ACTIVITY_CATEGORIES[cat])
            if code == 0:
                self.kernel_names.add(str(e.get("name", "")))
            direction = direction_code(e.get("name"), args) if code == 1 else 0
            for key, value in (("cat", code), ("ts", ts), ("end", ts + dur), ("corr", _arg_int(args, "correlation")),
                               ("stream", _arg_int(args, "stream")), ("ext", ext), ("dir", direction)):
                self.act[key].append(value)
        return True

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(launches, activity), times in the trace's microseconds.

        launches: start_us, end_us, thread ("pid/tid"), correlation, external_id (-1 when absent), name (the
        runtime call's: cudaLaunchKernel, cudaGraphLaunch, hipGraphLaunch ...).
        activity: category (kernel / gpu_memcpy / gpu_memset), start_us, end_us, correlation, stream,
        external_id, direction (a memcpy's "h2d" / "d2h", else "")."""
        names = np.array(list(self.threads), dtype=object)
        codes = np.array(self.launch["thread"], dtype=np.int64)
        calls = np.array(list(self.names), dtype=object)
        def flat(values, dtype):
            return np.frombuffer(values, dtype=dtype) if len(values) else np.zeros(0, dtype)
        launches = pd.DataFrame({"start_us": flat(self.launch["ts"], np.float64),
                                 "end_us": flat(self.launch["end"], np.float64),
                                 "thread": names[codes] if len(codes) else np.empty(0, object),
                                 "correlation": flat(self.launch["corr"], np.int64),
                                 "external_id": flat(self.launch["ext"], np.int64),
                                 "name": calls[flat(self.launch["name"], np.int64)] if len(codes)
                                 else np.empty(0, object)})
        cats = np.array(self._CATEGORIES, dtype=object)
        acts = pd.DataFrame({"category": cats[flat(self.act["cat"], np.int8)],
                             "start_us": flat(self.act["ts"], np.float64), "end_us": flat(self.act["end"], np.float64),
                             "correlation": flat(self.act["corr"], np.int64), "stream": flat(self.act["stream"], np.int64),
                             "external_id": flat(self.act["ext"], np.int64),
                             "direction": np.asarray(DIRECTIONS, dtype=object)[flat(self.act["dir"], np.int8)]})
        return launches, acts


def collect_gpu_events(events: list) -> GpuEvents:
    """The runtime calls and GPU activity of a trace's events, collected."""
    collected = GpuEvents()
    for e in events:
        collected.add(e)
    return collected


def gpu_events(events: list) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(launches, activity) of a trace's events (`GpuEvents.frames`)."""
    return collect_gpu_events(events).frames()


def attribute(acts: pd.DataFrame, launches: pd.DataFrame, op_external_id: np.ndarray, op_thread: np.ndarray,
              op_start: np.ndarray, op_end: np.ndarray, thread_code, to_ns) -> tuple[np.ndarray, np.ndarray]:
    """(op index per activity row, -1 for none; whether its launch is in the trace).

    `op_thread` are integer thread codes, `thread_code` maps a "pid/tid" string to the same codes (-1 when no
    op ran on it), `to_ns` maps trace microseconds to the ops' ns."""
    n = len(acts)
    op = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return op, np.zeros(0, dtype=bool)
    corr = acts["correlation"].to_numpy(np.int64)
    by_corr = launches[launches["correlation"] >= 0].drop_duplicates("correlation", keep="last")
    pos = pd.Index(by_corr["correlation"].to_numpy(np.int64)).get_indexer(corr)
    launched = (pos >= 0) & (corr >= 0)
    safe = pos.clip(0)
    ext = np.where(launched, by_corr["external_id"].to_numpy(np.int64)[safe] if len(by_corr) else -1,
                   acts["external_id"].to_numpy(np.int64))
    hit = rows_by_external_id(op_external_id, ext)
    op[hit >= 0] = hit[hit >= 0]
    missing = np.flatnonzero((op < 0) & launched)
    if len(missing) and len(op_start):
        rows = safe[missing]
        q_thread = np.asarray([thread_code(t) for t in by_corr["thread"].to_numpy()[rows]], dtype=np.int64)
        q_time = to_ns(by_corr["start_us"].to_numpy()[rows])
        op[missing] = innermost_enclosing(op_thread, op_start, op_end, q_thread, q_time)
    return op, launched


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Length (ns) of the union of the intervals [start, end)."""
    if len(start) == 0:
        return 0
    order = np.argsort(start, kind="stable")
    s, e = np.asarray(start, np.int64)[order], np.asarray(end, np.int64)[order]
    run_end = np.maximum.accumulate(e)
    # an interval opens a new run when it starts after every earlier one has ended
    new = np.r_[True, s[1:] > run_end[:-1]]
    run_id = np.cumsum(new) - 1
    starts = s[new]
    ends = np.full(len(starts), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(ends, run_id, e)
    return int((ends - starts).sum())


def per_op_kernels(n_ops: int, parent: np.ndarray, depth: np.ndarray, act_op: np.ndarray,
                   start_ns: np.ndarray, end_ns: np.ndarray) -> dict:
    """Per op: first start, last end (Int64, NA without activity), count and summed ns of the activity it
    and the ops nested in it launched. `parent` (-1 for top level) and `depth` describe the nesting."""
    lo = np.full(n_ops, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(n_ops, np.iinfo(np.int64).min, dtype=np.int64)
    count = np.zeros(n_ops, dtype=np.int64)
    busy = np.zeros(n_ops, dtype=np.int64)
    mine = act_op >= 0
    o = act_op[mine]
    np.minimum.at(lo, o, start_ns[mine])
    np.maximum.at(hi, o, end_ns[mine])
    np.add.at(count, o, 1)
    np.add.at(busy, o, (end_ns - start_ns)[mine])
    for d in range(int(depth.max()) if len(depth) else 0, 0, -1):   # deepest first: children into parents
        kids = np.flatnonzero((depth == d) & (parent >= 0))
        p = parent[kids]
        np.minimum.at(lo, p, lo[kids])
        np.maximum.at(hi, p, hi[kids])
        np.add.at(count, p, count[kids])
        np.add.at(busy, p, busy[kids])
    has = count > 0
    return {"kernel_start_ns": pd.arrays.IntegerArray(np.where(has, lo, 0), ~has),
            "kernel_end_ns": pd.arrays.IntegerArray(np.where(has, hi, 0), ~has),
            "kernels": count, "kernel_busy_ns": busy}


def launch_frames(events) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(launches, activity) of a trace's events: a list, or the `GpuEvents` a streamed read collected."""
    return events.frames() if isinstance(events, GpuEvents) else gpu_events(events)


def launches_outside_ops(launches: pd.DataFrame, acts: pd.DataFrame, op_external_id: np.ndarray,
                         op_thread: list, op_start_us: np.ndarray, op_end_us: np.ndarray) -> pd.DataFrame:
    """The rows of `launches` that started GPU activity (a kernel, copy or memset with their correlation)
    and that no op made: their External id is no op's, and no op on their thread spans them (a CUDA/HIP
    graph replayed from Python, a custom extension's launch). `attribute` would give their activity to
    no op; the importer makes each of them an op of its own. Times are trace microseconds."""
    corr = acts["correlation"].to_numpy(np.int64)
    active = launches[launches["correlation"] >= 0].drop_duplicates("correlation", keep="last")
    active = active[active["correlation"].isin(corr[corr >= 0])]
    if len(active) == 0:
        return active
    by_id = rows_by_external_id(op_external_id, active["external_id"].to_numpy(np.int64))
    codes, _ = pd.factorize(pd.Series(list(op_thread) + list(active["thread"]), dtype=object))
    t0 = min(active["start_us"].min(), np.min(op_start_us) if len(op_start_us) else np.inf)

    def ns(us):
        return np.rint((np.asarray(us, dtype=np.float64) - t0) * 1000).astype(np.int64)
    n = len(op_thread)
    inside = innermost_enclosing(codes[:n], ns(op_start_us), ns(op_end_us), codes[n:], ns(active["start_us"]))
    return active[(by_id < 0) & (inside < 0)]


def kernel_columns(frames, op_external_id: np.ndarray, op_thread: np.ndarray, op_start: np.ndarray,
                   op_end: np.ndarray, parent: np.ndarray, depth: np.ndarray, thread_codes: dict,
                   t0_us: float, carries=None, launch_ops_from: int | None = None) -> tuple[dict, dict]:
    """(ops-table columns `KERNEL_COLUMNS` (plus ``transfer`` and ``device`` when `carries`, which ops carry
    the cost facts, is given: `memlens.io.kineto.transfer`), the ``metadata["gpu_activity"]`` counts) of a
    trace's (launches, activity) `frames` (`launch_frames`).

    Op times are ns from `t0_us` (trace microseconds); `thread_codes` maps "pid/tid" to the ops' thread
    codes; ops from row `launch_ops_from` on are runtime calls made outside every op (`launches_outside_ops`).
    The counts: activities (kernels, memcpys, memsets), attributed to an op, launched before profiling began
    (no runtime call in the trace: no op), launched outside every op (attributed to their launch call's own
    op), busy ns (the union of the activity intervals: all of them, and the attributed ones) and the summed
    ns of the attributed ones (what the top-level ops' ``kernel_busy_ns`` add up to)."""
    launches, acts = frames

    def to_ns(us):
        return np.rint((np.asarray(us, dtype=np.float64) - t0_us) * 1000).astype(np.int64)
    op, launched = attribute(acts, launches, op_external_id, op_thread, op_start, op_end,
                             lambda t: thread_codes.get(t, -1), to_ns)
    start, end = to_ns(acts["start_us"]), to_ns(acts["end_us"])
    columns = per_op_kernels(len(op_start), parent, depth, op, start, end)
    if carries is not None:
        direction = pd.Index(DIRECTIONS).get_indexer(acts["direction"].to_numpy(object)).astype(np.int64)
        columns.update(transfer_device_columns(op, direction, end - start, carries, parent, depth,
                                               columns["kernels"]))
    mine = op >= 0
    outside = mine & (op >= (len(op_start) if launch_ops_from is None else launch_ops_from))
    counts = {"activities": int(len(acts)), "kernels": int((acts["category"] == "kernel").sum()),
              "attributed": int(mine.sum()), "launched_before_profiling": int((~launched & ~mine).sum()),
              "launched_outside_ops": int((launched & ~mine).sum() + outside.sum()),
              "busy_ns": union_ns(start, end), "attributed_busy_ns": union_ns(start[mine], end[mine]),
              "attributed_sum_ns": int((end - start)[mine].sum())}
    return columns, counts
