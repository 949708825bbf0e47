"""Many runs at once: one trace per rank of a distributed job (or per run of a sweep), compared.

``memlens.load_many("traces/rank*.json.gz")`` returns a `RunSet`. Nothing is loaded until asked for:
`RunSet.peaks` loads and analyses the files in parallel (a thread per file, up to `workers`) and keeps only
the small per-run results, so a set of 64 ranks never holds 64 traces; `RunSet.trace` loads one run on
demand (the last few are cached).

Each run's rank comes, in order of trust, from the file's own metadata (Kineto traces carry
``distributedInfo: {"rank": ..}``; a saved trace keeps it in its manifest), from the file name
(``rank3``, ``rank_3``, ``rank-3``, ``r3``...), else from its position in the sorted file list.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import re
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.errors import InputError

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|r)[_\-]?(\d+)(?![0-9])", re.IGNORECASE)
_HEAD_BYTES = 1 << 20  # Kineto writes distributedInfo near the top of the file
PEAK_COLUMNS = ("run", "rank", "path", "device", "allocated_bytes", "reserved_bytes", "peak_ns", "peak_unix_ns",
                "clock", "top_category", "top_category_bytes", "op_at_peak", "rank_source")


@dataclass(frozen=True)
class Run:
    """One file of a `RunSet`: its ``path``, ``rank`` and where the rank came from (``rank_source``:
    "metadata", "file name" or "file order")."""

    path: str
    rank: int
    rank_source: str

    @property
    def name(self) -> str:
        """A short label: ``rank N``."""
        return f"rank {self.rank}"


def _expand(paths_or_glob) -> list[str]:
    if isinstance(paths_or_glob, (str, os.PathLike)):
        text = os.fspath(paths_or_glob)
        if any(ch in text for ch in "*?["):
            found = sorted(glob.glob(text))
            if not found:
                raise InputError("the pattern matches no file", text)
            return found
        items = [text]
    else:
        items = [os.fspath(p) for p in paths_or_glob]
    if not items:
        raise InputError("load_many needs at least one file")
    for p in items:
        if not os.path.exists(p):
            raise InputError("no such file or directory", p)
    if len(set(items)) != len(items):
        raise InputError("the same file is listed twice")
    return items


def rank_from_metadata(path) -> int | None:
    """The rank a file records about itself (Kineto ``distributedInfo.rank``, or a saved trace's
    metadata), read from the file's head without loading it; None when it records none."""
    path = Path(path)
    try:
        if path.is_dir():
            manifest = json.loads((path / "manifest.json").read_text())
            info = (manifest.get("metadata") or {}).get("distributedInfo") or {}
            return _int_or_none(info.get("rank")) if isinstance(info, dict) else None
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except (OSError, ValueError, EOFError, json.JSONDecodeError):
        return None
    m = re.search(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(-?\d+)', head)
    return int(m.group(1)) if m else None


def _int_or_none(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def rank_from_name(path) -> int | None:
    """The rank in a file name (``trace_rank3.json``, ``rank-03.pickle``, ``r7.memlens``), or None."""
    matches = _RANK_IN_NAME.findall(Path(path).name)
    return int(matches[-1]) if matches else None


def _analyse(path: str, run: Run) -> tuple[dict, list[dict]]:
    """(summary, per-device peak facts) of one file, loaded here and dropped after."""
    from memlens.io import load
    trace = load(path)
    return trace.summary(), peak_rows(trace, path, run)


def peak_rows(trace, path: str, run: Run) -> list[dict]:
    """Per-device peak facts of one run's trace (the rows of `RunSet.peaks`)."""
    from memlens.analysis.peak import peak_breakdown
    t0 = trace.metadata.get("t0_unix_ns")
    clock = trace.metadata.get("clock")
    clock_kind = clock.get("kind", "host") if isinstance(clock, dict) else "host"
    rows = []
    breakdown = peak_breakdown(trace)
    for dev in trace.devices:
        pb = breakdown.get(dev)
        top_cat, top_bytes = "", 0
        if pb is not None and len(pb.by_category):
            first = pb.by_category.iloc[0]
            top_cat, top_bytes = str(first.iloc[0]), int(first["bytes"])
        peak_ns = pb.peak_ns if pb is not None else None
        rows.append({"run": run.name, "rank": run.rank, "path": path, "device": dev,
                     "allocated_bytes": pb.peak_bytes if pb is not None else 0,
                     "reserved_bytes": reserved_peak(trace, dev),
                     "peak_ns": peak_ns,
                     "peak_unix_ns": (int(t0) + peak_ns) if (t0 is not None and peak_ns is not None) else None,
                     "clock": clock_kind, "top_category": top_cat, "top_category_bytes": top_bytes,
                     "op_at_peak": pb.op_at_peak if pb is not None else "", "rank_source": run.rank_source})
    return rows


def reserved_peak(trace, device: str) -> int | None:
    """Peak bytes the allocator reserved on `device`, when the trace records it: Kineto's ``Total Reserved``
    column, or a snapshot's segment_alloc/segment_free (and map/unmap) events from an empty start. None when
    the source does not say (a memlens recording on CPU has no allocator segments)."""
    ev = trace.events
    if ev is None or len(ev) == 0:
        return None
    ev = ev[ev["device"].astype(str) == device]
    if "total_reserved" in ev.columns:
        values = pd.to_numeric(ev["total_reserved"], errors="coerce").dropna()
        return int(values.max()) if len(values) else None
    action = ev["action"].astype(str)
    grow = action.isin(["segment_alloc", "segment_map"]).to_numpy()
    shrink = action.isin(["segment_free", "segment_unmap"]).to_numpy()
    if not grow.any():
        return None
    size = ev["size"].to_numpy(dtype=np.int64)
    delta = np.where(grow, size, np.where(shrink, -size, 0))
    order = np.argsort(ev["seq"].to_numpy(), kind="stable")
    start = 0
    if trace.segments is not None and len(trace.segments):
        # segments present at the end minus the net change = what was reserved before the first event
        seg = trace.segments[trace.segments["device"].astype(str) == device]
        start = max(int(seg["total_size"].sum()) - int(delta.sum()), 0)
    return int(start + max(np.cumsum(delta[order]).max(), 0))


class RunSet:
    """Several traces, one per run (rank), analysed together. Build with `load_many`."""

    def __init__(self, runs: list[Run], workers: int | None = None, cache: int = 2):
        self.runs = sorted(runs, key=lambda r: (r.rank, r.path))
        self.workers = workers or min(len(self.runs), os.cpu_count() or 1)
        self._peaks: pd.DataFrame | None = None
        self._summaries: list[dict] | None = None
        self._cache: OrderedDict[str, object] = OrderedDict()
        self._cache_size = cache

    def __len__(self) -> int:
        return len(self.runs)

    def __repr__(self) -> str:
        return f"<memlens.RunSet {len(self)} runs: {', '.join(r.name for r in self.runs[:8])}" \
               f"{', ...' if len(self) > 8 else ''}>"

    def run(self, which) -> Run:
        """The run with rank `which` (an int), or at path `which` (a str)."""
        is_rank = isinstance(which, (int, np.integer)) and not isinstance(which, bool)
        for r in self.runs:
            if (r.rank == which) if is_rank else (r.path == os.fspath(which)):
                return r
        raise InputError(f"no run {which!r} in this set (ranks {[r.rank for r in self.runs]})")

    def trace(self, which):
        """The Trace of one run (rank or path), loaded on demand; the last `cache` loaded stay cached."""
        from memlens.io import load
        r = self.run(which)
        if r.path in self._cache:
            self._cache.move_to_end(r.path)
            return self._cache[r.path]
        trace = load(r.path)
        trace.metadata.setdefault("rank", r.rank)
        self._cache[r.path] = trace
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return trace

    def peaks(self) -> pd.DataFrame:
        """One row per (run, device): ``run`` ("rank N"), ``rank``, ``path``, ``device``, ``allocated_bytes``
        (peak live bytes), ``reserved_bytes`` (peak reserved by the allocator when the file records it, else
        NA), ``peak_ns`` (when, ns from the run's start, on the clock named in ``clock``), ``peak_unix_ns``
        (absolute, when the file knows its start), ``top_category`` / ``top_category_bytes`` (what
        dominates that peak), ``op_at_peak`` and ``rank_source``. Files are loaded in parallel, once."""
        self._analyse_all()
        return self._peaks.copy()

    def summaries(self) -> list[dict]:
        """`Trace.summary()` of every run, in rank order (computed with `peaks`, in parallel, once)."""
        self._analyse_all()
        return [dict(s) for s in self._summaries]

    def _analyse_all(self) -> None:
        if self._peaks is not None:
            return
        with ThreadPoolExecutor(max_workers=max(self.workers, 1)) as pool:
            results = list(pool.map(lambda r: _analyse(r.path, r), self.runs))
        self._summaries = [s for s, _ in results]
        self._peaks = peaks_frame([row for _, rows in results for row in rows])

    def imbalance_stats(self, device: str | None = None) -> dict:
        """The numbers behind `imbalance`: per device kind, the ranks' peaks (bytes), the max, min, median,
        spread (max - min, bytes and share of the max) and the rank that peaks highest. Ranks compare their
        own devices: each run's largest device peak when `device` is None."""
        return imbalance_stats(self.peaks(), device)

    def imbalance(self, device: str | None = None) -> str:
        """One sentence: how far apart the ranks' peaks are, which rank peaks highest, when and on what."""
        return imbalance_sentence(self.imbalance_stats(device))

    def diff(self, a, b):
        """`memlens.diff` of two runs (ranks or paths): what differs between rank `a` (before) and `b`."""
        from memlens.analysis.diff import diff
        ra, rb = self.run(a), self.run(b)
        return diff(self.trace(ra.rank), self.trace(rb.rank), name_a=ra.name, name_b=rb.name)


def peaks_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows of `peak_rows` (missing columns as NA) as the `RunSet.peaks` frame."""
    df = pd.DataFrame(rows, columns=list(PEAK_COLUMNS))
    for c in ("reserved_bytes", "peak_ns", "peak_unix_ns"):
        df[c] = pd.array([None if pd.isna(v) else int(v) for v in df[c].tolist()], dtype="Int64")
    for c in ("top_category", "op_at_peak", "clock"):
        df[c] = df[c].fillna("")
    df["top_category_bytes"] = df["top_category_bytes"].fillna(0).astype(np.int64)
    return df


def imbalance_stats(p: pd.DataFrame, device: str | None = None) -> dict:
    """The numbers behind `RunSet.imbalance` from a `RunSet.peaks` frame (see `RunSet.imbalance_stats`)."""
    if device is not None:
        p = p[p["device"] == device]
        if len(p) == 0:
            raise InputError(f"no run has device {device!r}")
    per_run = p.sort_values("allocated_bytes", ascending=False).drop_duplicates("rank").sort_values("rank")
    values = per_run["allocated_bytes"].to_numpy(dtype=np.int64)
    hi = int(values.max())
    lo = int(values.min())
    top = per_run.iloc[int(np.argmax(values))]
    low = per_run.iloc[int(np.argmin(values))]
    return {"runs": int(len(per_run)), "max_bytes": hi, "min_bytes": lo,
            "median_bytes": float(np.median(values)), "spread_bytes": hi - lo,
            "spread_fraction": (hi - lo) / hi if hi > 0 else 0.0,
            "max_rank": int(top["rank"]), "max_device": str(top["device"]),
            "min_rank": int(low["rank"]), "top_category": str(top["top_category"]),
            "top_category_bytes": int(top["top_category_bytes"]), "op_at_peak": str(top["op_at_peak"]),
            "peak_ns": None if pd.isna(top["peak_ns"]) else int(top["peak_ns"]), "clock": str(top["clock"])}


def imbalance_sentence(s: dict) -> str:
    """`imbalance_stats` as one sentence."""
    from memlens.units import format_bytes, format_ns
    if s["runs"] == 1:
        return f"one run: rank {s['max_rank']} peaks at {format_bytes(s['max_bytes'])} on {s['max_device']}."
    if s["spread_bytes"] == 0:
        return f"all {s['runs']} ranks peak at the same {format_bytes(s['max_bytes'])}."
    why = ""
    if s["top_category"] not in ("", "unknown") and s["max_bytes"] > 0:
        why = (f"; at that peak {s['top_category']} holds {format_bytes(s['top_category_bytes'])} "
               f"({s['top_category_bytes'] / s['max_bytes']:.0%})")
    if s["op_at_peak"]:
        why += f"{',' if why else '; the peak is'} reached by an allocation of {s['op_at_peak']}"
    when = f" at {format_ns(s['peak_ns'])} ({s['clock']} clock)" if s["peak_ns"] is not None else ""
    above = s["max_bytes"] / s["median_bytes"] - 1 if s["median_bytes"] > 0 else 0.0
    return (f"peaks differ by {format_bytes(s['spread_bytes'])} ({s['spread_fraction']:.1%} of the highest) "
            f"across {s['runs']} ranks: rank {s['max_rank']} peaks highest, {format_bytes(s['max_bytes'])} on "
            f"{s['max_device']}{when}, {above:.1%} above the median; rank {s['min_rank']} lowest at "
            f"{format_bytes(s['min_bytes'])}{why}.")


def load_many(paths_or_glob, *, workers: int | None = None) -> RunSet:
    """A `RunSet` of several trace files: a glob pattern (``"run/rank*.pt.trace.json.gz"``) or a list of
    paths, in any format `memlens.load` reads. Ranks come from each file's metadata (Kineto
    ``distributedInfo``), else its name; when some file has neither, or two claim the same rank, every run
    is numbered by the sorted file order instead. Nothing is loaded yet (see `RunSet`)."""
    paths = sorted(_expand(paths_or_glob))
    meta = [rank_from_metadata(p) for p in paths]
    names = [rank_from_name(p) for p in paths]
    runs = [Run(p, m, "metadata") if m is not None else Run(p, n, "file name") if n is not None else None
            for p, m, n in zip(paths, meta, names)]
    ranks = [r.rank for r in runs if r is not None]
    if None in runs or len(set(ranks)) != len(ranks):
        # some file says nothing, or two say the same rank (e.g. rank 0 of two different jobs): file order
        runs = [Run(p, i, "file order") for i, p in enumerate(paths)]
    return RunSet(runs, workers=workers)
