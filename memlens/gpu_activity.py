"""The measured CUDA clock: which GPU kernels each op launched, from Kineto / torch.profiler activity.

Kineto links the three levels by ids: a CPU op (``cat: cpu_op``) is the innermost op running on its
thread when a runtime call (``cudaLaunchKernel``, ``hipExtModuleLaunchKernel``, ``cudaMemcpyAsync`` ...)
is made; the runtime call and the GPU activity it started (``kernel``, ``gpu_memcpy``, ``gpu_memset``)
share a ``correlation`` id; the runtime call also carries the op's ``External id``. So:

    kernel --correlation--> runtime launch --External id / time containment--> innermost op

`attribute_activity` does this on plain DataFrames, so the same logic serves a Kineto JSON file
(`kineto_frames`) and the recorder's own CUDA path (ops = memlens ops, launches and kernels from
``torch.profiler``'s ``events()``; the ops carry no External id there, so containment decides).
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.errors import InputError

# Runtime calls that start GPU activity (CUDA and HIP spellings)
LAUNCH_NAMES = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel",
    "cudaMemcpyAsync", "cudaMemcpy", "cudaMemsetAsync", "cudaMemset", "cudaMemcpy2DAsync", "cudaGraphLaunch",
    "hipLaunchKernel", "hipExtLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel",
    "hipMemcpyAsync", "hipMemcpyWithStream", "hipMemcpy", "hipMemsetAsync", "hipMemset", "hipGraphLaunch",
})
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# every era's spelling of GPU activity and runtime categories, lower-cased (2021 traces write Kernel,
# Memcpy, Memset, Runtime; the Kineto importer, `memlens.io.kineto.kernels`, reads the same names)
ACTIVITY_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "gpu_memcpy", "memcpy": "gpu_memcpy",
                       "gpu_memset": "gpu_memset", "memset": "gpu_memset"}
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver"})
OP_CATEGORIES = frozenset({"cpu_op", "operator"})

_GEMM_RE = re.compile(r"gemm|cutlass|xmma|Cijk_|cublas|hipblas|wgmma|s16816|matmul", re.I)
_ATTN_RE = re.compile(r"flash|fmha|attn|attention", re.I)
_NORM_RE = re.compile(r"norm|softmax", re.I)


def kernel_class(name: str) -> str:
    """Coarse class of a GPU kernel from its name: gemm, attention, normalization or elementwise
    (everything else: elementwise, reductions, gathers, copies)."""
    if _ATTN_RE.search(name):
        return "attention"
    if _GEMM_RE.search(name):
        return "gemm"
    if _NORM_RE.search(name):
        return "normalization"
    return "elementwise"


def load_kineto(path) -> dict:
    """Read a Kineto Chrome trace (.json or .json.gz); `InputError` when it is not one."""
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            doc = json.load(f)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"cannot read a Kineto trace ({type(exc).__name__}: {exc})", path) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InputError("not a Kineto trace (no traceEvents list)", path)
    return doc


def kineto_frames(doc: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(ops, launches, activity) of a Kineto trace, times in ns on the trace's clock.

    ops: name, start_ns, end_ns, tid, external_id (CPU ops). launches: name, start_ns, tid, correlation,
    external_id (runtime calls that start GPU work). activity: name, category, start_ns, end_ns,
    correlation, stream (kernels, memcpys, memsets). Every era: categories are matched without case
    (``Operator`` / ``Runtime`` / ``Kernel`` / ``Memcpy`` / ``Memset`` in 2021 traces, whose runtime calls
    spell ``external id``).
    """
    ops, launches, acts = [], [], []
    for e in doc.get("traceEvents", []):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = str(e.get("cat") or "").lower()
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        try:   # exact integer ns: epoch-microsecond stamps (2021) times 1000 are past float64's integers
            whole = int(float(e["ts"]))
            ts = whole * 1000 + int(round((float(e["ts"]) - whole) * 1000))
            dur = int(round(float(e.get("dur", 0.0)) * 1000))
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
        ext = _int(args.get("External id", args.get("external id")))
        if cat in OP_CATEGORIES:
            ops.append((str(e.get("name", "")), ts, ts + dur, str(e.get("tid", "")), ext))
        elif cat in RUNTIME_CATEGORIES and e.get("name") in LAUNCH_NAMES:
            launches.append((str(e["name"]), ts, str(e.get("tid", "")), _int(args.get("correlation")), ext))
        elif cat in ACTIVITY_CATEGORIES:
            acts.append((str(e.get("name", "")), ACTIVITY_CATEGORIES[cat], ts, ts + dur,
                         _int(args.get("correlation")), _int(args.get("stream"))))
    ops_df = pd.DataFrame(ops, columns=["name", "start_ns", "end_ns", "tid", "external_id"])
    launch_df = pd.DataFrame(launches, columns=["name", "start_ns", "tid", "correlation", "external_id"])
    act_df = pd.DataFrame(acts, columns=["name", "category", "start_ns", "end_ns", "correlation", "stream"])
    for df, cols in ((ops_df, ("start_ns", "end_ns")), (launch_df, ("start_ns",)), (act_df, ("start_ns", "end_ns"))):
        for c in cols:
            df[c] = df[c].astype(np.int64)
    return ops_df, launch_df, act_df


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def innermost_containing(ops: pd.DataFrame, t: np.ndarray, tid: np.ndarray | None = None) -> np.ndarray:
    """Index (row position in `ops`) of the innermost op whose [start, end] contains each time in `t`
    (same thread when `tid` is given and `ops` has a tid column); -1 when none does.

    Innermost = the latest-starting op that still contains the time (ops on one thread nest)."""
    n = len(t)
    out = np.full(n, -1, dtype=np.int64)
    if len(ops) == 0 or n == 0:
        return out
    groups = [(None, np.arange(n))] if tid is None or "tid" not in ops.columns else \
        [(k, np.flatnonzero(tid == k)) for k in pd.unique(tid)]
    for key, which in groups:
        cand = np.arange(len(ops)) if key is None else np.flatnonzero(ops["tid"].to_numpy() == key)
        if len(cand) == 0:
            continue
        starts = ops["start_ns"].to_numpy()[cand]
        ends = ops["end_ns"].to_numpy()[cand]
        order = np.argsort(starts, kind="stable")
        starts, ends, cand = starts[order], ends[order], cand[order]
        for i in which:   # walk back over earlier-starting ops until one still contains t (few steps: nesting depth)
            j = int(np.searchsorted(starts, t[i], side="right")) - 1
            while j >= 0 and ends[j] < t[i]:
                j -= 1
                if j >= 0 and starts[j] < t[i] - 10_000_000_000:   # no op lasts 10 s around a launch
                    j = -1
            if j >= 0:
                out[i] = cand[j]
    return out


def attribute_activity(ops: pd.DataFrame, launches: pd.DataFrame, activity: pd.DataFrame) -> pd.DataFrame:
    """For each GPU activity row, the op (row position in `ops`, -1 if none) that launched it.

    A kernel's launch is the runtime call with the same correlation id; the op is the one whose
    External id equals the launch's (when both carry one), else the innermost op containing the launch
    time on the launch's thread. Returns `activity` plus columns launch_ns and op (int64).
    """
    out = activity.copy()
    out["launch_ns"] = np.int64(-1)
    out["op"] = np.int64(-1)
    if len(activity) == 0 or len(launches) == 0:
        return out
    by_corr = launches.drop_duplicates("correlation", keep="last").set_index("correlation")
    pos = by_corr.index.get_indexer(activity["correlation"].to_numpy())
    has = (pos >= 0) & (activity["correlation"].to_numpy() >= 0)
    if not has.any():
        return out
    launch_t = by_corr["start_ns"].to_numpy()[pos[has]]
    launch_ext = by_corr["external_id"].to_numpy()[pos[has]]
    launch_tid = by_corr["tid"].to_numpy()[pos[has]] if "tid" in by_corr.columns else None
    owner = np.full(len(launch_t), -1, dtype=np.int64)
    if "external_id" in ops.columns and len(ops):
        hit = rows_by_external_id(ops["external_id"].to_numpy(), launch_ext)
        owner[hit >= 0] = hit[hit >= 0]
    missing = owner < 0
    if missing.any():
        owner[missing] = innermost_containing(ops, launch_t[missing],
                                              None if launch_tid is None else launch_tid[missing])
    out.loc[has, "launch_ns"] = launch_t
    out.loc[has, "op"] = owner
    return out


def kernels_per_op(ops: pd.DataFrame, attributed: pd.DataFrame) -> pd.DataFrame:
    """Per op row position with GPU activity: first start, last end, count and busy ns of its activity.

    Columns: op, kernel_start_ns, kernel_end_ns, kernels, kernel_busy_ns (ns on the trace clock)."""
    a = attributed[attributed["op"] >= 0]
    if len(a) == 0:
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in
                             ("op", "kernel_start_ns", "kernel_end_ns", "kernels", "kernel_busy_ns")})
    g = a.assign(busy=a["end_ns"] - a["start_ns"]).groupby("op").agg(
        kernel_start_ns=("start_ns", "min"), kernel_end_ns=("end_ns", "max"), kernels=("start_ns", "size"),
        kernel_busy_ns=("busy", "sum"))
    return g.reset_index().astype(np.int64)


def kernel_summary(path) -> pd.DataFrame:
    """The GPU kernels of a Kineto trace file with their class and owning CPU op: name, category,
    start_ns, end_ns, dur_ns, kernel_class, op_name (innermost launching op; "" if none)."""
    ops, launches, acts = kineto_frames(load_kineto(path))
    att = attribute_activity(ops, launches, acts)
    att["dur_ns"] = att["end_ns"] - att["start_ns"]
    att["kernel_class"] = [kernel_class(n) if c == "kernel" else "transfer" for n, c in
                           zip(att["name"], att["category"])]
    names = ops["name"].to_numpy(dtype=object)
    att["op_name"] = np.where(att["op"] >= 0, names[np.clip(att["op"].to_numpy(), 0, max(len(names) - 1, 0))]
                              if len(names) else "", "")
    return att


def rows_by_external_id(op_external_id: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Row of the op whose External id is each of `wanted` (-1 when none, or when the id is negative: not
    logged). Where several ops share an id, the last one (the innermost, as the profiler writes them)."""
    op_external_id = np.asarray(op_external_id, dtype=np.int64)
    wanted = np.asarray(wanted, dtype=np.int64)
    out = np.full(len(wanted), -1, dtype=np.int64)
    valid = op_external_id >= 0
    if not valid.any():
        return out
    index = pd.Series(np.flatnonzero(valid), index=op_external_id[valid])
    index = index[~index.index.duplicated(keep="last")]
    hit = index.reindex(wanted).to_numpy(dtype="float64", na_value=np.nan)
    ok = ~np.isnan(hit) & (wanted >= 0)
    out[ok] = hit[ok].astype(np.int64)
    return out
