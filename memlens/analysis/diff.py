"""Compare two traces: before/after a change, batch 32 vs 64, fp32 vs bf16, a recording vs a snapshot.

`diff(a, b)` pairs the devices, then reports the change in peak live bytes, in what is live at the peak (by
category, module and allocating op), the blocks that appear or disappear, allocations per op, iterations and,
when both traces have accesses, access time intervals (ATI). Blocks are matched by signature
``(op, module, size, order)`` where order counts earlier blocks with the same (op, module, size) on the
device: the k-th 4 MiB ``aten::mm`` block of ``layer3`` in A matches the k-th one in B. Fields one side cannot
provide (a snapshot has no modules; op names from different sources do not overlap) are left out of the
signature, and `TraceDiff.cannot_compare` says what could not be compared and why.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.units import format_bytes, format_ns

GROUPS = ("category", "module", "op")
TOP = 20


@dataclass
class TraceDiff:
    """The comparison of trace `a` (before) with trace `b` (after). Bytes and ns throughout; every delta is
    b - a. See the module docstring for the block signature.

    - ``device_pairs``: (device of A, device of B) compared with each other.
    - ``peak``: one row per pair: ``peak_a``, ``peak_b``, ``delta``, ``ratio`` (b / a), ``peak_ns_a/b``, and
      ``reserved_a/b`` (peak reserved bytes, `memlens.reserved.reserved_curve`; None without allocator data).
    - ``at_peak``: {"category" | "module" | "op": rows of ``device``, label, ``bytes_a``, ``bytes_b``,
      ``delta``} for the blocks live at each trace's peak, largest change first.
    - ``blocks``: ``signature`` (fields used), ``matched``, ``appeared`` / ``disappeared`` (counts) and
      their ``*_bytes``; ``appeared`` / ``disappeared`` frames list the largest such blocks.
    - ``by_op``: allocations and bytes per allocating op in A and B; ``op_counts``: ops executed per
      name (None unless both traces record ops).
    - ``iterations``: counts and sources, and with iterations on both sides a per-iteration ``table``
      (aligned by index) and the median iteration peak and duration.
    - ``ati``: statistics of A and B and their ``delta``, plus ``by_category`` (None unless both traces
      record accesses).
    - ``stacks``: call stacks whose bytes at the peak changed (appeared, vanished, grew, shrank), with A's
      and B's bytes (`memlens.analysis.stack_diff`).
    - ``cannot_compare``: what could not be compared and why; ``notes``: how the comparison was made.
    """

    name_a: str
    name_b: str
    source_a: str
    source_b: str
    device_pairs: list[tuple[str, str]]
    peak: pd.DataFrame
    at_peak: dict[str, pd.DataFrame]
    blocks: dict
    appeared: pd.DataFrame
    disappeared: pd.DataFrame
    by_op: pd.DataFrame
    op_counts: pd.DataFrame | None
    iterations: dict
    ati: dict | None
    cannot_compare: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stacks: pd.DataFrame = field(default_factory=pd.DataFrame)
    trace_a: object = field(default=None, repr=False)
    trace_b: object = field(default=None, repr=False)

    def to_dict(self, top: int = TOP) -> dict:
        """JSON-ready dict (tables cut to `top` rows)."""
        def rows(df):
            return [{k: _plain(v) for k, v in r.items()} for r in df.head(top).to_dict(orient="records")]
        its = {k: (rows(v) if isinstance(v, pd.DataFrame) else _plain(v)) for k, v in self.iterations.items()}
        return {"a": self.name_a, "b": self.name_b, "source_a": self.source_a, "source_b": self.source_b,
                "device_pairs": [list(p) for p in self.device_pairs], "peak": rows(self.peak),
                "at_peak": {k: rows(v) for k, v in self.at_peak.items()},
                "blocks": {k: _plain(v) for k, v in self.blocks.items()},
                "appeared": rows(self.appeared), "stacks": rows(self.stacks), "disappeared": rows(self.disappeared), "by_op": rows(self.by_op),
                "op_counts": None if self.op_counts is None else rows(self.op_counts),
                "iterations": its, "ati": None if self.ati is None else {
                    k: (rows(v) if isinstance(v, pd.DataFrame) else _plain(v)) for k, v in self.ati.items()},
                "cannot_compare": list(self.cannot_compare), "notes": list(self.notes)}

    def summary(self) -> list[str]:
        """The differences in sentences with numbers."""
        out = []
        for r in self.peak.itertuples():
            change = f"{_signed_bytes(r.delta)} ({r.ratio - 1:+.1%})" if r.peak_a > 0 else _signed_bytes(r.delta)
            out.append(f"Peak live memory on {r.device_a}{'' if r.device_a == r.device_b else '/' + r.device_b} "
                       f"goes from {format_bytes(r.peak_a)} to {format_bytes(r.peak_b)}: {change}.")
            if r.reserved_a is not None and r.reserved_b is not None and not (pd.isna(r.reserved_a) or
                                                                              pd.isna(r.reserved_b)):
                out.append(f"Peak reserved memory goes from {format_bytes(int(r.reserved_a))} to "
                           f"{format_bytes(int(r.reserved_b))}: {_signed_bytes(int(r.reserved_b - r.reserved_a))}.")
        for by in GROUPS:
            frame = self.at_peak.get(by)
            if any(c.startswith(f"live memory at the peak by {by}:") for c in self.cannot_compare):
                continue
            if frame is None or len(frame) == 0 or frame["delta"].abs().max() == 0:
                continue
            top = frame.iloc[int(np.argmax(frame["delta"].abs().to_numpy()))]
            out.append(f"At the peak, the largest change by {by} is {top[by]}: {format_bytes(top['bytes_a'])} -> "
                       f"{format_bytes(top['bytes_b'])} ({_signed_bytes(top['delta'])}).")
        from memlens.analysis.stack_diff import stack_sentence
        if stack_sentence(self.stacks):
            out.append(stack_sentence(self.stacks))
        bl = self.blocks
        out.append(f"Matching blocks by ({', '.join(bl['signature'])}, order): {bl['matched']:,} in both, "
                   f"{bl['appeared']:,} only in B ({format_bytes(bl['appeared_bytes'])}), {bl['disappeared']:,} "
                   f"only in A ({format_bytes(bl['disappeared_bytes'])}).")
        if self.op_counts is not None and len(self.op_counts):
            changed = self.op_counts[self.op_counts["delta"] != 0]
            out.append(f"Ops executed: {int(self.op_counts['count_a'].sum()):,} in A, "
                       f"{int(self.op_counts['count_b'].sum()):,} in B; {len(changed):,} op names run a different "
                       "number of times" + (f" (most: {changed.iloc[0]['op']} {int(changed.iloc[0]['count_a']):,}"
                                             f" -> {int(changed.iloc[0]['count_b']):,})" if len(changed) else "") + ".")
        it = self.iterations
        if it.get("count_a") is not None and it.get("count_b") is not None:
            out.append(f"Iterations: {it['count_a']} in A ({it['source_a']}), {it['count_b']} in B ({it['source_b']})"
                       + (f"; median iteration peak {format_bytes(it['median_peak_a'])} -> "
                          f"{format_bytes(it['median_peak_b'])}" if it.get("median_peak_a") is not None else "")
                       + ".")
        if self.ati is not None:
            a, b = self.ati["a"], self.ati["b"]
            out.append(f"Median ATI {format_ns(a['p50_ns'] or 0)} -> {format_ns(b['p50_ns'] or 0)}, 90th percentile "
                       f"{format_ns(a['p90_ns'] or 0)} -> {format_ns(b['p90_ns'] or 0)} ({a['count']:,} -> "
                       f"{b['count']:,} intervals).")
        out += list(self.notes)
        out += [f"Not compared: {c}" for c in self.cannot_compare]
        return out


def _plain(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return None if np.isnan(v) else float(v)
    if isinstance(v, float) and np.isnan(v):
        return None
    if v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _signed_bytes(n) -> str:
    return ("+" if n >= 0 else "-") + format_bytes(abs(n))


def pair_devices(a, b) -> tuple[list[tuple[str, str]], list[str]]:
    """(pairs, notes): devices present in both (by name); two single-device traces on different devices pair
    up (said in the notes); devices found in only one trace are named in the notes."""
    da, db = a.devices, b.devices
    common = [d for d in da if d in db]
    notes = []
    if not common and len(da) == 1 and len(db) == 1:
        return [(da[0], db[0])], [f"A runs on {da[0]} and B on {db[0]}: their single devices are compared"]
    for d in da:
        if d not in common:
            notes.append(f"device {d} exists only in A")
    for d in db:
        if d not in common:
            notes.append(f"device {d} exists only in B")
    return [(d, d) for d in common], notes


def signature_fields(a, b) -> tuple[list[str], list[str]]:
    """The block fields both traces can match on (size always), and why others were dropped."""
    fields, notes = [], []
    ops_a = set(a.blocks["op"].astype(str)) - {""}
    ops_b = set(b.blocks["op"].astype(str)) - {""}
    if ops_a and ops_b and len(ops_a & ops_b) >= 0.1 * min(len(ops_a), len(ops_b)):
        fields.append("op")
    else:
        notes.append("allocating ops: the two traces name ops differently or not at all "
                     f"({a.metadata.get('source_kind', '?')} vs {b.metadata.get('source_kind', '?')}), so blocks "
                     "are matched without them")
    mods_a = set(a.blocks["module"].astype(str)) - {""}
    mods_b = set(b.blocks["module"].astype(str)) - {""}
    if mods_a and mods_b:
        fields.append("module")
    else:
        notes.append("modules: " + ("neither trace" if not (mods_a or mods_b) else "only one trace") +
                     " attributes blocks to modules")
    return fields + ["size"], notes


def _keyed(blocks: pd.DataFrame, fields: list[str]) -> pd.DataFrame:
    """Blocks in allocation order with their signature columns and ``order`` (rank within the signature)."""
    order = np.lexsort((blocks["block_id"].to_numpy(), blocks["alloc_seq"].fillna(-1).to_numpy(dtype=np.int64)))
    b = blocks.iloc[order]
    key = b[fields].astype({f: str for f in fields if f != "size"})
    out = key.copy()
    out["order"] = key.groupby(fields, sort=False).cumcount().to_numpy()
    for c in ("block_id", "category", "op", "module", "alloc_ns", "free_ns"):
        if c not in out:
            out[c] = b[c].to_numpy()
    out["size"] = b["size"].to_numpy()
    return out.reset_index(drop=True)


def match_blocks(a, b, pairs, fields) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(counts and bytes matched / appeared / disappeared, largest appeared, largest disappeared)."""
    appeared, disappeared, matched = [], [], 0
    on = fields + ["order"]
    for dev_a, dev_b in pairs:
        ka = _keyed(a.blocks[a.blocks["device"] == dev_a], fields)
        kb = _keyed(b.blocks[b.blocks["device"] == dev_b], fields)
        merged = ka[on].merge(kb[on], on=on, how="outer", indicator=True)
        matched += int((merged["_merge"] == "both").sum())
        only_a = merged[merged["_merge"] == "left_only"][on]
        only_b = merged[merged["_merge"] == "right_only"][on]
        disappeared.append(ka.merge(only_a, on=on).assign(device=dev_a))
        appeared.append(kb.merge(only_b, on=on).assign(device=dev_b))
    cols = ["device", "block_id", "size", "category", "op", "module", "alloc_ns", "free_ns"]
    app = pd.concat(appeared, ignore_index=True) if appeared else pd.DataFrame(columns=cols)
    dis = pd.concat(disappeared, ignore_index=True) if disappeared else pd.DataFrame(columns=cols)
    summary = {"signature": list(fields), "matched": matched, "appeared": int(len(app)),
               "appeared_bytes": int(app["size"].sum()) if len(app) else 0, "disappeared": int(len(dis)),
               "disappeared_bytes": int(dis["size"].sum()) if len(dis) else 0}

    def largest(df):
        return df.sort_values(["size", "block_id"], ascending=[False, True])[cols].head(TOP).reset_index(drop=True)
    return summary, largest(app), largest(dis)


def _at_peak(pa: dict, pb: dict, pairs, by: str) -> pd.DataFrame:
    frames = []
    for dev_a, dev_b in pairs:
        if dev_a not in pa or dev_b not in pb:
            continue
        ga = getattr(pa[dev_a], f"by_{by}").set_index(by)["bytes"]
        gb = getattr(pb[dev_b], f"by_{by}").set_index(by)["bytes"]
        f = pd.DataFrame({"bytes_a": ga, "bytes_b": gb}).fillna(0).astype(np.int64)
        f["delta"] = f["bytes_b"] - f["bytes_a"]
        f.index.name = by
        f = f.reset_index()
        f.insert(0, "device", dev_a)
        frames.append(f.sort_values("delta", key=np.abs, ascending=False, kind="stable"))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["device", by, "bytes_a", "bytes_b", "delta"])


def _by_op(a, b, pairs) -> pd.DataFrame:
    def per_op(t, devs):
        blk = t.blocks[t.blocks["device"].isin(devs)]
        g = blk.groupby(blk["op"].astype(str).replace("", "(unknown)"))["size"]
        return pd.DataFrame({"allocs": g.size(), "bytes": g.sum()})
    fa = per_op(a, [p[0] for p in pairs])
    fb = per_op(b, [p[1] for p in pairs])
    f = fa.join(fb, how="outer", suffixes=("_a", "_b")).fillna(0).astype(np.int64)
    f["delta_bytes"] = f["bytes_b"] - f["bytes_a"]
    f.index.name = "op"
    return f.reset_index().sort_values("delta_bytes", key=np.abs, ascending=False, kind="stable").reset_index(drop=True)


def _op_counts(a, b) -> tuple[pd.DataFrame | None, list[str]]:
    """Ops executed per name in A and B (largest changes first), when both traces record ops."""
    if len(a.ops) == 0 or len(b.ops) == 0:
        missing = [n for n, t in (("A", a), ("B", b)) if len(t.ops) == 0]
        who = "neither trace records" if len(missing) == 2 else f"{missing[0]} records no"
        return None, [f"ops executed: {who} ops (only allocating ops are compared)"]
    ca = a.ops["name"].astype(str).value_counts()
    cb = b.ops["name"].astype(str).value_counts()
    f = pd.DataFrame({"count_a": ca, "count_b": cb}).fillna(0).astype(np.int64)
    f["delta"] = f["count_b"] - f["count_a"]
    f.index.name = "op"
    f = f.reset_index()
    order = np.lexsort((f["op"].to_numpy(), -f["delta"].abs().to_numpy()))
    return f.iloc[order].reset_index(drop=True), []


def _iterations(a, b) -> tuple[dict, list[str]]:
    from memlens.analysis.iterations import split_iterations
    from memlens.analysis.stability import iteration_stats

    ia, ib = split_iterations(a), split_iterations(b)
    src_a, src_b = str(ia["source"].iloc[0]), str(ib["source"].iloc[0])
    out = {"count_a": int(len(ia)) if src_a != "none" else 0, "count_b": int(len(ib)) if src_b != "none" else 0,
           "source_a": src_a, "source_b": src_b, "start_a_ns": int(ia["start_ns"].iloc[0]),
           "start_b_ns": int(ib["start_ns"].iloc[0])}
    if src_a == "none" or src_b == "none":
        which = "A" if src_a == "none" else "B"
        return out, [f"iterations: {which} has no iterations (no markers, no optimizer steps, no repeating "
                     "allocation pattern), so runs are aligned at their start"]
    sa, sb = iteration_stats(a, ia), iteration_stats(b, ib)
    n = min(len(sa), len(sb))
    cols = ["duration_ns", "allocations", "allocated_bytes", "peak_live_bytes"]
    table = pd.DataFrame({"iteration": np.arange(n)})
    for c in cols:
        table[f"{c}_a"] = sa[c].to_numpy()[:n]
        table[f"{c}_b"] = sb[c].to_numpy()[:n]
    out.update(table=table, median_peak_a=float(sa["peak_live_bytes"].median()),
               median_peak_b=float(sb["peak_live_bytes"].median()),
               median_duration_a_ns=float(sa["duration_ns"].median()),
               median_duration_b_ns=float(sb["duration_ns"].median()))
    return out, []


def _ati(a, b) -> tuple[dict | None, list[str]]:
    if not (a.has_accesses and b.has_accesses):
        missing = [n for n, t in (("A", a), ("B", b)) if not t.has_accesses]
        who = "neither trace records" if len(missing) == 2 else f"{missing[0]} records no"
        return None, [f"access time intervals (ATI): {who} accesses "
                      f"({a.metadata.get('source_kind', '?')} vs {b.metadata.get('source_kind', '?')})"]
    from memlens.analysis.ati import access_intervals, ati_by, ati_stats

    ia, ib = access_intervals(a), access_intervals(b)
    sa, sb = ati_stats(ia), ati_stats(ib)
    keys = ("count", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns")
    delta = {k: (None if sa[k] is None or sb[k] is None else sb[k] - sa[k]) for k in keys}
    cols = ["count", "p50_ns", "p90_ns"]
    by_a = ati_by(a, "category", intervals=ia)
    by_b = ati_by(b, "category", intervals=ib)
    by_a, by_b = (f.set_index("category") if "category" in f.columns else f for f in (by_a, by_b))
    by_category = by_a[cols].join(by_b[cols], how="outer", suffixes=("_a", "_b"))
    by_category.index.name = "category"
    return {"a": {k: sa[k] for k in keys}, "b": {k: sb[k] for k in keys}, "delta": delta,
            "fraction_below_a": sa["fraction_below"], "fraction_below_b": sb["fraction_below"],
            "by_category": by_category.reset_index()}, []


def diff(a, b, name_a: str | None = None, name_b: str | None = None) -> TraceDiff:
    """Compare trace `a` (before) with trace `b` (after); each a Trace or a path `memlens.load` reads."""
    from memlens.analysis.peak import peak_breakdown
    from memlens.io import load

    names = []
    traces = []
    for t, n in ((a, name_a), (b, name_b)):
        if not hasattr(t, "blocks"):
            n = n or str(t)
            t = load(t)
        names.append(n or str(t.metadata.get("source_path") or t.metadata.get("source_kind", "trace")))
        traces.append(t)
    a, b = traces
    pairs, notes = pair_devices(a, b)
    pa, pb = peak_breakdown(a), peak_breakdown(b)
    from memlens.reserved import reserved_curve

    rows = []
    for dev_a, dev_b in pairs:
        res_a, res_b = reserved_curve(a, dev_a), reserved_curve(b, dev_b)
        peak_a = pa[dev_a].peak_bytes if dev_a in pa else 0
        peak_b = pb[dev_b].peak_bytes if dev_b in pb else 0
        rows.append({"device_a": dev_a, "device_b": dev_b, "peak_a": peak_a, "peak_b": peak_b,
                     "delta": peak_b - peak_a, "ratio": (peak_b / peak_a) if peak_a else float("nan"),
                     "peak_ns_a": pa[dev_a].peak_ns if dev_a in pa else None,
                     "peak_ns_b": pb[dev_b].peak_ns if dev_b in pb else None,
                     "reserved_a": None if res_a is None else res_a.peak,
                     "reserved_b": None if res_b is None else res_b.peak})
    peak = pd.DataFrame(rows, columns=["device_a", "device_b", "peak_a", "peak_b", "delta", "ratio", "peak_ns_a",
                                       "peak_ns_b", "reserved_a", "reserved_b"])
    fields, field_notes = signature_fields(a, b)
    blocks, appeared, disappeared = match_blocks(a, b, pairs, fields)
    iterations, it_notes = _iterations(a, b)
    ati, ati_notes = _ati(a, b)
    op_counts, op_notes = _op_counts(a, b)
    from memlens.analysis.stack_diff import stack_diff, stack_note
    cannot = [n for n in notes if "only in" in n] + field_notes + op_notes + it_notes + ati_notes
    cannot += [n for n in [stack_note(a, b)] if n]
    notes = [n for n in notes if "only in" not in n]
    if "op" not in fields:
        cannot.append("live memory at the peak by op: the traces' op names cannot be matched")
    for by in ("category", "module"):
        if (a.blocks[by].astype(str).isin(["", "unknown"]).all() or
                b.blocks[by].astype(str).isin(["", "unknown"]).all()):
            cannot.append(f"live memory at the peak by {by}: at least one of the traces attributes no block to "
                          f"a {by}")
    return TraceDiff(name_a=names[0], name_b=names[1], source_a=a.metadata.get("source_kind", "unknown"),
                     source_b=b.metadata.get("source_kind", "unknown"), device_pairs=pairs, peak=peak,
                     at_peak={by: _at_peak(pa, pb, pairs, by) for by in GROUPS}, blocks=blocks, appeared=appeared,
                     disappeared=disappeared, by_op=_by_op(a, b, pairs), op_counts=op_counts,
                     iterations=iterations, ati=ati, stacks=stack_diff(a, b, pairs, pa, pb),
                     cannot_compare=cannot, notes=[n[0].upper() + n[1:] + "." for n in notes],
                     trace_a=a, trace_b=b)
