"""One what-if comparison: how much device memory the same run needs under each way of managing it.

For every device, from the most memory to the least:

1. ``recorded reserved``: what PyTorch's caching allocator reserved in the recording (traces with segment
   events, e.g. CUDA snapshots);
2. ``caching allocator``: the simulated CUDACachingAllocator's peak reserved, under the recorded settings
   and under each `conf_variants` entry (``memlens.simulate``);
3. ``static plan``: the height of the best static offset plan (``memlens.plan``);
4. ``max-live``: the largest sum of live block sizes, the bound of any plan that keeps every block resident;
5. ``swapping``: the peak after swapping idle blocks at the stated bandwidth (``memlens.swap``);
6. ``infinite bandwidth``: the peak if every ATI (idle interval between two accesses) could be swapped for
   free.

A stage that cannot be computed for this trace stays in the table with no bytes and a note saying why.
"""
from __future__ import annotations

import math

import pandas as pd

from memlens.errors import InputError
from memlens.units import format_bytes, format_ns

STAGES = ("recorded reserved", "caching allocator", "static plan", "max-live", "swapping", "infinite bandwidth")
COLUMNS = ("device", "stage", "variant", "bytes", "ratio_to_max_live", "note")


def _row(device, stage, variant, value, note, max_live):
    ratio = (value / max_live) if value is not None and max_live else math.nan
    return {"device": device, "stage": stage, "variant": variant,
            "bytes": pd.NA if value is None else int(value), "ratio_to_max_live": ratio, "note": note}


def _allocator_rows(trace, device, conf_variants, max_live) -> list[dict]:
    try:
        from memlens.simulate import simulate
    except ImportError:
        return [_row(device, "caching allocator", "recorded settings", None,
                     "the allocator simulator is not available in this installation", max_live)]
    rows = []
    variants = [("recorded settings", None)] + [(str(c), c) for c in (conf_variants or [])]
    for name, conf in variants:
        try:
            res = simulate(trace, allocator="caching", conf=conf, device=device).devices[device]
        except InputError as exc:
            rows.append(_row(device, "caching allocator", name, None, f"cannot simulate: {exc}", max_live))
            continue
        if conf is None and res.recorded and res.recorded.get("peak_reserved") is not None:
            rows.insert(0, _row(device, "recorded reserved", "recording", res.recorded["peak_reserved"],
                                "peak reserved in the recording's segment events", max_live))
        note = f"{res.initial_state} start" + (f"; {len(res.ooms)} OOMs" if res.ooms else "")
        rows.append(_row(device, "caching allocator", name, res.peak_reserved, note, max_live))
    if not any(r["stage"] == "recorded reserved" for r in rows):
        rows.insert(0, _row(device, "recorded reserved", "recording", None,
                            "the trace has no allocator segment events (only CUDA snapshots record them)",
                            max_live))
    return rows


def _swap_rows(trace, device, bandwidth, limit, max_live, plans: dict | None = None) -> list[dict]:
    from memlens.analysis.bandwidth import BandwidthModel
    from memlens.swap import plan_swaps

    model = bandwidth if isinstance(bandwidth, BandwidthModel) else BandwidthModel.parse(bandwidth or "pcie4")
    if not trace.has_accesses:
        why = ("needs per-access data, which this trace does not have (record with memlens.record); "
               "lifetimes alone cannot tell when a block is idle")
        return [_row(device, "swapping", model.describe(), None, why, max_live),
                _row(device, "infinite bandwidth", "", None, why, max_live)]
    from memlens.swap.planner import DEFAULT_MIN_SIZE, PEAK_SHARE_FLOOR, size_floor

    sp = plan_swaps(trace, bandwidth=model, limit=limit, device=device, min_size=size_floor(max_live))
    if plans is not None:
        plans[device] = sp
    floor = (f" (1/{PEAK_SHARE_FLOOR} of the peak: its blocks are under the {format_bytes(DEFAULT_MIN_SIZE)} "
             "floor of large models)" if sp.min_size < DEFAULT_MIN_SIZE else "")
    note = (f"{len(sp.swaps)} swaps ({sp.priority}) of blocks >= {format_bytes(sp.min_size)}{floor}, "
            f"{format_bytes(sp.transfer_bytes)} copied, stall {format_ns(sp.stall_ns)}")
    return [_row(device, "swapping", model.describe(), sp.peak_after, note, max_live),
            _row(device, "infinite bandwidth", "", sp.infinite_bandwidth_peak,
                 "every ATI (access->access interval) swapped at no cost", max_live)]


def compare(trace, bandwidth="pcie4", conf_variants=None, time_limit_s: float = 2.0, limit=None,
            devices: list[str] | None = None) -> pd.DataFrame:
    """The what-if table: one row per (device, stage[, variant]); bytes and ratio to max-live.

    `bandwidth`: a BandwidthModel or text ('25GB/s', 'pcie4'); `conf_variants`: extra
    PYTORCH_CUDA_ALLOC_CONF settings to simulate (e.g. ["expandable_segments:True"]); `time_limit_s`: search
    time of the static planner per device; `limit`: memory limit for the swap planner (None: minimise).
    The swap plans themselves (`memlens.swap.SwapPlan`, for `memlens.viz.swap_load_curves` and friends)
    are in ``attrs["swap_plans"]`` ({device: plan}).
    """
    from memlens.plan import plan

    if isinstance(trace, str) or hasattr(trace, "__fspath__"):
        from memlens.io import load
        trace = load(trace)
    rows: list[dict] = []
    plans: dict = {}
    for device in devices or trace.devices:
        pr = plan(trace, time_limit_s=time_limit_s, device=device)
        max_live = pr.max_live
        rows += _allocator_rows(trace, device, conf_variants, max_live)
        rows.append(_row(device, "static plan", pr.algorithm, pr.height,
                         "proven optimal" if pr.optimal else f"lower bound {format_bytes(pr.lower_bound)}", max_live))
        rows.append(_row(device, "max-live", "", max_live, "bound of any plan keeping every block resident",
                         max_live))
        rows += _swap_rows(trace, device, bandwidth, limit, max_live, plans)
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    out["bytes"] = out["bytes"].astype("Int64")
    out.attrs["swap_plans"] = plans
    return out


def whatif_figure(df: pd.DataFrame, title: str = "What the same run needs under each memory policy"):
    """A plotly bar chart of `compare`'s table: one horizontal bar per stage, one panel per device."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from memlens.units import format_bytes

    devices = list(dict.fromkeys(df["device"]))
    fig = make_subplots(rows=len(devices), cols=1, subplot_titles=devices, vertical_spacing=0.12)
    for i, dev in enumerate(devices, start=1):
        d = df[df["device"] == dev]
        labels = [f"{s} ({v})" if v and s in ("caching allocator", "swapping") else s
                  for s, v in zip(d["stage"], d["variant"])]
        values = [0 if pd.isna(b) else int(b) for b in d["bytes"]]
        text = [("n/a: " + n[:60]) if pd.isna(b) else f"{format_bytes(b)} ({r:.3f}x)"
                for b, r, n in zip(d["bytes"], d["ratio_to_max_live"], d["note"])]
        fig.add_trace(go.Bar(y=labels, x=values, orientation="h", text=text, textposition="auto",
                             hovertext=list(d["note"]), showlegend=False), row=i, col=1)
        fig.update_yaxes(autorange="reversed", row=i, col=1)
        fig.update_xaxes(title_text="bytes", row=i, col=1)
    fig.update_layout(title=title, height=220 + 260 * len(devices), margin={"l": 220})
    return fig
