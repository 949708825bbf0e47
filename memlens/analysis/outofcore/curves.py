"""The report's live-memory curve, out of core: `memlens.viz.live.live_series` built a time bucket at a time.

The in-memory curve is every alloc/free event of a device (`Trace.live_bytes`), reduced for the screen by
`viz.lod.extrema_indices`: equal-width pixel columns over the visible events, each keeping its first, last,
minimum and maximum point, so the peak is exact. Here the sorted events of each time bucket
(`live.curve_piece(..., keep_events=True)`) stay on disk and three light passes over them give the same
points without any process holding the whole curve:

1. `bucket_stats`: per bucket, its event count, the blocks alive before recording (all but the last are
   hidden, as `live_series` hides them), its first and last time, and per category / module label its total
   change and first event (the bands' order); the bucket holding the peak also sums each label up to it.
2. `bucket_columns`: per bucket, the first, last, first minimum and first maximum event of every pixel
   column it touches; merged in time order they are exactly `extrema_indices`' columns.
3. `bucket_values`: per bucket, the time, live bytes and band values at the kept events.

Memory: one time bucket's events (48 bytes each) per task; the driver holds ~4 points per pixel column.
Events are named by their position in the device's whole event order (bucket base + index in the bucket).
"""
from __future__ import annotations

import numpy as np

from memlens.analysis.outofcore.live import LABEL_COLUMNS, sorted_events


def _hidden(seq: np.ndarray, keep_before: int) -> np.ndarray:
    """Events of blocks alive before recording (seq < 0) but the one at `keep_before` (index or -1)."""
    hide = seq < 0
    if 0 <= keep_before < len(hide):
        hide[keep_before] = False
    return hide


def _label_sums(ev: np.ndarray, upto: int | None = None) -> dict:
    """{label column: {code: (sum of delta, first event index)}} over `ev` (its first `upto`+1 events)."""
    part = ev if upto is None else ev[: upto + 1]
    out = {}
    for col in LABEL_COLUMNS:
        codes, first, inverse = np.unique(part[col], return_index=True, return_inverse=True)
        exact = np.zeros(len(codes), dtype=np.int64)
        np.add.at(exact, inverse.ravel(), part["delta"])  # integer sums: exact whatever the byte counts
        out[col] = {int(c): (int(s), int(f)) for c, s, f in zip(codes, exact, first)}
    return out


def bucket_stats(scratch: str, device: str, tb: int, peak_index: int | None) -> dict:
    """Pass 1 of one time bucket (see the module docstring); `peak_index` is the index of the peak event
    in this bucket, or None when the peak is elsewhere."""
    ev = sorted_events(scratch, device, tb)
    before = np.flatnonzero(ev["seq"] < 0)
    visible = np.flatnonzero(ev["seq"] >= 0)
    return {"n": int(len(ev)), "before": int(len(before)),
            "last_before": (int(before[-1]), int(ev["t_ns"][before[-1]])) if len(before) else None,
            "first_visible": (int(visible[0]), int(ev["t_ns"][visible[0]])) if len(visible) else None,
            "t_last": int(ev["t_ns"][-1]) if len(ev) else None,
            "labels": _label_sums(ev),
            "at_peak": _label_sums(ev, peak_index) if peak_index is not None else None}


def _xs(ev: np.ndarray, base: int, x: str) -> np.ndarray:
    return ev["t_ns"].astype(np.float64) if x == "time" else (base + np.arange(len(ev))).astype(np.float64)


def bucket_columns(scratch: str, device: str, tb: int, base: int, offset: int, keep_before: int, x: str,
                   lo: float, width: float, columns: int) -> dict:
    """Pass 2 of one time bucket: for each pixel column it touches, the position (in the device's event
    order) of its first and last visible event and of the first event at its minimum and maximum, with
    those values (live bytes: the bucket's running sum plus `offset`, the bytes live entering it)."""
    ev = sorted_events(scratch, device, tb)
    keep = np.flatnonzero(~_hidden(ev["seq"], keep_before))
    if len(keep) == 0:
        return {"col": np.zeros(0, np.int64)}
    y = (np.cumsum(ev["delta"]) + offset)[keep].astype(np.float64)
    xs = _xs(ev, base, x)[keep]
    col = np.minimum(((xs - lo) / width).astype(np.int64), columns - 1)  # as `extrema_indices` bins them
    starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
    ends = np.r_[starts[1:], len(col)] - 1
    hi_v = np.maximum.reduceat(y, starts)
    lo_v = np.minimum.reduceat(y, starts)
    run = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(col)]))
    idx = np.arange(len(col))
    first_max = np.full(len(starts), len(col))
    first_min = np.full(len(starts), len(col))
    np.minimum.at(first_max, run[y == hi_v[run]], idx[y == hi_v[run]])
    np.minimum.at(first_min, run[y == lo_v[run]], idx[y == lo_v[run]])
    pos = base + keep  # positions in the device's event order
    return {"col": col[starts], "first": pos[starts], "last": pos[ends], "max": hi_v, "at_max": pos[first_max],
            "min": lo_v, "at_min": pos[first_min]}


def merge_columns(pieces: list[dict]) -> np.ndarray:
    """The kept event positions (sorted) from every bucket's `bucket_columns`, in time order: a column
    split between buckets keeps its overall first, last, first minimum and first maximum."""
    best: dict[int, list] = {}
    for p in pieces:
        for i, c in enumerate(p["col"].tolist()):
            cur = best.get(c)
            if cur is None:
                best[c] = [p["first"][i], p["last"][i], p["max"][i], p["at_max"][i], p["min"][i], p["at_min"][i]]
                continue
            cur[1] = p["last"][i]                       # later buckets come later in time
            if p["max"][i] > cur[2]:                    # ties keep the earlier event
                cur[2], cur[3] = p["max"][i], p["at_max"][i]
            if p["min"][i] < cur[4]:
                cur[4], cur[5] = p["min"][i], p["at_min"][i]
    kept = [v for c in best.values() for v in (c[0], c[1], c[3], c[5])]
    return np.unique(np.asarray(kept, dtype=np.int64))


def bucket_values(scratch: str, device: str, tb: int, base: int, offset: int, positions: np.ndarray, x: str,
                  bands: dict) -> dict:
    """Pass 3 of one time bucket: at the kept `positions` (device event order) inside it, the x value,
    the live bytes and the value of each band (`bands`: {label column: {code: bytes live entering the
    bucket}}; a band's value is the live bytes of the blocks carrying that label)."""
    ev = sorted_events(scratch, device, tb)
    local = np.asarray(positions, dtype=np.int64) - base
    cum = np.cumsum(ev["delta"]) + offset
    out = {"x": _xs(ev, base, x)[local], "total": cum[local].astype(np.int64), "bands": {}}
    for col, codes in bands.items():
        out["bands"][col] = {}
        for code, entering in codes.items():
            mine = np.flatnonzero(ev[col] == code)
            running = np.cumsum(ev["delta"][mine])
            k = np.searchsorted(mine, local, side="right") - 1  # the last event of the label at or before
            out["bands"][col][code] = entering + np.where(k >= 0, running[np.maximum(k, 0)] if len(mine) else 0, 0)
    return out
