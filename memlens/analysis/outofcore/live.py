"""Live bytes over time, out of core: the curve of `memlens.analysis.live.live_curve` built from time pieces.

The blocks table is read a batch at a time; each batch's allocs and frees go to *time buckets* (consecutive
time ranges) per device. Each time bucket is sorted on its own (by time, then event order, as `live_curve`
sorts) and summed; the running total entering a bucket is the sum of the buckets before it, so the peak
and its time come out exact from a few numbers per bucket. Zhang et al.'s WDOA weighs every instant of a
swapped-out window by the load then: its cumulative weight integral is built bucket by bucket too, one
file per time bucket (16 bytes per alloc/free event on disk), and the outlier tasks look it up a piece at
a time (`ChunkedIntegral`), so no process ever holds the whole curve.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from memlens.trace import conform

# an alloc (+size) or free (-size) of one block; `category` / `module` are `label_codes` of the block's
# labels, so the report's live curve can be split by them a time bucket at a time
EVENT_DTYPE = np.dtype([("t_ns", "<i8"), ("seq", "<i8"), ("delta", "<i8"), ("block_id", "<i8"),
                        ("category", "<i8"), ("module", "<i8")])
_BLOCK_COLUMNS = ["device", "size", "alloc_ns", "free_ns", "alloc_seq", "free_seq", "category", "module"]
LABEL_COLUMNS = ("category", "module")


def label_codes(labels: np.ndarray) -> tuple[np.ndarray, dict[int, str]]:
    """(an int64 code per label, {code: label}): a 64-bit hash of the label text, the same in every task
    (so pieces written by different tasks agree without a shared dictionary). An empty label is
    "(unknown)", as the live curve's bands name it (`viz.live.live_series`)."""
    import hashlib
    text = pd.Series(labels, dtype=object).astype(str).replace("", "(unknown)").to_numpy(dtype=object)
    uniq, inverse = np.unique(text, return_inverse=True)
    codes = np.array([int.from_bytes(hashlib.blake2b(u.encode(), digest_size=8).digest(), "little", signed=True)
                      for u in uniq], dtype=np.int64)
    return codes[inverse], {int(c): str(u) for c, u in zip(codes, uniq)}
_INT64_MAX = np.iinfo(np.int64).max


def time_edges(files, n_buckets: int, span: tuple[int, int]) -> np.ndarray:
    """Interior edges of `n_buckets` time buckets: the blocks row groups' first alloc times when the blocks
    table is in alloc order (so each bucket gets about one row group of allocs), else even time steps."""
    import pyarrow.parquet as pq
    if n_buckets <= 1:
        return np.array([], dtype=np.int64)
    pf = pq.ParquetFile(files.files["blocks"])
    idx = pf.schema_arrow.get_field_index("alloc_ns")
    mins, maxs = [], []
    for g in range(pf.metadata.num_row_groups):
        st = pf.metadata.row_group(g).column(idx).statistics
        if st is None or not st.has_min_max:
            mins = None
            break
        mins.append(int(st.min))
        maxs.append(int(st.max))
    if mins and len(mins) == n_buckets and all(maxs[i] <= mins[i + 1] for i in range(len(mins) - 1)):
        return np.asarray(mins[1:], dtype=np.int64)
    return np.linspace(span[0], span[1], n_buckets + 1)[1:-1].astype(np.int64)


def _piece(scratch, device: str, tb: int, part: int, sub: int) -> Path:
    return Path(scratch) / f"ev-{device.encode().hex()}-{tb:05d}-{part:06d}-{sub:05d}.npy"


def split_events(files, row_groups: list[int], part: int, edges: np.ndarray, lo: int, scratch: str) -> dict:
    """Task: the allocs and frees of some blocks row groups, split into time-bucket pieces per device.
    Also returns the block-level facts of `buckets.add_block_facts`."""
    from memlens.analysis.outofcore.buckets import BLOCK_BATCH_ROWS, add_block_facts
    facts = {"devices": set(), "allocated_before": 0, "free_without_alloc": 0, "alive_at_end": 0,
             "pieces": set(), "labels": {k: {} for k in LABEL_COLUMNS}}
    stored = files.columns("blocks")
    columns = [c for c in ["block_id", *_BLOCK_COLUMNS, "allocated_before", "free_without_alloc"] if c in stored]
    for sub, b in enumerate(files.iter_batches("blocks", row_groups, BLOCK_BATCH_ROWS, columns)):
        b = conform("blocks", b)
        add_block_facts(facts, b)
        for device, rows in b.groupby(b["device"].astype(str), sort=True):
            size = rows["size"].to_numpy(dtype=np.int64)
            freed = rows["free_ns"].notna().to_numpy()
            ev = np.empty(len(rows) + int(freed.sum()), dtype=EVENT_DTYPE)
            ev["t_ns"] = np.concatenate([rows["alloc_ns"].fillna(lo).to_numpy(np.int64),
                                         rows["free_ns"].to_numpy("float64", na_value=0)[freed].astype(np.int64)])
            ev["seq"] = np.concatenate([rows["alloc_seq"].fillna(-1).to_numpy(np.int64),
                                        rows["free_seq"].fillna(_INT64_MAX).to_numpy(np.int64)[freed]])
            ev["delta"] = np.concatenate([size, -size[freed]])
            ids = rows["block_id"].to_numpy(np.int64)
            ev["block_id"] = np.concatenate([ids, ids[freed]])
            for col in LABEL_COLUMNS:
                codes, names = label_codes(rows[col].to_numpy())
                facts["labels"][col].update(names)
                ev[col] = np.concatenate([codes, codes[freed]])
            tb = np.searchsorted(edges, ev["t_ns"], side="right")
            order = np.argsort(tb, kind="stable")  # allocs before frees inside a piece, as live_curve lists them
            counts = np.bincount(tb, minlength=len(edges) + 1)
            bounds = np.concatenate([[0], np.cumsum(counts)])
            for k in np.flatnonzero(counts):
                np.save(_piece(scratch, device, int(k), part, sub), ev[order[bounds[k]:bounds[k + 1]]])
                facts["pieces"].add((device, int(k)))
    return facts


def curve_piece(scratch: str, device: str, tb: int, write_curve: bool, keep_events: bool = False) -> dict:
    """Task: sort one time bucket of one device and sum it. Returns its event count, the running total's
    maximum inside the bucket (relative to the bucket's start), the first time it is reached and the
    bucket's total change; with `write_curve`, saves the bucket's (time, relative live bytes) steps, and with
    `keep_events` its sorted events (`sorted_events`)."""
    files = sorted(Path(scratch).glob(f"ev-{device.encode().hex()}-{tb:05d}-*.npy"))
    ev = np.concatenate([np.load(f) for f in files])
    order = np.lexsort((ev["seq"], ev["t_ns"]))
    t = ev["t_ns"][order]
    cum = np.cumsum(ev["delta"][order])
    arg = int(np.argmax(cum))
    if write_curve:
        np.save(Path(scratch) / f"curve-{device.encode().hex()}-{tb:05d}.npy", np.stack([t, cum]))
    if keep_events:
        np.save(_events_path(scratch, device, tb), ev[order])  # the sorted events, for the report's curve
    first = ev[order[arg]]
    return {"n": int(len(t)), "max": int(cum[arg]), "t_max": int(t[arg]), "i_max": arg, "total": int(cum[-1]),
            "seq_max": int(first["seq"]), "delta_max": int(first["delta"]), "block_max": int(first["block_id"])}


def _events_path(scratch, device: str, tb: int) -> Path:
    return Path(scratch) / f"sorted-{device.encode().hex()}-{tb:05d}.npy"


def sorted_events(scratch, device: str, tb: int) -> np.ndarray:
    """A time bucket's events (`EVENT_DTYPE`) in the live curve's order (written by `curve_piece`)."""
    return np.load(_events_path(scratch, device, tb))


def peak_event(parts: list[dict]) -> dict | None:
    """The event that first reaches the peak, from the time buckets' `curve_piece` results in time order:
    {"bucket" (index in `parts`), "index" (in that bucket), "peak", "t_ns", "seq", "delta", "block_id"};
    None without events."""
    offset, best = 0, None
    for i, p in enumerate(parts):
        if p["n"] and (best is None or offset + p["max"] > best["peak"]):
            best = {"bucket": i, "index": p["i_max"], "peak": offset + p["max"], "t_ns": p["t_max"], "seq": p["seq_max"],
                    "delta": p["delta_max"], "block_id": p["block_max"]}
        offset += p["total"]
    return best


def combine_peak(parts: list[dict]) -> tuple[int, int | None]:
    """(peak live bytes, time of its first occurrence) from the time buckets' `curve_piece` results in
    time order; (0, None) when there are no events (as `Trace.peak_live_bytes` reports 0)."""
    offset, best, t_best = 0, None, None
    for p in parts:
        if p["n"] and (best is None or offset + p["max"] > best):
            best, t_best = offset + p["max"], p["t_max"]
        offset += p["total"]
    return (0, None) if best is None else (best, t_best)


def _steps(scratch: str, device: str, tb: int) -> np.ndarray:
    return np.load(Path(scratch) / f"curve-{device.encode().hex()}-{tb:05d}.npy")


def curve_sums(scratch: str, device: str, tb: int, offset: int, next_t: float) -> dict:
    """Task: one time bucket's share of `distributions.time_weighted_mean` of the live curve: sums of
    live x dt, dt and live (each step holds until the next event, the last until `next_t`)."""
    steps = _steps(scratch, device, tb)
    t = steps[0].astype(np.float64)
    load = (steps[1] + offset).astype(np.float64)
    dt = np.diff(np.append(t, next_t))
    return {"vdt": float((load * dt).sum()), "dt": float(dt.sum()), "v": float(load.sum()), "n": len(t)}


def peak_context(scratch: str, device: str, tbs: list[int], parts: list[dict], span: tuple[int, int],
                 limit_bytes: float | None, runner) -> dict:
    """What `outliers` needs of a device's whole live curve, built a time bucket at a time: ``t_peak`` and
    the cumulative WDOA weight integral (`wdoa.load_weight`'s arrays, one .npy piece per time bucket
    that `ChunkedIntegral` reads back). Memory: one bucket; disk: 16 bytes per event."""
    peak, t_peak = combine_peak(parts)
    hi = span[1]
    offsets = np.concatenate([[0], np.cumsum([p["total"] for p in parts])])[:-1].astype(np.int64)
    firsts = [float(_steps(scratch, device, tb)[0][0]) for tb in tbs]
    n_total = sum(p["n"] for p in parts)
    last_t = float(_steps(scratch, device, tbs[-1])[0][-1]) if tbs else 0.0
    end = max(float(hi), last_t)
    if limit_bytes is None:
        sums = runner.map(curve_sums, [(scratch, device, tb, int(off), firsts[i + 1] if i + 1 < len(tbs) else
                                        float(hi)) for i, (tb, off) in enumerate(zip(tbs, offsets))])
        span_t = sum(x["dt"] for x in sums)
        limit = (sum(x["vdt"] for x in sums) / span_t if span_t > 0
                 else sum(x["v"] for x in sums) / max(sum(x["n"] for x in sums), 1))
    else:
        limit = float(limit_bytes)
    carry = 0.0
    scale = max(float(peak) - limit, 1.0)
    chunks = []
    for i, (tb, off) in enumerate(zip(tbs, offsets)):
        steps = _steps(scratch, device, tb)
        t = steps[0].astype(np.float64)
        load = (steps[1] + off).astype(np.float64)
        weight = np.clip((load - limit) / scale, 0.0, 1.0)
        nxt = firsts[i + 1] if i + 1 < len(tbs) else end
        times = np.append(t, nxt)
        cum = np.cumsum(np.concatenate([[carry], weight * np.diff(times)]))  # sequential, as one cumsum
        # this bucket's piece of the integral, closed by the next bucket's first point (its value there),
        # so interpolating inside the piece uses the same two breakpoints as on the whole curve
        chunk = Path(scratch) / f"weight-{device.encode().hex()}-{tb:05d}.npy"
        np.save(chunk, np.stack([times, cum]))
        chunks.append(str(chunk))
        carry = float(cum[-1])
        del steps, t, load, weight, times, cum
    return {"t_peak": t_peak, "chunks": chunks, "firsts": firsts, "limit": limit, "peak": peak,
            "events": n_total}


class ChunkedIntegral:
    """The cumulative WDOA weight integral of a whole live curve (``np.interp(x, times, cum)`` of
    `wdoa.load_weight`'s arrays), evaluated a time bucket's piece at a time: memory is one piece
    (16 bytes per event of a time bucket), whatever the trace's length."""

    def __init__(self, chunks: list[str], firsts: list[float]):
        self.chunks = list(chunks)
        self.firsts = np.asarray(firsts, dtype=np.float64)

    def __call__(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        out = np.empty(x.shape, dtype=np.float64)
        if not self.chunks:
            out[...] = 0.0
            return out
        which = np.clip(np.searchsorted(self.firsts, x, side="right") - 1, 0, len(self.chunks) - 1)
        for k in np.unique(which):
            piece = np.load(self.chunks[int(k)])
            sel = which == k
            out[sel] = np.interp(x[sel], piece[0], piece[1])
        return out


def load_context(ctx: dict) -> dict:
    """A `peak_context` as `outliers.outliers` takes it: the peak time and the weight integral (a
    `ChunkedIntegral` over the pieces on disk)."""
    return {"t_peak": ctx["t_peak"], "integral": ChunkedIntegral(ctx["chunks"], ctx["firsts"])}
