"""How the explorer widget scales: time to build the figure data for 1 million blocks, and bytes sent.

    .venv/bin/python benchmarks/widget_scale.py [--blocks 1000000] [--accesses-per-block 3]

A synthetic trace (seeded) with `--blocks` blocks on one device: allocations spread over 10 s, lognormal
sizes (median 64 KiB) and lifetimes, each block reusing one of 20,000 address slots so that blocks never
overlap in address while alive (as with a real allocator), and ~3 accesses per block.

Measured in this process:
- one-off preparation: geometry (coordinates, compacted addresses) and access marks;
- figure data for the whole trace, for a 1% time window, for the stacked view, and a full `Explorer` refresh
  (filters, timeline, status and ATI panel) after a zoom;
- bytes the timeline sends to the browser through the widget protocol (binary buffers + JSON), against
  the baseline of sending every block as its own polygon (what a plot without level of detail needs).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd

SLOTS = 20_000


def synthetic_trace(n_blocks: int, accesses_per_block: float, seed: int = 0):
    """A Trace with `n_blocks` blocks; see the module docstring."""
    from memlens.trace import Trace
    rng = np.random.default_rng(seed)
    span_ns = 10_000_000_000
    alloc = np.sort(rng.integers(0, span_ns, n_blocks))
    slot = np.arange(n_blocks) % SLOTS
    slot_cap = (np.exp(rng.normal(np.log(64 << 10), 1.5, SLOTS)).astype(np.int64) // 512 + 1) * 512
    slot_base = np.concatenate([[0], np.cumsum(slot_cap)[:-1]]) + (1 << 40)
    size = np.maximum((slot_cap[slot] * rng.uniform(0.3, 1.0, n_blocks)).astype(np.int64), 512)
    life = np.exp(rng.normal(np.log(2e6), 2.0, n_blocks)).astype(np.int64)
    next_in_slot = np.concatenate([alloc[SLOTS:], np.full(min(SLOTS, n_blocks), span_ns)])
    free = np.minimum(alloc + life, next_in_slot)
    categories = np.array(["activation", "temporary", "gradient", "optimizer_state", "parameter"], dtype=object)
    modules = np.array([f"model.layers.{i}.{part}" for i in range(24) for part in ("attn", "mlp", "ln")],
                       dtype=object)
    blocks = pd.DataFrame({
        "block_id": np.arange(n_blocks), "device": "cuda:0", "addr": slot_base[slot], "size": size,
        "alloc_ns": alloc, "free_ns": free, "category": categories[rng.integers(0, len(categories), n_blocks)],
        "module": modules[rng.integers(0, len(modules), n_blocks)], "op": "aten::mm", "source": "synthetic"})
    n_acc = int(n_blocks * accesses_per_block)
    owner = rng.integers(0, n_blocks, n_acc)
    t = alloc[owner] + (rng.uniform(0, 1, n_acc) * (free[owner] - alloc[owner])).astype(np.int64)
    n_ops = max(n_acc // 4, 1)
    accesses = pd.DataFrame({"block_id": owner, "t_ns": t, "op_id": rng.integers(0, n_ops, n_acc),
                             "is_write": rng.uniform(0, 1, n_acc) < 0.3})
    op_t = np.sort(rng.integers(0, span_ns, n_ops))
    ops = pd.DataFrame({"op_id": np.arange(n_ops), "name": "aten::mm", "start_ns": op_t, "end_ns": op_t + 1000})
    return Trace.from_tables(blocks, accesses, ops, metadata={"source_kind": "synthetic"})


def wire_bytes(traces: list[dict]) -> tuple[int, int]:
    """(binary buffer bytes, JSON bytes) the plotly FigureWidget protocol sends for these trace dicts."""
    import plotly.graph_objects as go
    from plotly.serializers import _py_to_js
    fig = go.Figure(data=traces)
    binary = 0

    def strip(value):
        nonlocal binary
        if isinstance(value, dict) and "buffer" in value and isinstance(value["buffer"], memoryview):
            binary += value["buffer"].nbytes
            return {k: v for k, v in value.items() if k != "buffer"}
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    payload = strip(_py_to_js([t.to_plotly_json() for t in fig.data], None))
    return binary, len(json.dumps(payload, default=float))


def timed(label: str, fn, results: dict):
    t0 = time.perf_counter()
    value = fn()
    results[label] = time.perf_counter() - t0
    print(f"{label:<48} {results[label]:8.3f} s")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--accesses-per-block", type=float, default=3.0)
    args = parser.parse_args(argv)

    from memlens.widgets.explorer import Explorer
    from memlens.widgets.geometry import block_geometry
    from memlens.widgets.lod import rectangle_polygons
    from memlens.widgets.state import ExplorerState, colour_groups, selection_mask
    from memlens.widgets.timeline import AccessMarks, blocks_view, stacked_view

    import plotly.graph_objects as go
    go.FigureWidget()   # first use of FigureWidget imports nbformat/jsonschema (seconds): keep it out of timings

    results: dict[str, float] = {}
    trace = timed(f"build synthetic trace ({args.blocks:,} blocks)",
                  lambda: synthetic_trace(args.blocks, args.accesses_per_block), results)
    geom = timed("geometry (once per device)", lambda: block_geometry(trace, "cuda:0"), results)
    marks = timed("access marks (once per device)", lambda: AccessMarks.of(trace, geom), results)
    state = ExplorerState(device="cuda:0")
    mask = selection_mask(geom, state)
    group, names, colours = timed("colour groups", lambda: colour_groups(geom, "category", mask), results)
    lo, hi = geom.full_x_range("time")
    window = (lo + 0.5 * (hi - lo), lo + 0.51 * (hi - lo))
    box = (0.5 * geom.address_span, 0.501 * geom.address_span)
    views = {
        "whole trace": state,
        "1% time window": state.with_(x_range=window),
        "1% time x 0.1% address box": state.with_(x_range=window, y_range=box),
    }
    data = {label: timed(f"blocks view, {label}",
                         lambda s=s: blocks_view(geom, marks, s, mask, group, names, colours), results)
            for label, s in views.items()}
    timed("stacked view, whole trace (sorts the events)", lambda: stacked_view(geom, state.with_(view="stacked"),
                                                                              mask, group, names, colours), results)
    timed("stacked view, whole trace, again", lambda: stacked_view(geom, state.with_(view="stacked"), mask, group,
                                                                   names, colours), results)
    print()
    for label, d in data.items():
        t0 = time.perf_counter()
        binary, js = wire_bytes(d.traces)
        results[f"serialise {label}"] = time.perf_counter() - t0
        results[f"bytes {label}"] = binary + js
        print(f"{label}: {d.drawn:,} polygons + {d.rastered:,} blocks in the raster, {d.accesses_shown:,} access "
              f"marks; sent {binary / 1e6:.2f} MB binary + {js / 1e6:.2f} MB JSON "
              f"(serialised in {results[f'serialise {label}']:.3f} s)")
    t0 = time.perf_counter()
    px, py = rectangle_polygons(geom.t0, geom.t1, geom.y0, geom.y0 + geom.size)
    naive_traces = [dict(type="scattergl", mode="lines", fill="toself", x=px, y=py)]
    naive_binary, naive_js = wire_bytes(naive_traces)
    naive_s = time.perf_counter() - t0
    naive = naive_binary + naive_js
    print(f"baseline, every block as its own polygon: {naive / 1e6:.1f} MB in {naive_s:.3f} s "
          f"(build + serialise)")
    for label in views:
        build_and_send = results[f"blocks view, {label}"] + results[f"serialise {label}"]
        print(f"  {label}: {naive / results[f'bytes {label}']:.0f}x fewer bytes, "
              f"{naive_s / build_and_send:.1f}x the speed of the baseline")
    from plotly.basewidget import BaseFigureWidget
    bundle = BaseFigureWidget._esm
    size = bundle.stat().st_size if hasattr(bundle, "stat") else len(str(bundle))
    print(f"plus, once per explorer, plotly's FigureWidget JavaScript bundle: {size / 1e6:.1f} MB "
          "(the panels' figures use the notebook's plotly renderer and send only their JSON)")
    print()
    explorer = timed("Explorer(trace): first render incl. ATI panel", lambda: Explorer(trace), results)
    timed("Explorer.zoom to the 1% window (full refresh)", lambda: explorer.zoom(window), results)
    timed("Explorer.zoom to the 1% x 0.1% box (full refresh)", lambda: explorer.zoom(window, box), results)
    timed("Explorer.update(colour_by='module')", lambda: explorer.update(colour_by="module"), results)
    timed("Explorer.update(view='stacked')", lambda: explorer.update(view="stacked"), results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
