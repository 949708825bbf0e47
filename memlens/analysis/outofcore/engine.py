"""The out-of-core engine: `memlens info`, `ati` and `outliers` on traces larger than memory, on Dask.

Each analysis reads a saved trace (`TraceFiles`) a row-group batch at a time and answers exactly what the
in-memory analysis answers on the whole trace:

``summary`` (memlens info)
    counts from the manifest, the time span from Parquet statistics, block facts and each device's peak
    live bytes from time buckets of alloc/free events (`outofcore.live`). Memory: one batch per task.
``ati``
    pass 1 regroups accesses and blocks by block (`outofcore.buckets`); pass 2 runs
    `memlens.analysis.ati.access_intervals` on each bucket (so the definition of an interval is the ATI
    module's, whatever it is) and counts lengths on fine log bins; pass 3 takes the exact order statistics
    the quantiles need from the few bins that hold them (`outofcore.quantiles`) and the histogram.
    Memory: one bucket per task (about `rows_per_bucket` accesses and their blocks).
``outliers``
    pass 1 as for ati, plus each device's peak time and Zhang et al.'s WDOA weight integral from the time
    buckets (a memory-mapped file of 16 bytes per alloc/free event); pass 2 runs
    `memlens.analysis.outliers.outliers` on each bucket against the whole trace's peak and weights and
    keeps its top N; the top N of those is the answer (the ranking is a total order: score, size, block id).

Equal to the in-memory engine: counts, minimum, maximum, sums, quantiles, histograms and rankings are
identical; the standard deviation (a sum of squares added in another order) agrees to float rounding.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.analysis.outofcore import quantiles as qmod
from memlens.analysis.outofcore.buckets import (ATI_BLOCK_COLUMNS, OUTLIER_BLOCK_COLUMNS, load_bucket,
                                                split_accesses, split_blocks)
from memlens.analysis.outofcore.files import TraceFiles
from memlens.analysis.outofcore.live import (combine_peak, curve_piece, load_context, peak_context,
                                              split_events, time_edges)
from memlens.analysis.outofcore.runner import Runner
from memlens.analysis.outliers import ATTRIBUTION
from memlens.errors import NeedsAccessesError

DEFAULT_ROWS_PER_BUCKET = 500_000  # accesses per bucket task: ~0.3 GiB of intervals and blocks at the peak
BELOW = {"1us": 1e3, "10us": 1e4, "100us": 1e5, "1ms": 1e6, "10ms": 1e7}  # as ati_stats reports them
STAT_QUANTILES = (0.5, 0.9, 0.99)


def _open(path_or_files) -> TraceFiles:
    return path_or_files if isinstance(path_or_files, TraceFiles) else TraceFiles.open(path_or_files)


# ---- memlens info ---------------------------------------------------------------------------------
def summary(path, runner: Runner) -> dict:
    """`Trace.summary()` of a saved trace, computed a row-group batch at a time."""
    files = _open(path)
    span = files.time_span_ns()
    facts, peaks = _events(files, runner, span, write_curves=False)
    return summary_of(files, span, facts, peaks)


def summary_of(files: TraceFiles, span, facts: dict, peaks: dict) -> dict:
    """`summary`'s document from `_events`' results (for callers that ran `_events` themselves)."""
    return {
        "blocks": files.rows["blocks"], "accesses": files.rows["accesses"], "ops": files.rows["ops"],
        "devices": sorted(facts["devices"]), "duration_ns": int(span[1] - span[0]),
        "peak_live_bytes": {d: int(max(peaks[d]["peak"], 0)) for d in sorted(facts["devices"])},
        "source_kind": files.metadata.get("source_kind", "unknown"),
        "clock": clock_of_files(files),
        "has_accesses": files.rows["accesses"] > 0,
        "allocated_before": facts["allocated_before"], "free_without_alloc": facts["free_without_alloc"],
        "alive_at_end": facts["alive_at_end"], "notes": list(files.metadata.get("notes", [])),
    }


def _events(files: TraceFiles, runner: Runner, span, write_curves: bool, devices=None, limit_bytes=None,
            keep_events: bool = False):
    """Split alloc/free events into time buckets and sum them: (block facts, {device: {"peak", "t_peak",
    "buckets" (time bucket numbers), "parts" (their `live.curve_piece` results), and with `write_curves`
    "context" (`live.peak_context`)}}). `keep_events` keeps each bucket's sorted events on disk (the report's
    live curve reads them)."""
    batches = files.batches("blocks", DEFAULT_ROWS_PER_BUCKET)
    edges = time_edges(files, max(len(batches), 1), span)
    results = runner.map(split_events, [(files, rgs, i, edges, span[0], str(runner.scratch))
                                        for i, rgs in enumerate(batches)])
    facts = {"devices": set(), "allocated_before": 0, "free_without_alloc": 0, "alive_at_end": 0,
             "labels": {"category": {}, "module": {}}}
    pieces = set()
    for r in results:
        facts["devices"].update(r["devices"])
        pieces.update(r["pieces"])
        for col, names in r["labels"].items():
            facts["labels"][col].update(names)
        for k in ("allocated_before", "free_without_alloc", "alive_at_end"):
            facts[k] += r[k]
    wanted = sorted(facts["devices"]) if devices is None else [d for d in devices if d in facts["devices"]]
    jobs = [(d, tb) for d in wanted for tb in sorted(tb for dev, tb in pieces if dev == d)]
    parts = runner.map(curve_piece, [(str(runner.scratch), d, tb, write_curves, keep_events) for d, tb in jobs])
    out = {}
    for d in wanted:
        mine = [(tb, p) for (dev, tb), p in zip(jobs, parts) if dev == d]
        peak, t_peak = combine_peak([p for _, p in mine])
        out[d] = {"peak": peak, "t_peak": t_peak, "buckets": [tb for tb, _ in mine], "parts": [p for _, p in mine]}
        if write_curves and mine:
            out[d]["context"] = peak_context(str(runner.scratch), d, [tb for tb, _ in mine], [p for _, p in mine],
                                             span, limit_bytes, runner)
    return facts, out


# ---- pass 1: regroup by block -----------------------------------------------------------------------
def _regroup(files: TraceFiles, runner: Runner, rows_per_bucket: int, block_columns=ATI_BLOCK_COLUMNS) -> int:
    """Split accesses and (the `block_columns` of) blocks into buckets in the scratch directory; returns
    the bucket count."""
    n_buckets = max(1, math.ceil(files.rows["accesses"] / max(int(rows_per_bucket), 1)))
    scratch = str(runner.scratch)
    acc = files.batches("accesses", rows_per_bucket)
    blk = files.batches("blocks", rows_per_bucket)
    runner.map(split_accesses, [(files, rgs, i, n_buckets, scratch) for i, rgs in enumerate(acc)])
    runner.map(split_blocks, [(files, rgs, i, n_buckets, scratch, block_columns) for i, rgs in enumerate(blk)])
    return n_buckets


def _require_accesses(files: TraceFiles, what: str) -> None:
    if files.rows["accesses"] == 0:
        from types import SimpleNamespace

        from memlens.analysis.ati import require_accesses
        empty = SimpleNamespace(has_accesses=False,
                                metadata={"source_kind": files.metadata.get("source_kind", "unknown")})
        try:
            require_accesses(empty, what)
        except NeedsAccessesError as exc:
            raise NeedsAccessesError(exc.message, files.path) from None


# ---- memlens ati ----------------------------------------------------------------------------------
def _ati_bucket(files, scratch, bucket, span, device):
    """Pass 2 of one bucket: its intervals (by the ATI module), their partial statistics and fine-bin
    counts; the lengths are kept in the scratch directory for pass 3."""
    from memlens.analysis.ati import access_intervals
    from memlens.analysis.ati import ATI_KIND, EDGE_KINDS
    trace = load_bucket(files, scratch, bucket, span, True)
    iv = access_intervals(trace, device=device)
    kind = iv["kind"].to_numpy()
    all_lengths = iv["length_ns"].to_numpy(dtype=np.int64)
    is_ati = kind == ATI_KIND
    lengths = all_lengths[is_ati]  # the headline is the ATI; the lifetime edges are summed beside it
    np.save(Path(scratch) / f"len-{bucket:05d}.npy", lengths)
    kinds = iv["kind"].value_counts()
    n = len(lengths)
    edges = {}
    for k in EDGE_KINDS:
        e = all_lengths[kind == k]
        np.save(Path(scratch) / f"edge-{k}-{bucket:05d}.npy", e)  # for pass 3: exact std and quantiles
        edges[k] = {"count": len(e), "sum": int(e.sum(dtype=np.int64)) if len(e) else 0,
                    "min": int(e.min()) if len(e) else None, "max": int(e.max()) if len(e) else None,
                    "bins": qmod.sparse_counts(e)}
    return {
        "edges": edges,
        "count": n,
        "blocks": len(pd.unique(iv["block_id"].to_numpy()[is_ati])),
        "sum": int(lengths.sum(dtype=np.int64)) if n else 0,
        "min": int(lengths.min()) if n else None, "max": int(lengths.max()) if n else None,
        "zero_count": int((lengths == 0).sum()),
        "truncated": int(iv["truncated"].sum()),
        "below": {k: int(np.count_nonzero(lengths < v)) for k, v in BELOW.items()},
        "by_kind": {str(k): int(v) for k, v in kinds.items()},
        "bins": qmod.sparse_counts(lengths),
        "outside": int(iv.attrs.get("accesses_outside_lifetime", 0)),
        "overlapping": int(iv.attrs.get("overlapping_ops", 0)),  # counted per interval: sums over buckets
    }


def _ati_pass3(scratch, bucket, mean, edges, bins, edge_needs=None):
    """Pass 3 of one bucket: squared deviations from the global mean, the histogram on the final edges,
    and the distinct values inside the bins that hold the quantiles; the same (but the histogram) for each
    lifetime-edge kind in `edge_needs` ({kind: (mean, needed bins)})."""
    f = Path(scratch) / f"len-{bucket:05d}.npy"
    lengths = np.load(f)
    x = lengths.astype(np.float64)
    dev = x - mean
    counts, _ = np.histogram(x, bins=edges)
    out = {"sqdev": float(np.dot(dev, dev)), "hist": counts.astype(np.int64),
           "values": qmod.values_in_bins(lengths, bins), "edges": {}}
    f.unlink()
    for k, (k_mean, k_bins) in (edge_needs or {}).items():
        g = Path(scratch) / f"edge-{k}-{bucket:05d}.npy"
        e = np.load(g)
        d = e.astype(np.float64) - k_mean
        out["edges"][k] = {"sqdev": float(np.dot(d, d)), "values": qmod.values_in_bins(e, k_bins)}
        g.unlink()
    return out


def ati(path, runner: Runner, *, device: str | None = None, rows_per_bucket: int = DEFAULT_ROWS_PER_BUCKET,
        histogram_per_decade: int = 1, regrouped: int | None = None) -> dict:
    """ATI statistics of a saved trace, as `memlens ati --json` prints them for the in-memory engine:
    the keys of `memlens.analysis.ati.ati_stats`, plus ``histogram`` (a frame as
    `distributions.log_histogram(lengths, per_decade=histogram_per_decade)`) and
    ``accesses_outside_lifetime``. Times in ns."""
    from memlens.analysis.distributions import log_bins
    files = _open(path)
    _require_accesses(files, "access time interval (ATI) analysis")
    span = files.time_span_ns()
    # `regrouped`: pass 1 already ran in this scratch directory (its bucket count); the report shares it
    n_buckets = regrouped if regrouped is not None else _regroup(files, runner, rows_per_bucket)
    scratch = str(runner.scratch)
    parts = runner.map(_ati_bucket, [(files, scratch, b, span, device) for b in range(n_buckets)])
    n = sum(p["count"] for p in parts)
    total = sum(p["sum"] for p in parts)
    bins = qmod.add_sparse(p["bins"] for p in parts)
    mins = [p["min"] for p in parts if p["min"] is not None]
    maxs = [p["max"] for p in parts if p["max"] is not None]
    mean = float(total) / n if n else None
    lo_hi = np.array([float(max(maxs))]) if maxs else np.array([], dtype=np.float64)
    edges = log_bins(lo_hi, per_decade=histogram_per_decade)
    needed = qmod.needed_bins(bins, STAT_QUANTILES)
    edge_needs = _edge_needs(parts)
    third = runner.map(_ati_pass3, [(scratch, b, mean if mean is not None else 0.0, edges, needed, edge_needs)
                                    for b in range(n_buckets)])
    q = qmod.exact_quantiles(bins, [t["values"] for t in third], STAT_QUANTILES)
    hist_counts = sum(t["hist"] for t in third)
    hist = pd.DataFrame({"lo": edges[:-1], "hi": edges[1:], "count": np.asarray(hist_counts, dtype=np.int64)})
    hist["fraction"] = hist["count"] / max(n, 1)
    from memlens.analysis.ati import KINDS
    by_kind = {k: sum(p["by_kind"].get(k, 0) for p in parts) for k in KINDS}
    return {
        "count": int(n),
        "blocks": int(sum(p["blocks"] for p in parts)),
        "total_ns": float(total),
        "mean_ns": mean,
        "std_ns": math.sqrt(sum(t["sqdev"] for t in third) / n) if n else None,
        "min_ns": float(min(mins)) if mins else None,
        "max_ns": float(max(maxs)) if maxs else None,
        "p50_ns": q[0.5], "p90_ns": q[0.9], "p99_ns": q[0.99],
        "zero_count": int(sum(p["zero_count"] for p in parts)),
        "truncated": int(sum(p["truncated"] for p in parts)),
        "fraction_below": {k: (sum(p["below"][k] for p in parts) / n if n else None) for k in BELOW},
        "by_kind": by_kind,
        "wrap_around": 0,
        "edges": _edge_stats(parts, third, edge_needs),
        "clock": clock_of_files(files),
        "steady_state": False, "iteration": None, "iteration_default": False, "period_ns": None,
        "histogram": hist,
        "accesses_outside_lifetime": int(sum(p["outside"] for p in parts)),
        "overlapping_ops": int(sum(p["overlapping"] for p in parts)),
    }


def _edge_needs(parts) -> dict:
    """{edge kind: (its mean over all buckets, the fine bins holding its quantiles)} for pass 3."""
    from memlens.analysis.ati import EDGE_KINDS
    needs = {}
    for k in EDGE_KINDS:
        es = [p["edges"][k] for p in parts]
        n = sum(e["count"] for e in es)
        bins = qmod.add_sparse(e["bins"] for e in es)
        mean = sum(e["sum"] for e in es) / n if n else 0.0
        needs[k] = (float(mean), qmod.needed_bins(bins, STAT_QUANTILES))
    return needs


def _edge_stats(parts, third, edge_needs) -> dict:
    """The lifetime edges beside the ATI, from the buckets' sums (count, total, mean, min, max) and pass 3
    (std and exact quantiles, as for the ATI); ns."""
    from memlens.analysis.ati import EDGE_KINDS
    out = {}
    for k in EDGE_KINDS:
        es = [p["edges"][k] for p in parts]
        n = sum(e["count"] for e in es)
        total = sum(e["sum"] for e in es)
        mins = [e["min"] for e in es if e["min"] is not None]
        maxs = [e["max"] for e in es if e["max"] is not None]
        bins = qmod.add_sparse(e["bins"] for e in es)
        q = qmod.exact_quantiles(bins, [t["edges"][k]["values"] for t in third], STAT_QUANTILES) if n else {}
        out[k] = {"count": int(n), "total_ns": float(total), "mean_ns": total / n if n else None,
                  "std_ns": math.sqrt(sum(t["edges"][k]["sqdev"] for t in third) / n) if n else None,
                  "min_ns": float(min(mins)) if mins else None, "max_ns": float(max(maxs)) if maxs else None,
                  "p50_ns": q.get(0.5), "p90_ns": q.get(0.9), "p99_ns": q.get(0.99)}
    return out


def clock_of_files(files) -> dict:
    """The clock named in a saved trace's metadata (host when none)."""
    from memlens.trace import clock_of

    class _Meta:
        metadata = dict(files.metadata or {})
    return clock_of(_Meta())


# ---- memlens outliers -----------------------------------------------------------------------------
def _outliers_bucket(files, scratch, bucket, span, device, bw, top, priority, min_size, limit_bytes, contexts):
    """Pass 2 of one bucket: `outliers()` on its blocks against the whole trace's live curves (its top
    `top`), and the bandwidth filter's partial sums."""
    from memlens.analysis.ati import access_intervals
    from memlens.analysis.outliers import outliers
    from memlens.analysis.swappable import bandwidth_filter
    trace = load_bucket(files, scratch, bucket, span, True)
    iv = bandwidth_filter(access_intervals(trace, device=device), bw)
    ranked = outliers(trace, bw, top=None, priority=priority, device=device, intervals=iv, min_size=min_size,
                      limit_bytes=limit_bytes, peak_context={d: load_context(c) for d, c in contexts.items()})
    n_ranked = len(ranked)  # every block with an idle interval: the report says "of N"
    if top is not None:
        ranked = ranked.head(top)  # the ranking is a total order: the first `top` are those `top=top` keeps
    # attribution is attached once to the final rows (its dtypes depend on which rows are picked)
    ranked = ranked.drop(columns=[c for c in ATTRIBUTION if c in ranked.columns])
    swappable = iv["swappable"].to_numpy()
    part = {"ranked": n_ranked, "intervals": len(iv), "swappable": int(np.count_nonzero(swappable)),
            "idle_bytes_ns": float(np.dot(iv["size"].to_numpy(np.float64), iv["length_ns"].to_numpy(np.float64))),
            "swappable_bytes_ns": float(iv["swappable_bytes_ns"].to_numpy().sum()),
            "blocks_with_swappable": len(pd.unique(iv["block_id"].to_numpy()[swappable]))}
    # the rows go back through the scratch directory: the driver merges them a bucket at a time, so it holds
    # two buckets' top rows, not every bucket's (a report asks for the first 20,000 of each)
    piece = Path(scratch) / f"ranked-{bucket:05d}.pkl"
    ranked.to_pickle(piece)
    return str(piece), part


class _BlocksOf:
    """The blocks-table rows of some block ids, read back from their buckets' pieces (a `Trace` stand-in
    for `outliers._attach_attribution`)."""

    def __init__(self, files, scratch: str, block_ids: np.ndarray, n_buckets: int):
        from memlens.analysis.outofcore.buckets import bucket_of, pieces
        from memlens.trace import conform
        frames = []
        for b in np.unique(bucket_of(block_ids, n_buckets)):
            for piece in pieces(scratch, "blk", int(b)):
                df = pd.read_parquet(piece)
                frames.append(df[df["block_id"].isin(block_ids)])
        self.blocks = conform("blocks", pd.concat(frames, ignore_index=True) if frames else None)


def outliers(path, runner: Runner, bandwidth=None, top: int | None = 20, priority: str = "size_x_idle", *,
             device: str | None = None, min_size: int | None = None, limit_bytes: float | None = None,
             rows_per_bucket: int = DEFAULT_ROWS_PER_BUCKET, regrouped: int | None = None,
             events: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """(`memlens.analysis.outliers.outliers` of a saved trace, `filter_summary` of its bandwidth filter).
    Each device's peak and WDOA weight integral are built a time bucket at a time (`live.peak_context`).
    `regrouped` (a bucket count: pass 1 already ran, with `OUTLIER_BLOCK_COLUMNS`) and `events` (`_events`'
    device results with their contexts, `device` None, `limit_bytes` as given here) let the report share
    the passes it has run."""
    from memlens.analysis.bandwidth import DEFAULT, BandwidthModel
    from memlens.analysis.outliers import PRIORITIES, _attach_attribution, _rank
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
    bw = BandwidthModel.parse(bandwidth) if bandwidth is not None else DEFAULT
    files = _open(path)
    _require_accesses(files, "access time interval (ATI) analysis")
    span = files.time_span_ns()
    peaks = events if events is not None else _events(
        files, runner, span, write_curves=True, devices=None if device is None else [device],
        limit_bytes=limit_bytes)[1]
    contexts = {d: p["context"] for d, p in peaks.items() if "context" in p}
    n_buckets = regrouped if regrouped is not None else _regroup(files, runner, rows_per_bucket,
                                                                 OUTLIER_BLOCK_COLUMNS)
    scratch = str(runner.scratch)
    results = runner.map(_outliers_bucket, [(files, scratch, b, span, device, bw, top, priority, min_size,
                                             limit_bytes, contexts) for b in range(n_buckets)])
    ranked = None
    for piece, _ in results:
        frame = pd.read_pickle(piece)  # written by this run's own task (`_outliers_bucket`)
        Path(piece).unlink()
        if ranked is None or len(ranked) == 0:
            ranked = frame
            continue
        if len(frame) == 0:
            continue
        merged = pd.concat([ranked, frame], ignore_index=True)
        order = _rank(merged["score"].to_numpy(dtype=np.float64), merged["size"].to_numpy(),
                      merged["block_id"].to_numpy(), np.ones(len(merged), dtype=bool), top)
        ranked = merged.iloc[order].reset_index(drop=True)
    if ranked is None:
        ranked = pd.DataFrame()
    ranked = _attach_attribution(ranked, _BlocksOf(files, scratch, ranked["block_id"].to_numpy(np.int64),
                                                   n_buckets))
    ranked.attrs["bandwidth"] = bw.to_dict()
    ranked.attrs["priority"] = priority
    parts = [r[1] for r in results]
    n = sum(p["intervals"] for p in parts)
    sw = sum(p["swappable"] for p in parts)
    idle = sum(p["idle_bytes_ns"] for p in parts)
    saved = sum(p["swappable_bytes_ns"] for p in parts)
    summary_ = {"intervals": int(n), "swappable": int(sw), "filtered_out_fraction": 1 - sw / n if n else None,
                "idle_bytes_ns": idle, "swappable_bytes_ns": saved,
                "swappable_share": saved / idle if idle > 0 else None,
                "blocks_with_swappable": int(sum(p["blocks_with_swappable"] for p in parts)),
                "bandwidth": bw.to_dict(), "clock": clock_of_files(files), "steady_state": False,
                "iteration": None}
    ranked.attrs["clock"] = summary_["clock"]
    ranked.attrs["blocks_ranked"] = int(sum(p["ranked"] for p in parts))  # before the cut to `top`
    return ranked, summary_
