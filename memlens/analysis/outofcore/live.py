"""Live bytes over time, out of core: the curve of `memlens.analysis.live.live_curve` built from time pieces.

The blocks table is read a batch at a time; each batch's allocs and frees go to *time buckets* (consecutive
time ranges) per device. Each time bucket is sorted on its own (by time, then event order, as `live_curve`
sorts) and summed; the running total entering a bucket is the sum of the buckets before it, so the peak
and its time come out exact from a few numbers per bucket. The whole curve is assembled only when an
analysis needs it whole (Zhang et al.'s WDOA weighs every instant of a swapped-out window by the load
then): 16 bytes per alloc/free event, the one part of the engine that grows with the trace.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

EVENT_DTYPE = np.dtype([("t_ns", "<i8"), ("seq", "<i8"), ("delta", "<i8")])
_BLOCK_COLUMNS = ["device", "size", "alloc_ns", "free_ns", "alloc_seq", "free_seq"]
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
    from memlens.analysis.outofcore.buckets import BATCH_ROWS, add_block_facts
    facts = {"devices": set(), "allocated_before": 0, "free_without_alloc": 0, "alive_at_end": 0,
             "pieces": set()}
    for sub, b in enumerate(files.iter_batches("blocks", row_groups, BATCH_ROWS)):
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
            tb = np.searchsorted(edges, ev["t_ns"], side="right")
            order = np.argsort(tb, kind="stable")  # allocs before frees inside a piece, as live_curve lists them
            counts = np.bincount(tb, minlength=len(edges) + 1)
            bounds = np.concatenate([[0], np.cumsum(counts)])
            for k in np.flatnonzero(counts):
                np.save(_piece(scratch, device, int(k), part, sub), ev[order[bounds[k]:bounds[k + 1]]])
                facts["pieces"].add((device, int(k)))
    return facts


def curve_piece(scratch: str, device: str, tb: int, write_curve: bool) -> dict:
    """Task: sort one time bucket of one device and sum it. Returns its event count, the running total's
    maximum inside the bucket (relative to the bucket's start), the first time it is reached and the
    bucket's total change; with `write_curve`, saves the bucket's (time, relative live bytes) steps."""
    files = sorted(Path(scratch).glob(f"ev-{device.encode().hex()}-{tb:05d}-*.npy"))
    ev = np.concatenate([np.load(f) for f in files])
    order = np.lexsort((ev["seq"], ev["t_ns"]))
    t = ev["t_ns"][order]
    cum = np.cumsum(ev["delta"][order])
    arg = int(np.argmax(cum))
    if write_curve:
        np.save(Path(scratch) / f"curve-{device.encode().hex()}-{tb:05d}.npy", np.stack([t, cum]))
    return {"n": int(len(t)), "max": int(cum[arg]), "t_max": int(t[arg]), "total": int(cum[-1])}


def combine_peak(parts: list[dict]) -> tuple[int, int | None]:
    """(peak live bytes, time of its first occurrence) from the time buckets' `curve_piece` results in
    time order; (0, None) when there are no events (as `Trace.peak_live_bytes` reports 0)."""
    offset, best, t_best = 0, None, None
    for p in parts:
        if p["n"] and (best is None or offset + p["max"] > best):
            best, t_best = offset + p["max"], p["t_max"]
        offset += p["total"]
    return (0, None) if best is None else (best, t_best)


def assemble_curve(scratch: str, device: str, tbs: list[int], parts: list[dict]) -> Path:
    """Write the device's whole live curve (t_ns, live) to one .npy in the scratch directory; returns it.
    Memory: 16 bytes per event while assembling."""
    out_t, out_live, offset = [], [], 0
    for tb, p in zip(tbs, parts):
        f = Path(scratch) / f"curve-{device.encode().hex()}-{tb:05d}.npy"
        steps = np.load(f)
        out_t.append(steps[0])
        out_live.append(steps[1] + offset)
        offset += p["total"]
        f.unlink()
    path = Path(scratch) / f"curve-{device.encode().hex()}.npy"
    np.save(path, np.stack([np.concatenate(out_t), np.concatenate(out_live)]))
    return path


def load_curve(path) -> pd.DataFrame:
    """A curve written by `assemble_curve` as the frame `live_curve` returns (``t_ns``, ``live``),
    memory-mapped: threads of one worker share the pages."""
    steps = np.load(path, mmap_mode="r")
    return pd.DataFrame({"t_ns": steps[0], "live": steps[1]}, copy=False)
