"""What `memlens report --engine dask` shows, computed out of core: the report's whole-trace numbers.

`report_data` runs, each in its own scratch subdirectory (the passes reuse piece names):

``summary`` / ``ati`` / ``outliers``
    the engine's analyses (`engine.summary`, `engine.ati`, `engine.outliers`), exact.
live curves
    each device's alloc/free events in time buckets (`live`), reduced for the screen a bucket at a time
    (`curves`): the same points and category / module bands as `memlens.viz.live.live_series`.
one pass over the blocks table (`blocks_pass`, a batch per task)
    the blocks live at each device's peak (the breakdown by category / module / op and the allocation
    sites need them: their number is bounded by what fits on the device at one instant, not by the trace's
    length), the largest blocks, block counts and bytes by category, the bytes allocated in all, and the
    allocation times nearest the peak (the window's edges).
the window
    the trace between two times around the highest peak (`window_tables`), read with Parquet filters:
    the analyses that need every block at once (allocator replay, static planning, swap planning, the
    block timeline, iterations) run on it, as the in-memory report runs its what-ifs on a window of big
    traces. When the trace is small enough the window is the whole trace.

Memory: one batch or bucket per task; the driver holds the live blocks at the peaks, ~4 points per pixel
column per curve, the top rows of each table, and the window.
"""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from memlens.analysis.outofcore import curves as cmod
from memlens.analysis.outofcore.files import TraceFiles
from memlens.analysis.outofcore.live import LABEL_COLUMNS, peak_event
from memlens.analysis.outofcore.runner import Runner

WINDOW_BLOCKS = 10_000       # the in-memory report's what-if window on traces with accesses (sections_whatif)
WINDOW_BLOCKS_WITHOUT_ACCESSES = 50_000  # and without (no swap planning, the slowest what-if)
WINDOW_ACCESSES = 1_000_000  # ~0.2 GB in memory with their intervals (`choose.BYTES_PER_ACCESS`)
SCATTER_ROWS = 20_000        # the outlier scatter's points (`report.sections_access.SCATTER_POINTS`)
BLOCKS_PASS_ROWS = 1 << 20   # blocks rows per `blocks_pass` task (read inside it `BLOCK_BATCH_ROWS` at a time)
_INT64_MAX = np.iinfo(np.int64).max


@contextlib.contextmanager
def _sub_scratch(runner: Runner, name: str):
    """Run the analyses inside in ``scratch/name`` (removed after): the passes of different analyses write
    pieces with the same names."""
    parent = runner.scratch
    sub = Path(parent) / name
    sub.mkdir()
    runner.scratch = sub
    try:
        yield sub
    finally:
        runner.scratch = parent
        shutil.rmtree(sub, ignore_errors=True)


# ---- live curves ------------------------------------------------------------------------------------
def live_curve(runner: Runner, device: str, buckets: list[int], parts: list[dict], labels: dict, *,
               x: str = "time", max_points: int = 4000, top_groups: int = 8) -> dict:
    """The reduced live curve of `device` as `viz.live.live_series` computes it for ``by`` category and
    module at once: {"x", "total", "bands": {column: {label: values}}, "peak_x", "peak_bytes", "events"}.
    `buckets` / `parts` are the device's time buckets and their `live.curve_piece` results, `labels` the
    {column: {code: label}} of the events."""
    scratch = str(runner.scratch)
    n = [p["n"] for p in parts]
    bases = np.concatenate([[0], np.cumsum(n)])[:-1].astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum([p["total"] for p in parts])])[:-1].astype(np.int64)
    pe = peak_event(parts)
    if pe is None:
        return {"x": np.zeros(0), "total": np.zeros(0, np.int64), "bands": {}, "peak_x": 0.0, "peak_bytes": 0,
                "events": 0}
    stats = runner.map(cmod.bucket_stats, [(scratch, device, tb, pe["index"] if i == pe["bucket"] else None)
                                           for i, tb in enumerate(buckets)])
    # the blocks alive before recording enter at the first instant; only the last of them is drawn
    with_before = [i for i, s in enumerate(stats) if s["last_before"] is not None]
    keep_before = {with_before[-1]: stats[with_before[-1]]["last_before"][0]} if with_before else {}
    total_before = sum(s["before"] for s in stats)
    n_total = int(sum(n))
    n_visible = n_total - total_before + (1 if total_before else 0)
    # the first drawn event: the first after the before-recording ones, or the last of those
    candidates = [int(bases[i] + s["first_visible"][0]) for i, s in enumerate(stats) if s["first_visible"]][:1]
    candidates += [int(bases[i] + idx) for i, idx in keep_before.items()]
    first_pos = min(candidates)

    def x_at(pos: int, t: int) -> float:
        return float(t) if x == "time" else float(pos)

    first_bucket = int(np.searchsorted(bases, first_pos, side="right") - 1)
    first_t = _time_at(stats[first_bucket], first_pos - int(bases[first_bucket]))
    last_i = max(i for i, s in enumerate(stats) if s["n"])
    lo = x_at(first_pos, first_t)
    hi = x_at(n_total - 1, stats[last_i]["t_last"])
    columns = max(max_points // 4, 1)
    if n_visible <= 4 * columns:
        kept = _all_visible(runner, device, buckets, bases, keep_before)
    else:
        width = (hi - lo) / columns if hi > lo else 1.0
        pieces = runner.map(cmod.bucket_columns, [(scratch, device, tb, int(bases[i]), int(offsets[i]),
                                                   keep_before.get(i, -1), x, lo, width, columns)
                                                  for i, tb in enumerate(buckets)])
        kept = cmod.merge_columns(pieces)
    bands, names = _choose_bands(stats, bases, labels, top_groups)
    which = np.searchsorted(bases, kept, side="right") - 1
    jobs = []
    for i, tb in enumerate(buckets):
        mine = kept[which == i]
        if len(mine):
            entering = {col: {code: int(sum(s["labels"][col].get(code, (0, 0))[0] for s in stats[:i]))
                              for code in codes} for col, codes in bands.items()}
            jobs.append((i, (scratch, device, tb, int(bases[i]), int(offsets[i]), mine, x, entering)))
    values = runner.map(cmod.bucket_values, [a for _, a in jobs])
    xs = np.concatenate([v["x"] for v in values]) if values else np.zeros(0)
    total = np.concatenate([v["total"] for v in values]) if values else np.zeros(0, np.int64)
    out_bands = {}
    for col, codes in bands.items():
        groups = {}
        covered = np.zeros(len(total), dtype=np.int64)
        for code in codes:
            band = np.concatenate([v["bands"][col][code] for v in values]).astype(np.int64)
            groups[names[col][code]] = band
            covered += band
        if len(codes) < len(names[col]):
            groups["other"] = total - covered
        out_bands[col] = groups
    peak_pos = int(bases[pe["bucket"]] + pe["index"])
    return {"x": xs, "total": total, "bands": out_bands, "peak_x": x_at(peak_pos, pe["t_ns"]),
            "peak_bytes": int(pe["peak"]), "events": n_total}


def _time_at(stat: dict, index: int) -> int:
    """The time of the event at `index` of a bucket: its first visible or its last before-recording one."""
    for key in ("first_visible", "last_before"):
        if stat[key] is not None and stat[key][0] == index:
            return stat[key][1]
    raise AssertionError("the first drawn event is the first visible or the last before-recording one")


def _all_visible(runner, device, buckets, bases, keep_before) -> np.ndarray:
    """Every drawn event's position (a curve short enough to draw whole)."""
    from memlens.analysis.outofcore.live import sorted_events
    out = []
    for i, tb in enumerate(buckets):
        seq = sorted_events(str(runner.scratch), device, tb)["seq"]
        out.append(bases[i] + np.flatnonzero(~cmod._hidden(seq, keep_before.get(i, -1))))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _choose_bands(stats, bases, labels, top_groups) -> tuple[dict, dict]:
    """({column: [codes drawn as their own band, in stacking order]}, {column: {code: label}} of every
    label present), as `live_series` picks them: by bytes live at the peak (largest first; ties in order of
    first appearance), all of them when at most `top_groups` + 1."""
    bands, names = {}, {}
    at_peak_stats = next(s["at_peak"] for s in stats if s["at_peak"] is not None)
    peak_bucket = next(i for i, s in enumerate(stats) if s["at_peak"] is not None)
    for col in LABEL_COLUMNS:
        first, at_peak = {}, {}
        for i, s in enumerate(stats):
            for code, (total, f) in s["labels"][col].items():
                first.setdefault(code, int(bases[i] + f))
                if i < peak_bucket:
                    at_peak[code] = at_peak.get(code, 0) + total
        for code, (total, _) in at_peak_stats[col].items():
            at_peak[code] = at_peak.get(code, 0) + total
        order = sorted(first, key=first.get)  # `pd.factorize` order: first appearance
        weights = np.array([float(at_peak.get(c, 0)) for c in order])
        ranked = [order[k] for k in np.argsort(-weights, kind="stable")]
        bands[col] = ranked[:top_groups] if len(order) > top_groups + 1 else ranked
        names[col] = {c: labels[col][c] for c in order}
    return bands, names


# ---- one pass over the blocks --------------------------------------------------------------------------
def blocks_pass(files: TraceFiles, row_groups: list[int], span: tuple[int, int], peaks: dict, top: int,
                window_at: int | None, half: int) -> dict:
    """Task: one batch of blocks. `peaks` is {device: (t_ns, seq) of its peak event}; `window_at` the
    time around which the window is cut (the highest peak) and `half` the allocations kept on each side."""
    from memlens.analysis.outofcore.buckets import BLOCK_BATCH_ROWS
    lo, hi = span
    out = {"live": {d: [] for d in peaks}, "largest": [], "categories": {}, "bytes": 0, "module_named": False,
           "before": np.zeros(0, np.int64), "after": np.zeros(0, np.int64), "n_le": 0, "n_alloc": 0,
           "min_alloc": None, "max_alloc": None, "ops": {}}
    for b in files.iter_batches("blocks", row_groups, BLOCK_BATCH_ROWS):
        out["bytes"] += int(b["size"].sum())
        out["module_named"] |= bool((b["module"].astype(str) != "").any())
        counts = b["category"].value_counts(sort=False)
        sizes = b.groupby("category", sort=False)["size"].sum()
        for cat, c in counts.items():  # first-appearance order, as `value_counts` keeps it before sorting
            prev = out["categories"].get(cat, (0, 0))
            out["categories"][cat] = (prev[0] + int(c), prev[1] + int(sizes[cat]))
        big = b.sort_values(["size", "block_id"], ascending=[False, True], kind="stable").head(top)
        out["largest"].append(big)
        lt = b.assign(start_ns=b["alloc_ns"].fillna(lo).astype("int64"), end_ns=b["free_ns"].fillna(hi).astype("int64"),
                      start_seq=b["alloc_seq"].fillna(-1).astype("int64"),
                      end_seq=b["free_seq"].fillna(_INT64_MAX).astype("int64"))
        for dev, (t, seq) in peaks.items():
            mine = lt[lt["device"] == dev]
            s_ns, s_seq = mine["start_ns"].to_numpy(), mine["start_seq"].to_numpy()
            e_ns, e_seq = mine["end_ns"].to_numpy(), mine["end_seq"].to_numpy()
            started = (s_ns < t) | ((s_ns == t) & (s_seq <= seq))
            ended = mine["free_ns"].notna().to_numpy() & ((e_ns < t) | ((e_ns == t) & (e_seq <= seq)))
            out["live"][dev].append(mine[started & ~ended])
        if window_at is not None:
            alloc = b["alloc_ns"].dropna().to_numpy(np.int64)
            le, gt = alloc[alloc <= window_at], alloc[alloc > window_at]
            out["n_le"] += len(le)
            out["n_alloc"] += len(alloc)
            out["before"] = np.sort(np.concatenate([out["before"], le]))[-half:] if half else out["before"][:0]
            out["after"] = np.sort(np.concatenate([out["after"], gt]))[: half + 1]
            if len(alloc):
                out["min_alloc"] = min(int(alloc.min()), out["min_alloc"] if out["min_alloc"] is not None else _INT64_MAX)
                out["max_alloc"] = max(int(alloc.max()), out["max_alloc"] if out["max_alloc"] is not None else -_INT64_MAX)
    out["live"] = {d: (pd.concat(v) if v else None) for d, v in out["live"].items()}
    out["largest"] = pd.concat(out["largest"]).sort_values(["size", "block_id"], ascending=[False, True],
                                                           kind="stable").head(top) if out["largest"] else None
    return out


def _window_bounds(parts: list[dict], t_peak: int, half: int) -> tuple[int, int]:
    """[t0, t1] ns: `report.window`'s allocation-count window (`half` allocations on each side of the peak,
    all devices' allocations counted), from the batches' nearest allocation times."""
    k = sum(p["n_le"] for p in parts)
    n = sum(p["n_alloc"] for p in parts)
    if n == 0:
        return t_peak, t_peak
    before = np.sort(np.concatenate([p["before"] for p in parts]))[-half:] if half else np.zeros(0, np.int64)
    after = np.sort(np.concatenate([p["after"] for p in parts]))[: half + 1]
    lo = int(before[0]) if k - half >= 0 and len(before) else min(p["min_alloc"] for p in parts if p["min_alloc"] is not None)
    hi = int(after[half]) if k + half <= n - 1 else max(p["max_alloc"] for p in parts if p["max_alloc"] is not None)
    return min(lo, t_peak), max(hi, t_peak)


# ---- the window -----------------------------------------------------------------------------------------
def _read_filtered(files: TraceFiles, table: str, expr) -> pd.DataFrame:
    """Rows of `table` matching the pyarrow expression `expr`, conformed (row groups whose statistics rule
    them out are not read)."""
    import pyarrow.dataset as ds

    from memlens.trace import conform
    if table not in files.files:
        return None
    tbl = ds.dataset(files.files[table], format="parquet").to_table(filter=expr)
    return conform(table, tbl.to_pandas())


def window_tables(files: TraceFiles, t0: int, t1: int, span: tuple[int, int], stack_ids=()) -> dict:
    """The tables of the trace between `t0` and `t1` (ns, original times): the blocks alive at any time in
    it (blocks alive before recording or never freed are alive from the start / to the end), their accesses
    in it, the ops starting in it, the allocator events in it, the recorded segments (the allocator's state
    at the end) and the stack rows of the kept blocks and of `stack_ids`."""
    import pyarrow.dataset as ds
    f = ds.field
    blocks = _read_filtered(files, "blocks", ((f("alloc_ns") <= t1) | f("alloc_ns").is_null())
                            & ((f("free_ns") >= t0) | f("free_ns").is_null()))
    ids = blocks["block_id"].to_numpy(np.int64)
    acc = _read_filtered(files, "accesses", (f("t_ns") >= t0) & (f("t_ns") <= t1) & f("block_id").isin(ids))
    ops = _read_filtered(files, "ops", (f("start_ns") >= t0) & (f("start_ns") <= t1))
    out = {"blocks": blocks, "accesses": acc, "ops": ops}
    if "events" in files.files:
        out["events"] = _read_filtered(files, "events", (f("t_ns") >= t0) & (f("t_ns") <= t1))
    for name in ("segments", "segment_blocks"):
        if name in files.files:
            out[name] = files.read(name)
    if "stacks" in files.files:
        wanted = np.unique(np.concatenate([blocks["stack_id"].dropna().to_numpy(np.int64),
                                           np.asarray(list(stack_ids), dtype=np.int64)]))
        out["stacks"] = _read_filtered(files, "stacks", f("stack_id").isin(wanted))
    return out


def _accesses_between(files: TraceFiles, t0: int, t1: int) -> int:
    """Accesses with t_ns in [t0, t1], counted from the time column a row group at a time."""
    import pyarrow.dataset as ds
    f = ds.field
    return int(ds.dataset(files.files["accesses"], format="parquet").count_rows(filter=(f("t_ns") >= t0)
                                                                               & (f("t_ns") <= t1)))


def _narrow_to_accesses(files: TraceFiles, t0: int, t1: int, t_peak: int, limit: int) -> tuple[int, int]:
    """[t0, t1] narrowed around `t_peak` to about `limit` accesses (half on each side), from the accesses'
    time column read a row group at a time (only the `limit` times nearest the peak are kept)."""
    import pyarrow.parquet as pq
    half = max(limit // 2, 1)
    before, after = np.zeros(0, np.int64), np.zeros(0, np.int64)
    pf = pq.ParquetFile(files.files["accesses"])
    for g in range(pf.metadata.num_row_groups):
        t = pf.read_row_group(g, columns=["t_ns"]).column(0).to_numpy().astype(np.int64)
        t = t[(t >= t0) & (t <= t1)]
        before = np.sort(np.concatenate([before, t[t <= t_peak]]))[-half:]
        after = np.sort(np.concatenate([after, t[t > t_peak]]))[:half]
    lo = int(before[0]) if len(before) else t_peak
    hi = int(after[-1]) if len(after) else t_peak
    return max(lo, t0), min(hi, t1)


# ---- everything the report needs ------------------------------------------------------------------------
def report_data(path, runner: Runner, *, bandwidth=None, top: int = 20, x: str = "time", max_points: int = 4000,
                top_groups: int = 8, window_blocks: int | None = None, window_accesses: int | None = None,
                scatter_rows: int = SCATTER_ROWS, rows_per_bucket: int | None = None) -> dict:
    """The report's numbers for the saved trace at `path` (see the module docstring). Keys: ``files``,
    ``summary``, ``span``, ``curves`` ({device: `live_curve`}), ``peaks`` ({device: {"event", "live",
    "op"}}), ``largest``, ``categories``, ``bytes_allocated``, ``module_named``, ``ati`` / ``ati_error``,
    ``outliers`` / ``outlier_summary``, ``window`` ({"tables", "t0", "t1", "whole", "blocks", "how"})."""
    from memlens.analysis.outofcore import engine
    from memlens.errors import NeedsAccessesError
    files = engine._open(path)
    span = files.time_span_ns()
    if window_blocks is None:
        window_blocks = WINDOW_BLOCKS if files.rows["accesses"] else WINDOW_BLOCKS_WITHOUT_ACCESSES
    window_accesses = WINDOW_ACCESSES if window_accesses is None else window_accesses
    out = {"files": files, "span": span}
    # one pass over the alloc/free events: the summary's peaks, the live curves, the outliers' peak contexts
    facts, events = engine._events(files, runner, span, write_curves=True, keep_events=True)
    out["summary"] = engine.summary_of(files, span, facts, events)
    out["curves"], peaks = {}, {}
    for dev, ev in events.items():
        out["curves"][dev] = live_curve(runner, dev, ev["buckets"], ev["parts"], facts["labels"], x=x,
                                        max_points=max_points, top_groups=top_groups)
        pe = peak_event(ev["parts"])
        if pe is not None:
            peaks[dev] = pe
    peak_bytes = out["summary"]["peak_live_bytes"]
    window_device = max(peak_bytes, key=peak_bytes.get) if peak_bytes else None
    whole = files.rows["blocks"] <= window_blocks and files.rows["accesses"] <= window_accesses
    half = max(window_blocks // 4, 1)
    window_at = None if whole or window_device not in peaks else peaks[window_device]["t_ns"]
    parts = runner.map(blocks_pass, [(files, rgs, span, {d: (p["t_ns"], p["seq"]) for d, p in peaks.items()}, top,
                                      window_at, half) for rgs in files.batches("blocks", BLOCKS_PASS_ROWS)])
    out["bytes_allocated"] = sum(p["bytes"] for p in parts)
    out["module_named"] = any(p["module_named"] for p in parts)
    cats: dict = {}
    for p in parts:
        for cat, (c, s) in p["categories"].items():
            prev = cats.get(cat, (0, 0))
            cats[cat] = (prev[0] + c, prev[1] + s)
    out["categories"] = cats
    largest = [p["largest"] for p in parts if p["largest"] is not None]
    out["largest"] = pd.concat(largest) if largest else None
    out["peaks"] = {}
    for dev, pe in peaks.items():
        live = [p["live"][dev] for p in parts if p["live"][dev] is not None]
        live = pd.concat(live) if live else None
        op = ""
        if pe["delta"] > 0 and live is not None:
            match = live.loc[live["block_id"] == pe["block_id"], "op"]  # the block that reached the peak is live
            op = str(match.iloc[0]) if len(match) else ""
        out["peaks"][dev] = {"event": pe, "live": live, "op": op}
    # the window
    if whole:
        t0, t1, how = span[0], span[1], "the whole trace"
    elif window_at is None:
        t0, t1, how = span[0], span[0], "nothing (the trace has no allocation events)"
    else:
        t0, t1 = _window_bounds(parts, window_at, half)
        how = f"the {2 * half:,} allocations around the peak of {window_device}"
        if _accesses_between(files, t0, t1) > window_accesses:
            t0, t1 = _narrow_to_accesses(files, t0, t1, window_at, window_accesses)
            how = f"the {window_accesses:,} accesses around the peak of {window_device}"
    stack_ids = [s for frame in [out["largest"]] + [p["live"] for p in out["peaks"].values()] if frame is not None
                 for s in frame["stack_id"].dropna().astype("int64").tolist()]
    out["window"] = {"tables": window_tables(files, t0, t1, span, stack_ids), "t0": int(t0), "t1": int(t1),
                     "whole": whole, "how": how}
    # accesses: the engine's exact analyses
    try:
        engine._require_accesses(files, "access time interval (ATI) analysis")
    except NeedsAccessesError as exc:
        out["ati_error"] = str(exc.message)
        return out
    from memlens.analysis.outofcore.buckets import OUTLIER_BLOCK_COLUMNS
    with _sub_scratch(runner, "buckets"):  # pass 1 (by block) once, for the ATI and the outliers
        n_buckets = engine._regroup(files, runner, rows_per_bucket or engine.DEFAULT_ROWS_PER_BUCKET,
                                    OUTLIER_BLOCK_COLUMNS)
        out["ati"] = engine.ati(files, runner, regrouped=n_buckets)
        out["outliers"], out["outlier_summary"] = engine.outliers(files, runner, bandwidth, top=scatter_rows,
                                                                  regrouped=n_buckets, events=events)
    return out
