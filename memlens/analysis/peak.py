"""What the memory consists of at its peak, per device.

The peak is the max over time of the sum of live block sizes (max-live: the lower
bound of any static plan), taken after the alloc/free event that reaches it first. The blocks live then are
grouped by category, module and allocating op, and the largest are listed. Works on every trace (it needs
lifetimes only, not accesses).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.trace import live_events

from memlens.units import format_bytes, format_ns, format_share

LARGEST_COLUMNS = ("block_id", "size", "category", "op", "module", "stack_id", "alloc_ns", "free_ns")


@dataclass
class PeakBreakdown:
    """The peak of one device: ``peak_bytes`` (bytes), ``peak_ns`` (trace-relative ns), ``peak_seq`` (event
    order), ``peak_block_id`` (the allocation that reached it), ``live_blocks`` (count at the peak), the
    live bytes grouped ``by_category`` / ``by_module`` / ``by_op`` (DataFrames with ``bytes``, ``blocks``,
    ``share`` of the peak, largest first), the ``largest`` live blocks, and ``op_at_peak`` / ``iteration``
    when the trace knows them."""

    device: str
    peak_bytes: int
    peak_ns: int
    peak_seq: int
    peak_block_id: int | None
    live_blocks: int
    by_category: pd.DataFrame
    by_module: pd.DataFrame
    by_op: pd.DataFrame
    largest: pd.DataFrame
    op_at_peak: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self, top: int = 10) -> dict:
        """JSON-ready form (groups and largest blocks cut to `top` rows)."""
        def rows(df):
            return df.head(top).to_dict(orient="records")
        return {"device": self.device, "peak_bytes": self.peak_bytes, "peak_ns": self.peak_ns,
                "peak_seq": self.peak_seq, "peak_block_id": self.peak_block_id, "live_blocks": self.live_blocks,
                "op_at_peak": self.op_at_peak, "by_category": rows(self.by_category),
                "by_module": rows(self.by_module), "by_op": rows(self.by_op), "largest": rows(self.largest),
                "notes": list(self.notes)}

    def describe(self) -> str:
        """One sentence: when the peak happens and what dominates it."""
        if self.peak_bytes <= 0:
            return f"{self.device}: nothing is live at any time."
        head = (f"{self.device} peaks at {format_bytes(self.peak_bytes)} at {format_ns(self.peak_ns)} with "
                f"{self.live_blocks:,} live block{'' if self.live_blocks == 1 else 's'}")
        known = self.by_category[self.by_category["category"] != "unknown"]
        if len(known) == 0:
            return head + " (the source does not say what the blocks hold)."
        top, first = known.iloc[0], self.by_category.iloc[0]
        text = head + f"; {top['category']} holds {format_bytes(top['bytes'])} ({format_share(top['share'])}) of it"
        if first["category"] == "unknown":  # the table's first row: say so before the largest known one
            text = (head + f"; most of it, {format_bytes(first['bytes'])} ({format_share(first['share'])}), is "
                    f"unknown (the source does not say what those blocks hold), then {top['category']} with "
                    f"{format_bytes(top['bytes'])} ({format_share(top['share'])})")
        return text + "."

    def module_sentence(self) -> str:
        """One sentence from `by_module`'s first row (the table the peak's chart by module draws): the module
        holding the most bytes at the peak, "(unknown)" when blocks allocated outside any module hold the
        most (and then the largest named module); "" when no live block has a module."""
        named = self.by_module[self.by_module["module"] != "(unknown)"]
        if len(named) == 0:
            return ""
        first = self.by_module.iloc[0]
        text = f"The module holding most of it is {first['module']} ({format_bytes(first['bytes'])}"
        if first["module"] == "(unknown)":
            top = named.iloc[0]
            return text + f": blocks no module allocated); next is {top['module']} ({format_bytes(top['bytes'])})."
        return text + ")."


def _group(live: pd.DataFrame, key: str, peak: int) -> pd.DataFrame:
    labels = live[key].astype(str).replace("", "(unknown)")
    grouped = live.groupby(labels.to_numpy())["size"]
    out = pd.DataFrame({"bytes": grouped.sum(), "blocks": grouped.size()})
    out.index.name = key
    out = out.sort_values(["bytes", "blocks"], ascending=False).reset_index()
    out["share"] = out["bytes"] / peak if peak > 0 else 0.0
    return out


def live_at(trace, device: str, seq: int, t_ns: int) -> pd.DataFrame:
    """Blocks of `device` live right after the event (`t_ns`, `seq`): allocated at or before it and not
    yet freed (blocks alive before recording count from the start, those never freed until the end)."""
    lt = trace.lifetimes(device)
    started = (lt["start_ns"].to_numpy() < t_ns) | ((lt["start_ns"].to_numpy() == t_ns) &
                                                     (lt["start_seq"].to_numpy() <= seq))
    freed_known = lt["free_ns"].notna().to_numpy()
    ended = freed_known & ((lt["end_ns"].to_numpy() < t_ns) | ((lt["end_ns"].to_numpy() == t_ns) &
                                                              (lt["end_seq"].to_numpy() <= seq)))
    return lt[started & ~ended]


def breakdown_of_live(device: str, live: pd.DataFrame, peak: int, t_peak: int, seq_peak: int,
                      block_id: int | None, op: str, largest: int = 20) -> PeakBreakdown:
    """The `PeakBreakdown` of one device from the blocks `live` at its peak (`live_at`'s rows), the peak
    (bytes), its event (`t_peak` ns, `seq_peak`), the allocation that reached it and that block's op.
    Shared by `peak_breakdown` and the out-of-core report, which collects `live` a batch at a time."""
    notes = []
    if int(live["size"].sum()) != peak:
        notes.append(f"live blocks sum to {int(live['size'].sum())} bytes, the curve to {peak}: "
                     "the trace's event order and timestamps disagree")
    cols = [c for c in LARGEST_COLUMNS if c in live.columns]
    big = live.sort_values(["size", "block_id"], ascending=[False, True])[cols].head(largest)
    return PeakBreakdown(
        device=device, peak_bytes=peak, peak_ns=t_peak, peak_seq=seq_peak, peak_block_id=block_id,
        live_blocks=int(len(live)), by_category=_group(live, "category", peak),
        by_module=_group(live, "module", peak), by_op=_group(live, "op", peak),
        largest=big.reset_index(drop=True), op_at_peak=op, notes=notes)


def peak_breakdown(trace, device: str | None = None, largest: int = 20) -> dict[str, PeakBreakdown]:
    """{device: PeakBreakdown} for every device of `trace` (only `device` when given); see `PeakBreakdown`.

    `largest` is how many of the biggest live blocks to list. Every device is computed in one pass over the
    blocks (one sort, one grouping per key), so the work grows with the blocks, not with blocks x devices.
    """
    devices = trace.devices if device is None else [device]
    peaks = _device_peaks(trace, devices)
    if not peaks:
        return {}
    lt = trace.lifetimes()
    lt = lt[lt["device"].isin(list(peaks)).to_numpy()]
    dev = lt["device"].astype(str).to_numpy()
    t_peak = np.array([peaks[d][1] for d in dev], dtype=np.int64)
    s_peak = np.array([peaks[d][2] for d in dev], dtype=np.int64)
    start, end = lt["start_ns"].to_numpy(), lt["end_ns"].to_numpy()
    started = (start < t_peak) | ((start == t_peak) & (lt["start_seq"].to_numpy() <= s_peak))
    ended = lt["free_ns"].notna().to_numpy() & ((end < t_peak) | ((end == t_peak) & (lt["end_seq"].to_numpy() <= s_peak)))
    live = lt[started & ~ended].sort_values("device", kind="stable")
    groups = {key: _split(_group_all(live, key, peaks)) for key in ("category", "module", "op")}
    cols = [c for c in LARGEST_COLUMNS if c in live.columns]
    big = live.sort_values(["device", "size", "block_id"], ascending=[True, False, True], kind="stable")
    big = big[big.groupby("device", sort=False).cumcount().to_numpy() < largest]
    big_by_dev = _split(big, cols)
    live_by_dev = _split(live, ["size"])
    ops = trace.blocks.drop_duplicates("block_id").set_index("block_id")["op"]
    result = {}
    for d, (peak, t, seq, block_id) in peaks.items():
        rows = live_by_dev.get(d)
        live_sum = int(rows["size"].sum()) if rows is not None else 0
        notes = [] if live_sum == peak else [f"live blocks sum to {live_sum} bytes, the curve to {peak}: the trace's "
                                             "event order and timestamps disagree"]
        op = str(ops.get(block_id, "")) if block_id is not None else ""
        empty = {key: pd.DataFrame({key: pd.Series(dtype=object), "bytes": pd.Series(dtype=np.int64),
                                    "blocks": pd.Series(dtype=np.int64), "share": pd.Series(dtype=float)})
                 for key in groups}
        result[d] = PeakBreakdown(
            device=d, peak_bytes=peak, peak_ns=t, peak_seq=seq, peak_block_id=block_id,
            live_blocks=0 if rows is None else len(rows),
            by_category=groups["category"].get(d, empty["category"]), by_module=groups["module"].get(d, empty["module"]),
            by_op=groups["op"].get(d, empty["op"]),
            largest=big_by_dev.get(d, pd.DataFrame(columns=cols)), op_at_peak=op, notes=notes)
    return result


def _device_peaks(trace, devices) -> dict[str, tuple[int, int, int, int | None]]:
    """{device: (peak live bytes, t_ns, seq, block_id of the allocation that reached it or None)} for the
    devices with events: the first maximum of each device's `Trace.live_bytes` curve, all in one sort."""
    b = trace.blocks[trace.blocks["device"].isin(list(devices)).to_numpy()]
    if len(b) == 0:
        return {}
    codes, names = pd.factorize(b["device"].astype(str))
    # each device's events in `Trace.live_bytes`'s order, the devices one after another (one sort)
    t, seq, delta, row, _ = live_events(b, trace.time_span_ns()[0], by=codes)
    dev, bid = codes[row], b["block_id"].to_numpy()[row]
    starts = np.flatnonzero(np.r_[True, dev[1:] != dev[:-1]])
    total = np.cumsum(delta)
    before = np.r_[0, total[starts[1:] - 1]]  # bytes of the devices sorted before each group
    group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(dev)]))
    live = total - before[group]
    best = np.maximum.reduceat(live, starts)
    at_max = np.flatnonzero(live == best[group])
    _, first = np.unique(group[at_max], return_index=True)
    out = {}
    for g, i in enumerate(at_max[first]):
        out[str(names[dev[i]])] = (int(live[i]), int(t[i]), int(seq[i]), int(bid[i]) if delta[i] > 0 else None)
    return {d: out[d] for d in sorted(out)}


def _group_all(live: pd.DataFrame, key: str, peaks: dict) -> pd.DataFrame:
    """`_group` of every device at once: ``device``, `key`, ``bytes``, ``blocks``, ``share``; per device
    largest first (ties by bytes, then blocks, kept in label order)."""
    labels = live[key].astype(str).replace("", "(unknown)").to_numpy()
    g = pd.DataFrame({"device": live["device"].astype(str).to_numpy(), key: labels,
                      "size": live["size"].to_numpy(np.int64)}).groupby(["device", key], sort=True)["size"]
    out = pd.DataFrame({"bytes": g.sum(), "blocks": g.size()}).reset_index()
    out = out.iloc[np.lexsort((-out["blocks"].to_numpy(), -out["bytes"].to_numpy(),
                               pd.factorize(out["device"], sort=True)[0]))]
    peak = out["device"].map({d: p[0] for d, p in peaks.items()}).to_numpy(dtype=np.int64)
    out["share"] = np.where(peak > 0, out["bytes"].to_numpy() / np.maximum(peak, 1), 0.0)
    return out


def _split(df: pd.DataFrame, cols=None) -> dict[str, pd.DataFrame]:
    """{device: its rows of `df` (sorted by device; `cols`, else all but ``device``), index reset}."""
    dev = df["device"].astype(str).to_numpy()
    cols = cols or [c for c in df.columns if c != "device"]
    starts = np.flatnonzero(np.r_[True, dev[1:] != dev[:-1]]) if len(dev) else np.array([], dtype=int)
    ends = np.r_[starts[1:], len(dev)]
    body = df[cols]
    return {str(dev[s]): body.iloc[s:e].reset_index(drop=True) for s, e in zip(starts, ends)}
