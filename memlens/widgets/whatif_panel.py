"""The explorer's what-if panel: the recorded run next to other allocator settings and a static plan.

`whatif_table` is plain computation (tests call it): one row per scenario with its peak in bytes and the
ratio to the recorded peak of live bytes. Scenarios:
- ``recorded (live)``: the trace's peak of live block bytes (`Trace.peak_live_bytes`);
- ``recorded (reserved)``: what the real allocator reserved, when the trace says so (snapshots);
- the caching allocator under the given ``PYTORCH_CUDA_ALLOC_CONF`` (and any other allocator), replayed by
  `memlens.simulate.compare` (peak reserved);
- ``static plan``: the arena height of `memlens.plan.plan` (offsets fixed ahead of time, MemoMalloc-style),
  whose lower bound is the peak of live bytes;
- ``swapping``: the peak of live bytes after `memlens.swap.plan_swaps` at the given link (idle blocks copied
  to the host and prefetched back), and the infinite-bandwidth bound; only for traces with accesses. The
  plan is kept in ``attrs["swap_plan"]``; `swap_figures` draws it (`memlens.viz.swap`).
"""
from __future__ import annotations

import pandas as pd

from memlens.units import format_bytes
from memlens.viz.labels import safe

DEFAULT_CONFIGS = {"caching (recorded settings)": ("caching", None),
                   "caching, expandable_segments": ("caching", "expandable_segments:True")}


def whatif_table(trace, device: str, configs: dict | None = None, plan_seconds: float = 2.0,
                 bandwidth="pcie4_x16") -> pd.DataFrame:
    """Scenarios for `device`: columns scenario, peak_bytes, vs_recorded (peak / recorded peak live), detail.

    `configs` as `memlens.simulate.compare` takes them; `plan_seconds` bounds the static planner's search;
    `bandwidth` is the host link for swapping (a preset name, '25GB/s' or a `BandwidthModel`).
    """
    from memlens.plan import plan
    from memlens.simulate import compare
    from memlens.swap import plan_swaps
    from memlens.units import format_ns

    live_peak = int(trace.peak_live_bytes().get(device, 0))
    rows = [{"scenario": "recorded (live)", "peak_bytes": live_peak, "detail": "peak of live block bytes"}]
    table = compare(trace, configs or DEFAULT_CONFIGS)
    table = table[table["device"] == device]
    for r in table.itertuples(index=False):
        if r.config == "recorded":
            rows.append({"scenario": "recorded (reserved)", "peak_bytes": int(r.peak_reserved),
                         "detail": "what the real allocator reserved"})
            continue
        rows.append({"scenario": r.config, "peak_bytes": int(r.peak_reserved),
                     "detail": f"{r.allocator} {r.conf}".strip() + f"; {int(r.segment_allocs)} segment allocs"})
    result = plan(trace, device=device, time_limit_s=plan_seconds)
    rows.append({"scenario": "static plan", "peak_bytes": int(result.height),
                 "detail": f"{result.algorithm}, {result.ratio:.3f}x max-live"
                           + (" (optimal)" if result.optimal else "")})
    if trace.has_accesses:
        from memlens.swap.planner import size_floor
        swaps = plan_swaps(trace, bandwidth=bandwidth, device=device, min_size=size_floor(result.max_live))
        rows.append({"scenario": "swapping", "peak_bytes": int(swaps.peak_after),
                     "detail": f"{len(swaps.swaps)} swaps of blocks >= {format_bytes(swaps.min_size)} over "
                               f"{swaps.bandwidth_text}, {format_bytes(swaps.transfer_bytes)} moved, "
                               f"stall {format_ns(swaps.stall_ns)}"})
        rows.append({"scenario": "swapping, infinite bandwidth", "peak_bytes": int(swaps.infinite_bandwidth_peak),
                     "detail": "every ATI swapped for free: the bound"})
    out = pd.DataFrame(rows)
    out.attrs["swap_plan"] = swaps if trace.has_accesses else None
    out["vs_recorded"] = out["peak_bytes"] / live_peak if live_peak else float("nan")
    return out


def whatif_traces(table: pd.DataFrame) -> list[dict]:
    """One horizontal bar per scenario (bytes)."""
    return [dict(type="bar", orientation="h", y=[safe(s) for s in table["scenario"]],
                 x=table["peak_bytes"].to_numpy(), marker=dict(color="#4C78A8"),
                 text=[format_bytes(v) for v in table["peak_bytes"]], textposition="auto",
                 hovertemplate="%{y}: %{x:,} bytes<extra></extra>")]


def whatif_html(table: pd.DataFrame) -> str:
    """The scenarios as an HTML table (escaped)."""
    rows = "".join(
        f"<tr><td>{safe(r.scenario)}</td><td style='text-align:right'>{safe(format_bytes(r.peak_bytes))}</td>"
        f"<td style='text-align:right'>{r.vs_recorded:.3f}x</td><td>{safe(r.detail)}</td></tr>"
        for r in table.itertuples(index=False))
    return ("<table class='memlens-whatif'><tr><th>scenario</th><th>peak</th><th>vs recorded live</th>"
            f"<th></th></tr>{rows}</table>")


def swap_figures(table: pd.DataFrame) -> list:
    """The swap plan behind a `whatif_table` as figures: load before/after and the copy timeline (none
    without a plan or swaps)."""
    from memlens.viz.swap import swap_load_curves, swap_timeline
    plan = table.attrs.get("swap_plan")
    if plan is None or len(plan.swaps) == 0:
        return []
    figs = [swap_load_curves(plan), swap_timeline(plan)]
    for fig in figs:
        fig.update_layout(width=640, height=300, title_font_size=12)
    return figs
