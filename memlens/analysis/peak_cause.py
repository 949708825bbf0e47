"""What caused the peak: one sentence with numbers, and the allocation sites (stacks) holding its bytes.

At the peak of a device (`memlens.analysis.peak`), the live blocks are split into those allocated in the
phase that holds the peak (`metadata["phases"]`, from a snapshot's annotations and frames) and those that
were already there. The largest group of the former by (category, allocating op) is what pushed memory
to its peak; the latter are what it sits on. Without phases, the groups are taken over all live blocks.

Allocation sites: a block's site is the innermost Python frame of its stack outside torch itself
("file.py:line function", the user's code), or its allocating op when the stack has no such frame, or
"(alive before recording)" / "(no stack)". `sites` groups bytes by site (and by full stack for hover text).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memlens.units import format_bytes, format_ns

TOP_SITES = 10
_ATEN_CALL = re.compile(r"^at::_ops::([A-Za-z0-9_]+)::call\b")
PHASE_WORDS = {"forward": "the forward pass", "backward": "the backward pass",
               "optimizer_step": "the optimizer step", "zero_grad": "zero_grad"}


def _is_torch(filename: str) -> bool:
    f = filename.replace("\\", "/")
    return "/torch/" in f or f.startswith("torch/")


def site_frames(stacks: pd.DataFrame | None) -> pd.DataFrame:
    """One row per stack_id with its site frame, the innermost Python frame outside torch: ``stack_id``,
    ``site`` (the label "file.py:line function"), ``filename``, ``line``, ``function``."""
    cols = ["stack_id", "site", "filename", "line", "function"]
    if stacks is None or len(stacks) == 0:
        return pd.DataFrame(columns=cols)
    st = stacks.sort_values(["stack_id", "depth"], kind="stable")
    files = st["filename"].astype(str)
    py = files.str.endswith(".py") & ~files.map(_is_torch)
    first = st[py.to_numpy()].groupby("stack_id", sort=True).head(1)
    base = first["filename"].astype(str).str.replace("\\", "/", regex=False).str.rsplit("/", n=1).str[-1]
    return pd.DataFrame({"stack_id": first["stack_id"].to_numpy(np.int64),
                         "site": (base + ":" + first["line"].astype(str) + " " + first["name"].astype(str)).to_numpy(),
                         "filename": first["filename"].astype(str).to_numpy(),
                         "line": first["line"].to_numpy(np.int64), "function": first["name"].astype(str).to_numpy()})


def stack_sites(stacks: pd.DataFrame | None) -> pd.Series:
    """stack_id -> "file.py:line function" of the innermost Python frame outside torch ("" when none)."""
    if stacks is None or len(stacks) == 0:
        return pd.Series(dtype=object)
    frames = site_frames(stacks)
    return pd.Series(frames["site"].to_numpy(), index=frames["stack_id"].to_numpy())


def stack_lines(stacks: pd.DataFrame | None, stack_id, max_frames: int = 12) -> list[str]:
    """A stack as lines to read: Python frames innermost first ("function (file.py:line)"), each run of C++
    frames (no .py file: the allocator, ATen, autograd engine, interpreter) folded into one line
    "... N C++ frames (outermost name)"; at most `max_frames` lines."""
    if stacks is None or stack_id is None or pd.isna(stack_id):
        return []
    frames = stacks[stacks["stack_id"] == int(stack_id)].sort_values("depth")
    out: list[str] = []
    folded: list[str] = []

    def flush():
        # a run of C++ frames: the first one (allocator, ATen) or one naming an ATen op / the autograd engine
        # is worth a line; interpreter glue between two Python frames is not
        if folded:
            ops = [m.group(1) for m in map(_ATEN_CALL.match, folded) if m]
            engine = any("autograd::Engine" in n for n in folded)
            if not out or ops or engine:
                what = (f"aten::{ops[-1]}" if ops else "autograd engine" if engine
                        else folded[-1].split("(")[0][:60])
                out.append(f"... {len(folded)} C++ frame{'s' if len(folded) > 1 else ''} ({what})")
            folded.clear()
    for name, filename, line in zip(frames["name"].astype(str), frames["filename"].astype(str), frames["line"]):
        if filename.endswith(".py"):
            flush()
            short = "/".join(filename.replace("\\", "/").split("/")[-3:])
            out.append(f"{name} ({short}:{int(line)})")
        else:
            folded.append(name)
    flush()
    if len(out) > max_frames:
        out = out[:max_frames - 1] + [f"... {len(out) - max_frames + 1} more"]
    return out


def block_sites(trace, blocks: pd.DataFrame | None = None) -> np.ndarray:
    """The allocation site label of each row of `blocks` (default: all of ``trace.blocks``)."""
    b = trace.blocks if blocks is None else blocks
    n = len(b)
    site = np.full(n, "", dtype=object)
    if "location" in b.columns:
        site[:] = b["location"].astype(str).to_numpy()
    sid = pd.array(b["stack_id"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    need = (site == "") & (sid >= 0)
    if need.any():
        labels = stack_sites(trace.stacks)
        if len(labels):
            site[need] = labels.reindex(sid[need]).fillna("").to_numpy(dtype=object)
    op = b["op"].astype(str).to_numpy()
    module = b["module"].astype(str).to_numpy()
    fill = site == ""
    with_op = fill & (op != "")
    site[with_op] = np.where(module[with_op] != "", module[with_op] + " " + op[with_op],
                             op[with_op] + " (no Python frame)")
    before = (site == "") & b["allocated_before"].to_numpy(dtype=bool)
    cat = b["category"].astype(str).to_numpy()
    site[before] = np.where(cat[before] == "unknown", "(alive before recording)",
                            "(alive before recording: " + cat[before].astype(object) + ")")
    site[site == ""] = "(no stack)"
    return site


def sites(trace, device: str | None = None, blocks: pd.DataFrame | None = None, by: str = "site") -> pd.DataFrame:
    """Bytes grouped by allocation site: ``site``, ``bytes``, ``blocks``, ``category`` (the one holding the
    most bytes there), ``op`` and ``stack_id`` (of the largest block, for its full stack). `blocks` limits it
    to some blocks (e.g. those live at the peak); `device` to one device. `by` "site" groups by the site label
    (one line of user code, whatever called it); "stack" by the whole stack (the same line reached through
    different callers is split; the label then ends with the stack id). Largest first."""
    if by not in ("site", "stack"):
        raise ValueError(f"by must be 'site' or 'stack', got {by!r}")
    b = trace.blocks if blocks is None else blocks
    if device is not None:
        b = b[b["device"] == device]
    if len(b) == 0:
        return pd.DataFrame(columns=["site", "bytes", "blocks", "category", "op", "stack_id"])
    label = block_sites(trace, b)
    if by == "stack":
        sid = pd.array(b["stack_id"], dtype="Int64")
        label = np.where(sid.isna(), label, label.astype(object) + " [stack " +
                         np.asarray(sid.fillna(-1), dtype=np.int64).astype(str).astype(object) + "]")
    df = pd.DataFrame({"site": label, "size": b["size"].to_numpy(np.int64),
                       "category": b["category"].astype(str).to_numpy(), "op": b["op"].astype(str).to_numpy(),
                       "stack_id": pd.array(b["stack_id"], dtype="Int64")})
    g = df.groupby("site", sort=False)
    out = pd.DataFrame({"bytes": g["size"].sum(), "blocks": g.size()})
    big = df.sort_values("size", ascending=False, kind="stable").groupby("site", sort=False).head(1).set_index("site")
    cat = df.groupby(["site", "category"], sort=False)["size"].sum().reset_index().sort_values(
        "size", ascending=False, kind="stable").groupby("site").head(1).set_index("site")["category"]
    out["category"] = cat
    out["op"] = big["op"]
    out["stack_id"] = big["stack_id"]
    out.index.name = "site"
    return out.sort_values(["bytes", "blocks"], ascending=False, kind="stable").reset_index()


@dataclass
class PeakCause:
    """Why a device peaks: ``allocated_bytes`` (live at the peak), ``reserved_bytes`` (peak reserved, None
    without allocator data), ``by_category`` ({category: bytes live at the peak}), ``phase`` (that holds the
    peak, "" when unknown), ``pushed`` (category, op, bytes of the group that pushed it there), ``cause``
    (the sentence) and ``top_sites`` ([{"site", "bytes"}], largest first)."""

    device: str
    allocated_bytes: int
    reserved_bytes: int | None
    peak_ns: int
    by_category: dict[str, int]
    phase: str
    pushed: dict
    cause: str
    top_sites: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The ``memlens info --json`` form."""
        return {"allocated_bytes": self.allocated_bytes, "reserved_bytes": self.reserved_bytes,
                "by_category": dict(self.by_category), "cause": self.cause, "phase": self.phase,
                "peak_ns": self.peak_ns, "top_sites": list(self.top_sites)}


def _phase_of(trace, t_ns: int) -> dict | None:
    phases = [p for p in trace.metadata.get("phases") or [] if p.get("name") in PHASE_WORDS]
    hit = [p for p in phases if p["start_ns"] <= t_ns <= p["end_ns"]]
    return max(hit, key=lambda p: p["start_ns"]) if hit else None


def _group_label(category: str, op: str) -> str:
    what = {"optimizer_state": "optimizer state", "temporary": "temporaries", "activation": "activations",
            "gradient": "gradients", "parameter": "parameters", "workspace": "workspaces", "kv_cache": "KV caches",
            "input": "inputs", "unknown": "blocks the source does not describe"}.get(category, category.replace("_", " "))
    return what + (f" created by {op}" if op else "")


def peak_cause(trace, top_sites: int = TOP_SITES) -> dict[str, PeakCause]:
    """{device: PeakCause} for every device with allocations (see the module docstring)."""
    from memlens.analysis.peak import live_at, peak_breakdown
    from memlens.reserved import reserved_curve

    from memlens.analysis.iterations import split_iterations

    iterations = None if trace.metadata.get("phases") else split_iterations(trace)
    out = {}
    for dev, pb in peak_breakdown(trace, largest=0).items():
        live = live_at(trace, dev, pb.peak_seq, pb.peak_ns)
        res = reserved_curve(trace, dev)
        by_cat = {str(r.category): int(r.bytes) for r in pb.by_category.itertuples(index=False)}
        phase = _phase_of(trace, pb.peak_ns)
        start, where = None, f"at {format_ns(pb.peak_ns)}"
        if phase:
            start, where = phase["start_ns"], f"in {PHASE_WORDS[phase['name']]}"
        elif iterations is not None and str(iterations["source"].iloc[0]) != "none":
            hit = iterations[(iterations["start_ns"] <= pb.peak_ns) & (iterations["end_ns"] >= pb.peak_ns)]
            if len(hit):
                # at the instant one iteration ends and the next starts, the peak is in the one it starts
                # (iterations run from their start to the next one's), as `_phase_of` takes the later phase
                hit = hit.sort_values("start_ns", kind="stable").iloc[-1]
                start = int(hit["start_ns"])
                where = f"in iteration {int(hit['iteration'])} (at {format_ns(pb.peak_ns)})"
        alloc = live["alloc_ns"].to_numpy("float64", na_value=-np.inf)
        # what the phase / iteration added, or without either what was allocated during the recording
        new = alloc >= start if start is not None else ~live["allocated_before"].to_numpy(dtype=bool)
        fresh = live[new].assign(op=live.loc[new, "op"].astype(str),
                                 category=live.loc[new, "category"].astype(str))
        groups = fresh.groupby("category")["size"].sum().sort_values(ascending=False, kind="stable")
        pushed = {}
        if len(groups):
            cat, nbytes = groups.index[0], int(groups.iloc[0])
            ops = fresh[fresh["category"] == cat].groupby("op")["size"].sum().sort_values(ascending=False)
            op = str(ops.index[0]) if len(ops) and ops.index[0] else ""
            pushed = {"category": cat, "op": op, "bytes": nbytes,
                      "op_bytes": int(ops.iloc[0]) if len(ops) else 0}
        sentence = f"The peak of {dev} ({format_bytes(pb.peak_bytes)}) is reached {where}"
        if pushed:
            made = (f", {format_bytes(pushed['op_bytes'])} of it by {pushed['op']}" if pushed["op"] and
                    pushed["op_bytes"] < pushed["bytes"] else f" by {pushed['op']}" if pushed["op"] else "")
            since = "in it" if start is not None else "during the recording"
            sentence += (f": {_group_label(pushed['category'], '')} allocated {since} "
                         f"({format_bytes(pushed['bytes'])}{made})")
            rest = dict(by_cat)
            rest[pushed["category"]] = rest.get(pushed["category"], 0) - pushed["bytes"]
            others = [(c, v) for c, v in sorted(rest.items(), key=lambda kv: -kv[1]) if v > 0]
            if others:
                sentence += " on top of " + ", ".join(
                    (f"{format_bytes(v)} already live" if c == pushed["category"] == "unknown" else
                     f"{_group_label(c, '')} ({format_bytes(v)})") for c, v in others[:4])
                if len(others) > 4:
                    sentence += f" and {format_bytes(sum(v for _, v in others[4:]))} more"
        elif by_cat:  # nothing allocated during the recording is live at the peak (e.g. a final state only)
            sentence += ": everything live then was allocated before recording began (" + ", ".join(
                f"{_group_label(c, '')} {format_bytes(v)}" for c, v in sorted(by_cat.items(), key=lambda kv: -kv[1])[:4]) + ")"
        sentence += "."
        if res is not None:
            sentence += f" The allocator had reserved {format_bytes(res.peak)} at most."
        top = sites(trace, blocks=live).head(top_sites)
        out[dev] = PeakCause(device=dev, allocated_bytes=int(pb.peak_bytes),
                             reserved_bytes=None if res is None else int(res.peak), peak_ns=int(pb.peak_ns),
                             by_category=by_cat, phase=phase["name"] if phase else "", pushed=pushed,
                             cause=sentence,
                             top_sites=[{"site": str(r.site), "bytes": int(r.bytes)} for r in top.itertuples()])
    return out
