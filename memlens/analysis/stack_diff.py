"""Which call stacks hold memory at A's peak and at B's: the stacks that appear, vanish, grow or shrink.

Beside the diff by category / module / op (`memlens.analysis.diff`), which says *what kind* of memory
changed, this says *which code* holds it. A block's stack key is its Python frames, innermost first, as
"function (dir/sub/file.py:line)" joined by " < ", each file named by the last three parts of its path (so the
same code run from two checkouts, or on two machines, matches) and C++ frames left out (their names carry
addresses and templates that differ between builds of the same code); a block without a Python frame keys on its allocation site label
(`memlens.analysis.peak_cause.block_sites`: the allocating op, "(no stack)", "(alive before recording)").
Stacks are matched between the traces by that key, so the same code in two runs pairs up even though the
traces number their stacks differently. Bytes are summed over the blocks live at each device's peak.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.units import format_bytes

COLUMNS = ["device", "change", "site", "stack", "bytes_a", "bytes_b", "delta", "blocks_a", "blocks_b"]
JOIN = " < "  # between frames: "inner (f.py:3) < outer (f.py:9)" reads as "called from"


def stack_keys(stacks: pd.DataFrame | None) -> pd.Series:
    """stack_id -> its Python frames, innermost first, "name (dir/sub/file.py:line)" (the path's last three
    parts) joined by " < " ("" when the stack has no Python frame)."""
    if stacks is None or len(stacks) == 0:
        return pd.Series(dtype=object)
    st = stacks.sort_values(["stack_id", "depth"], kind="stable")
    py = st[st["filename"].astype(str).str.endswith(".py").to_numpy()]
    tail = py["filename"].astype(str).str.replace("\\", "/", regex=False).str.split("/").str[-3:].str.join("/")
    frame = py["name"].astype(str) + " (" + tail + ":" + py["line"].astype(str) + ")"
    return frame.groupby(py["stack_id"].to_numpy(), sort=True).agg(JOIN.join)


def _by_stack(trace, live: pd.DataFrame) -> pd.DataFrame:
    """Bytes and blocks per stack key among `live` blocks, with the site label of the key's largest block."""
    from memlens.analysis.peak_cause import block_sites

    if len(live) == 0:
        return pd.DataFrame(columns=["site", "bytes", "blocks"])
    site = block_sites(trace, live)
    keys = stack_keys(getattr(trace, "stacks", None))
    sid = pd.array(live["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    key = keys.reindex(sid).fillna("").to_numpy(dtype=object) if len(keys) else np.full(len(live), "", object)
    key = np.where(key == "", site, key)
    df = pd.DataFrame({"stack": key, "site": site, "size": live["size"].to_numpy(np.int64)})
    g = df.groupby("stack", sort=False)
    first = df.sort_values("size", ascending=False, kind="stable").groupby("stack", sort=False).head(1)
    return pd.DataFrame({"bytes": g["size"].sum(), "blocks": g.size(),
                         "site": first.set_index("stack")["site"]})


def stack_diff(a, b, pairs, peaks_a: dict, peaks_b: dict) -> pd.DataFrame:
    """Stacks whose bytes live at the peak differ between `a` and `b`: one row per (device pair, stack) with
    ``change`` ("appeared": only at B's peak, "vanished": only at A's, "grew", "shrank"), ``site`` (the
    innermost user frame, as in the sites table), ``stack`` (the key, see the module docstring), ``bytes_a``,
    ``bytes_b``, ``delta`` (b - a, bytes) and ``blocks_a`` / ``blocks_b``; largest change first. `peaks_a` /
    `peaks_b` are {device: `PeakBreakdown`} of the two traces; `pairs` the (device of A, device of B) compared.
    Stacks holding the same bytes at both peaks are left out; with no stack in either trace, nothing (every
    key would be an allocation site, which the diff by op already compares)."""
    from memlens.analysis.peak import live_at

    if not (has_stacks(a) or has_stacks(b)):
        return pd.DataFrame(columns=COLUMNS)
    frames = []
    for dev_a, dev_b in pairs:
        if dev_a not in peaks_a or dev_b not in peaks_b:
            continue
        pa, pb = peaks_a[dev_a], peaks_b[dev_b]
        ga = _by_stack(a, live_at(a, dev_a, pa.peak_seq, pa.peak_ns))
        gb = _by_stack(b, live_at(b, dev_b, pb.peak_seq, pb.peak_ns))
        f = pd.DataFrame({"bytes_a": ga["bytes"], "bytes_b": gb["bytes"], "blocks_a": ga["blocks"],
                          "blocks_b": gb["blocks"]}).fillna(0).astype(np.int64)
        f["site"] = gb["site"].combine_first(ga["site"]).reindex(f.index)
        f["delta"] = f["bytes_b"] - f["bytes_a"]
        f = f[f["delta"] != 0]
        f["change"] = np.select([f["bytes_a"] == 0, f["bytes_b"] == 0, f["delta"] > 0],
                                ["appeared", "vanished", "grew"], "shrank")
        f.index.name = "stack"
        f = f.reset_index()
        f["device"] = dev_a if dev_a == dev_b else f"{dev_a}/{dev_b}"
        order = np.lexsort((f["stack"].to_numpy(dtype=str), -f["delta"].abs().to_numpy()))
        frames.append(f.iloc[order][COLUMNS])
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(frames, ignore_index=True)


def stack_sentence(frame: pd.DataFrame) -> str | None:
    """One sentence on the stack diff: how many stacks appear / vanish / grow / shrink and their bytes, and
    the largest change; None when no stack changed."""
    if frame is None or len(frame) == 0:
        return None
    parts = []
    for change in ("appeared", "vanished", "grew", "shrank"):
        rows = frame[frame["change"] == change]
        if len(rows):
            moved = int(rows["delta"].abs().sum())
            parts.append(f"{len(rows):,} {change} ({format_bytes(moved)})")
    top = frame.iloc[0]
    return (f"At the peak, stacks (Python frames) that changed: {', '.join(parts)}; the largest: {top['site']} "
            f"{format_bytes(int(top['bytes_a']))} -> {format_bytes(int(top['bytes_b']))}.")


def has_stacks(trace) -> bool:
    """Whether `trace` records any call stack."""
    return getattr(trace, "stacks", None) is not None and len(trace.stacks) > 0


def stack_note(a, b) -> str | None:
    """Why the stack diff says little, when one trace records no stacks; else None (when neither does, the
    diff has no stack rows and says nothing about stacks)."""
    missing = [n for n, t in (("A", a), ("B", b)) if not has_stacks(t)]
    if len(missing) != 1:
        return None
    return (f"stacks at the peak: {missing[0]} records no call stacks, so its blocks are keyed by their allocation "
            "site (op or '(no stack)') instead")
