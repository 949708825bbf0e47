"""What the explorer shows for a click: which block is under the pointer, and everything known about it.

`hit_test` finds the selected block under a point of the blocks view (the raster cell that received the
click is the search window, so blocks thinner than a pixel can still be picked); `live_at` lists what is live
at a time for the stacked view. `block_details` gathers size, lifetime, attribution, stack, accesses and
ATIs of one block as plain data; `details_html` renders it with every trace string escaped.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.ati_intervals import access_op_edges
from memlens.units import format_bytes, format_ns
from memlens.viz.labels import safe
from memlens.widgets.geometry import BlockGeometry

MAX_ACCESS_ROWS = 25
MAX_FRAMES = 12
# the panel sits beside the 750 px timeline, so both fit a JupyterLab output area of 1,050 px (a 1,440 px
# window with the file browser open); long values (module paths, op names) wrap instead of being clipped, at
# a normal line height (an HTML widget inherits the 28 px height of one-line controls)
DETAILS_WIDTH_PX = 280
DETAILS_STYLE = ("white-space:normal;overflow-wrap:anywhere;line-height:1.35;font-size:12px;"
                 f"max-width:{DETAILS_WIDTH_PX - 20}px")
PROMPT_HTML = (f"<div class='memlens-details' style='{DETAILS_STYLE}'>"
               "<i>Click a block in the timeline for its details.</i></div>")


def hit_test(geom: BlockGeometry, mask: np.ndarray, axis: str, x: float, y: float,
             cell: tuple[float, float]) -> int | None:
    """Position (in `geom`) of the selected block under (x, y), or None.

    A block containing the point wins (the smallest one when several overlap); otherwise the block with
    the largest overlap with the `cell`-sized window around the point (raw axis units).
    """
    x0, x1 = geom.x0(axis), geom.x1(axis)
    y0, y1 = geom.y0, geom.y0 + geom.size
    inside = np.flatnonzero(mask & (x0 <= x) & (x1 > x) & (y0 <= y) & (y1 > y))
    if len(inside):
        return int(inside[np.argmin(geom.size[inside])])
    wx, wy = cell[0] / 2, cell[1] / 2
    ox = np.minimum(x1, x + wx) - np.maximum(x0, x - wx)
    oy = np.minimum(y1, y + wy) - np.maximum(y0, y - wy)
    near = np.flatnonzero(mask & (ox > 0) & (oy > 0))
    if len(near) == 0:
        return None
    return int(near[np.argmax(ox[near] * oy[near])])


def live_at(geom: BlockGeometry, mask: np.ndarray, axis: str, x: float, top: int = 15) -> pd.DataFrame:
    """The `top` largest selected blocks live at `x`, with their total: for clicks on the stacked view."""
    live = np.flatnonzero(mask & (geom.x0(axis) <= x) & (geom.x1(axis) > x))
    order = live[np.argsort(-geom.size[live], kind="stable")]
    out = pd.DataFrame({
        "pos": order[:top], "block_id": geom.block_id[order[:top]], "size": geom.size[order[:top]].astype(np.int64),
        "category": geom.category.names[geom.category.codes[order[:top]]],
        "module": geom.module.names[geom.module.codes[order[:top]]]})
    out.attrs["live_bytes"] = int(geom.size[live].sum())
    out.attrs["live_blocks"] = int(len(live))
    return out


def _stack(trace, stack_id) -> list[str]:
    """Python frames innermost first, C++ frames folded (`memlens.analysis.peak_cause.stack_lines`)."""
    from memlens.analysis.peak_cause import stack_lines
    return stack_lines(trace.stacks, stack_id, MAX_FRAMES)


def block_details(trace, geom: BlockGeometry, pos: int, intervals: pd.DataFrame | None = None) -> dict:
    """Everything about the block at geometry position `pos`: sizes in bytes, times in ns.

    Keys: the block's columns, ``lifetime_ns``, ``stack`` (frames, innermost first), ``accesses`` (a frame
    of t_ns (the recorder's stamp) / op_start_ns / op_end_ns (the op's edges, where its ATIs are measured) /
    op / is_write, in op-start order) and ``atis`` (this block's rows of `access_intervals`, if given).
    """
    row = trace.blocks.iloc[int(geom.rows[pos])]
    out = {c: (None if pd.isna(row[c]) else row[c].item() if hasattr(row[c], "item") else row[c])
           for c in ("block_id", "device", "addr", "size", "alloc_ns", "free_ns", "category", "op", "module",
                     "stream", "source", "allocated_before", "free_without_alloc", "stack_id")}
    out["lifetime_ns"] = float(geom.t1[pos] - geom.t0[pos])
    out["stack"] = _stack(trace, row["stack_id"])
    acc = trace.accesses[trace.accesses["block_id"].to_numpy() == out["block_id"]]
    op_start, op_end = access_op_edges(trace, acc["op_id"].to_numpy(np.int64), acc["t_ns"].to_numpy(np.int64))
    order = np.lexsort((acc["op_id"].to_numpy(np.int64), op_start))
    acc, op_start, op_end = acc.iloc[order], op_start[order], op_end[order]
    names = trace.ops.set_index("op_id")["name"] if len(trace.ops) else pd.Series(dtype=object)
    out["accesses"] = pd.DataFrame({"t_ns": acc["t_ns"].to_numpy(), "op_start_ns": op_start, "op_end_ns": op_end,
                                    "op": names.reindex(acc["op_id"].to_numpy()).fillna("").to_numpy(),
                                    "is_write": acc["is_write"].to_numpy()})
    if intervals is not None:
        out["atis"] = intervals[intervals["block_id"].to_numpy() == out["block_id"]]
    return out


def _row(label: str, value) -> str:
    return f"<tr><th style='text-align:left;padding-right:8px'>{safe(label)}</th><td>{safe(value)}</td></tr>"


def details_html(d: dict) -> str:
    """The details panel for `block_details` output (all trace text escaped)."""
    alloc = "before recording" if d.get("alloc_ns") is None else format_ns(d["alloc_ns"])
    free = "alive at end" if d.get("free_ns") is None else format_ns(d["free_ns"])
    rows = [_row("block", d["block_id"]), _row("size", f"{format_bytes(d['size'])} ({d['size']:,} bytes)"),
            _row("address", "unknown" if d.get("addr") is None else hex(int(d["addr"]))),
            _row("device / stream", f"{d['device']} / {d.get('stream')}"),
            _row("allocated", alloc), _row("freed", free), _row("lifetime", format_ns(d["lifetime_ns"])),
            _row("category", d.get("category") or "unknown"), _row("allocating op", d.get("op") or "(unknown)"),
            _row("module", d.get("module") or "(unknown)"), _row("seen by", d.get("source"))]
    parts = [f"<div class='memlens-details' data-block-id='{int(d['block_id'])}' style='{DETAILS_STYLE}'>",
             f"<b>Block {int(d['block_id'])}</b><table>{''.join(rows)}</table>"]
    if d.get("stack"):
        parts.append("<b>Stack</b><pre style='font-size:11px;margin:0'>" +
                     "\n".join(safe(f) for f in d["stack"]) + "</pre>")
    acc = d.get("accesses")
    if acc is not None and len(acc):
        writes = int(acc["is_write"].sum())
        parts.append(f"<b>Accesses</b>: {len(acc):,} ({writes:,} writes)<table style='font-size:11px'>")
        for r in acc.head(MAX_ACCESS_ROWS).itertuples(index=False):
            parts.append(f"<tr><td>{safe(format_ns(r.t_ns))}</td><td>{'W' if r.is_write else 'R'}</td>"
                         f"<td>{safe(r.op)}</td></tr>")
        parts.append("</table>" + ("<i>...</i>" if len(acc) > MAX_ACCESS_ROWS else ""))
    else:
        parts.append("<b>Accesses</b>: none recorded for this block")
    atis = d.get("atis")
    if atis is not None and len(atis):
        lengths = atis["length_ns"].to_numpy(dtype=np.float64)
        parts.append(f"<br><b>ATIs</b>: {len(atis)} intervals, longest {safe(format_ns(lengths.max()))}, "
                     f"median {safe(format_ns(float(np.median(lengths))))}<br><span style='font-size:11px'>" +
                     ", ".join(safe(format_ns(v)) for v in lengths[:MAX_ACCESS_ROWS]) + "</span>")
    parts.append("</div>")
    return "".join(parts)


def live_html(live: pd.DataFrame, x_label: str) -> str:
    """The details panel for a click on the stacked view: what is live there."""
    head = (f"<div class='memlens-details' style='{DETAILS_STYLE}'><b>Live at {safe(x_label)}</b>: {live.attrs['live_blocks']:,} blocks, "
            f"{safe(format_bytes(live.attrs['live_bytes']))}<table style='font-size:11px'>")
    rows = "".join(f"<tr><td>{int(r.block_id)}</td><td>{safe(format_bytes(int(r.size)))}</td>"
                   f"<td>{safe(r.category)}</td><td>{safe(r.module)}</td></tr>" for r in live.itertuples(index=False))
    return head + rows + "</table></div>"
