"""Several allocator configurations side by side on one trace (a table, and a plotly figure)."""
from __future__ import annotations

import os
from typing import Any, Mapping

import pandas as pd

from memlens.errors import InputError

_DEFAULT_CONFIGS = {
    "recorded settings": ("caching", None),
    "expandable_segments": ("caching", "expandable_segments:True"),
    "max_split_size_mb:128": ("caching", "max_split_size_mb:128"),
    "no caching (cudaMalloc)": ("malloc", None),
}


def _normalise(spec: Any, name: str) -> tuple[str, Any]:
    """(allocator, conf) from a tuple, an allocator name, a conf string or a conf dict."""
    from memlens.simulate.engine import ALLOCATORS
    if isinstance(spec, tuple) and len(spec) == 2:
        return spec[0], spec[1]
    if isinstance(spec, str) and spec in ALLOCATORS:
        return spec, None
    if spec is None or isinstance(spec, (str, Mapping)):
        return "caching", spec
    raise InputError(f"configuration '{name}': give (allocator, conf), an allocator name or a conf string")


def compare(trace, configs: Mapping[str, Any] | None = None, capacity=None,
            initial_state: str = "auto") -> pd.DataFrame:
    """Simulate each named configuration and return one row per (configuration, device).

    `configs` maps a name to ``(allocator, conf)`` (conf: a ``PYTORCH_CUDA_ALLOC_CONF`` string, dict or
    None for the recorded settings), to an allocator name, or to a conf string for the caching allocator.
    Default: recorded settings, expandable segments, ``max_split_size_mb:128`` and no caching.
    When the trace records what the real allocator reserved, a ``recorded`` row comes first.
    Columns (bytes): peak_reserved, peak_allocated, final_reserved, peak_fragmentation, segment_allocs
    (count), ooms (count), plus ``vs_first`` (peak_reserved relative to the first configuration).
    The `SimulationResult` of each configuration is in ``df.attrs["results"]``.
    """
    from memlens.simulate.engine import simulate
    if isinstance(trace, (str, os.PathLike)):
        from memlens.io import load
        trace = load(trace)
    configs = dict(configs or _DEFAULT_CONFIGS)
    if not configs:
        raise InputError("compare() needs at least one configuration")
    rows, results = [], {}
    for name, spec in configs.items():
        allocator, conf = _normalise(spec, name)
        result = simulate(trace, allocator=allocator, conf=conf, capacity=capacity, initial_state=initial_state)
        results[name] = result
        for dev, r in result.devices.items():
            if r.recorded is not None and not any(x["config"] == "recorded" and x["device"] == dev for x in rows):
                rec = r.recorded
                rows.append({"config": "recorded", "device": dev, "allocator": "recorded", "conf": "",
                             "peak_reserved": rec["peak_reserved"], "peak_allocated": pd.NA,
                             "final_reserved": rec["final_reserved"], "peak_fragmentation": pd.NA,
                             "segment_allocs": len(rec["segment_allocs"]), "ooms": pd.NA})
            rows.append({"config": name, "device": dev, "allocator": allocator, "conf": r.conf,
                         "peak_reserved": r.peak_reserved, "peak_allocated": r.peak_allocated,
                         "final_reserved": r.final_reserved, "peak_fragmentation": r.peak_fragmentation,
                         "segment_allocs": len(r.segment_allocs), "ooms": len(r.ooms)})
    df = pd.DataFrame(rows)
    first = df[df["config"] != "recorded"].groupby("device")["peak_reserved"].first()
    df["vs_first"] = df["peak_reserved"].astype(float) / df["device"].map(first).astype(float)
    df.attrs["results"] = results
    return df


def compare_figure(table_or_results, device: str | None = None, title: str | None = None):
    """A plotly figure of reserved bytes over the request sequence, one line per configuration.

    Accepts the DataFrame `compare` returns or a dict name -> `SimulationResult`. The x axis is the
    replay step (trace order), so configurations with different event times line up.
    """
    import plotly.graph_objects as go

    results = table_or_results.attrs.get("results") if isinstance(table_or_results, pd.DataFrame) \
        else table_or_results
    if not results:
        raise InputError("compare_figure needs compare()'s table or a dict of SimulationResult")
    fig = go.Figure()
    for name, result in results.items():
        devices = [device] if device else list(result.devices)
        for dev in devices:
            r = result.devices.get(dev)
            if r is None:
                continue
            tl = r.timeline
            label = name if len(devices) == 1 else f"{name} ({dev})"
            fig.add_trace(go.Scattergl(x=list(range(len(tl))), y=tl["reserved"] / 2**30, mode="lines",
                                       name=label,
                                       hovertemplate="step %{x}<br>%{y:.3f} GiB reserved<extra>" + label +
                                       "</extra>"))
    fig.update_layout(title=title or "Reserved memory by allocator configuration",
                      xaxis_title="request (trace order)", yaxis_title="reserved (GiB)",
                      template="plotly_white", legend_title="configuration")
    return fig
