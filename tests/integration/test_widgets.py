"""The explorer widget's logic, driven without a browser: geometry, level of detail, filters, handlers."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import memlens
from memlens.trace import Trace
from memlens.widgets.explorer import Explorer
from memlens.widgets.geometry import block_geometry
from memlens.widgets.lod import rectangles_lod, stacked_live
from memlens.widgets.state import ExplorerState, colour_groups, selection_mask
from memlens.widgets.timeline import live_events

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "transformer_train_adamw.memlens"


@pytest.fixture(scope="module")
def sample():
    return memlens.load(SAMPLE)


def _toy_trace() -> Trace:
    """Four blocks at known addresses and times, two accesses on block 1."""
    blocks = pd.DataFrame({
        "block_id": [0, 1, 2, 3], "device": "cuda:0",
        "addr": [1 << 40, (1 << 40) + 4096, (1 << 40) + 8192, 1 << 45],   # block 3 far away
        "size": [4096, 4096, 1024, 2048],
        "alloc_ns": [0, 100, 200, 300], "free_ns": [1000, 600, 400, pd.NA],
        "category": ["parameter", "activation", "temporary", "activation"],
        "module": ["model.a", "model.b.c", "model.b", "model.d"], "op": ["", "aten::mm", "aten::add", "aten::mm"]})
    accesses = pd.DataFrame({"block_id": [1, 1], "t_ns": [150, 500], "op_id": [0, 1], "is_write": [True, False]})
    ops = pd.DataFrame({"op_id": [0, 1], "name": ["aten::mm", "aten::relu"], "start_ns": [150, 500],
                        "end_ns": [160, 510]})
    return Trace.from_tables(blocks, accesses, ops, metadata={"source_kind": "test"})


def test_geometry_compacts_addresses_and_keeps_order():
    geom = block_geometry(_toy_trace(), "cuda:0")
    # contiguous blocks stay contiguous, the far block is brought close, order preserved
    assert geom.y0[1] - geom.y0[0] == 4096 and geom.y0[2] - geom.y0[1] == 4096
    assert geom.y0[2] + 1024 < geom.y0[3] < geom.y0[2] + 1024 + 0.1 * (1 << 45)
    assert geom.address_span < 20_000
    # block 3 is never freed: it ends at the trace end (the last timestamp, 1000 ns)
    assert geom.t1[3] == 1000
    # event order: allocs at 0,100,200,300 and frees at 400,600,1000 -> 7 events
    assert list(geom.e0) == [0, 1, 2, 3] and list(geom.e1[:3]) == [6, 5, 4]


def test_filters_match_pandas(sample):
    geom = block_geometry(sample, "cpu")
    state = ExplorerState(device="cpu", categories=("activation", "temporary"), module="model.layers.0",
                          min_size=4096)
    mask = selection_mask(geom, state)
    b = sample.blocks[sample.blocks["device"] == "cpu"]
    expected = (b["category"].isin(["activation", "temporary"]) & (b["size"] >= 4096) &
                ((b["module"] == "model.layers.0") | b["module"].str.startswith("model.layers.0.")))
    assert mask.sum() == expected.sum() > 0
    assert set(geom.block_id[mask]) == set(b.loc[expected, "block_id"])


def test_lod_puts_every_visible_block_in_polygons_or_raster(sample):
    geom = block_geometry(sample, "cpu")
    mask = np.ones(geom.n, bool)
    group, names, _ = colour_groups(geom, "category", mask)
    x_range, y_range = geom.full_x_range("time"), (0.0, geom.address_span)
    lod = rectangles_lod(geom.t0, geom.t1, geom.y0, geom.y0 + geom.size, group, len(names), x_range, y_range,
                         width_px=600, height_px=300)
    assert len(lod.drawn) + lod.rastered == geom.n
    assert sum(len(x) for x, _ in lod.polygons.values()) == 6 * len(lod.drawn)
    # the raster's painted area equals the total area of the rastered blocks (in cell units), so none is lost
    small = np.setdiff1d(np.arange(geom.n), lod.drawn)
    ny, nx = lod.raster.shape
    cell_area = (x_range[1] - x_range[0]) / nx * (y_range[1] - y_range[0]) / ny
    area = ((geom.t1 - geom.t0) * geom.size)[small].sum() / cell_area
    from memlens.widgets.lod import coverage_raster
    cover = coverage_raster(geom.t0[small], geom.t1[small], geom.y0[small], geom.y0[small] + geom.size[small],
                            group[small], len(names), x_range, y_range, nx, ny)
    assert cover.sum() == pytest.approx(area, rel=1e-6)
    # zooming into one block makes it a polygon
    i = int(np.argmax(geom.size))
    zoom = rectangles_lod(geom.t0, geom.t1, geom.y0, geom.y0 + geom.size, group, len(names),
                          (geom.t0[i], geom.t1[i]), (geom.y0[i], geom.y0[i] + geom.size[i]), 600, 300)
    assert i in set(zoom.drawn)


def test_polygon_budget_moves_the_smallest_into_the_raster():
    n = 5000
    x0 = np.arange(n, dtype=float)
    lod = rectangles_lod(x0, x0 + 1, np.zeros(n), np.full(n, 10.0), np.zeros(n, int), 1, (0, n), (0, 10),
                         width_px=20_000, height_px=100, max_polygons=1000)
    assert len(lod.drawn) <= 1000 and len(lod.drawn) + lod.rastered == n


def test_stacked_live_keeps_the_exact_peak(sample):
    geom = block_geometry(sample, "cpu")
    mask = np.ones(geom.n, bool)
    group, names, _ = colour_groups(geom, "module", mask)
    x, delta, pos = live_events(geom, mask, "time")
    xs, live = stacked_live(x, delta, group[pos], len(names), geom.full_x_range("time"), width_px=300)
    assert len(xs) <= 4 * 300 + 1
    assert live.sum(axis=0).max() == pytest.approx(sample.peak_live_bytes()["cpu"])


def test_explorer_handlers_update_every_view(sample):
    ex = Explorer(sample)
    # raster, one polygon trace per colour group, the hover markers (stacks), reads, writes
    assert len(ex.timeline.data) == 1 + len(colour_groups(ex.geometry(), "category")[1]) + 3
    ex.update(categories=("activation",))
    n_act = int((sample.blocks["category"] == "activation").sum())
    assert f"{n_act:,} of" in ex.status.value
    # zoom to an iteration: the ATI panel counts only intervals of selected blocks overlapping it
    its = ex.iterations()
    k = int(its["iteration"].iloc[1])
    ex.select_iteration(k)
    lo, hi = its.loc[its["iteration"] == k, ["start_ns", "end_ns"]].iloc[0]
    from memlens.analysis.ati import access_intervals
    iv = access_intervals(sample, "cpu")
    act = set(sample.blocks.loc[sample.blocks["category"] == "activation", "block_id"])
    # the ATIs only (access->access); the lifetime edges are not idle intervals a link could use
    expected = iv[iv["block_id"].isin(act) & (iv["end_ns"] >= lo) & (iv["start_ns"] <= hi)
                  & (iv["kind"] == "access_to_access")]
    assert f"<b>{len(expected):,}</b> ATIs" in ex.ati_summary.value
    # a click in the centre of a drawn block shows that block
    geom = ex.geometry()
    ex.update(categories=tuple(sample.blocks["category"].unique()))
    i = int(np.nanargmax(np.where(np.isnan(geom.y0), -1, geom.size)))
    ex.zoom((geom.t0[i], geom.t1[i]), (geom.y0[i] - geom.size[i], geom.y0[i] + 2 * geom.size[i]))
    html = ex.click((geom.t0[i] + geom.t1[i]) / 2 / ex.view_data.scale, geom.y0[i] + geom.size[i] / 2)
    assert ex.selected_block == int(geom.block_id[i]) and f"data-block-id='{ex.selected_block}'" in html
    n_acc = int((sample.accesses["block_id"] == ex.selected_block).sum())
    assert n_acc > 0  # the largest block of the sample is read by the ops after it
    assert f"<b>Accesses</b>: {n_acc:,}" in html
    # the stacked view: a click lists what is live there, with the exact live bytes
    ex.update(view="stacked")
    t = float((geom.t0[i] + geom.t1[i]) / 2)
    html = ex.click(t / ex.view_data.scale, 0)
    live = (geom.t0 <= t) & (geom.t1 > t)
    assert memlens.units.format_bytes(float(geom.size[live].sum())) in html
    # the event-index axis resets the zoom and covers every event
    ex.update(axis="event", view="blocks")
    assert ex.view_data.x_range[1] >= len(geom.event_t) - 1
    # the controls show what methods set, and a later control change keeps it
    ex.update(colour_by="module", min_size=4096)
    assert (ex.w_axis.value, ex.w_colour.value, ex.w_min_size.value) == ("event", "module", "4096")
    ex.w_view.value = "stacked"
    assert (ex.state.view, ex.state.axis, ex.state.colour_by, ex.state.min_size) == ("stacked", "event", "module",
                                                                                      4096)


def test_devices_and_relayout_events():
    trace = _toy_trace()
    extra = trace.blocks.copy()
    extra["block_id"] += 10
    extra["device"] = "cuda:1"
    extra["size"] *= 2
    two = Trace.from_tables(pd.concat([trace.blocks, extra], ignore_index=True), trace.accesses, trace.ops)
    ex = Explorer(two)
    assert ex.state.device == "cuda:1"          # the device with the highest peak comes first
    assert "<b>cuda:1</b>: 4 of 4 blocks" in ex.status.value
    ex.update(device="cuda:0")
    assert ex.geometry().device == "cuda:0" and ex.state.x_range is None
    # a relayout from the browser (figure units: ms) zooms; an echo of the shown range does nothing
    ex._on_relayout(None, (0.0001, 0.0005), (0.0, 9000.0))
    assert ex.state.x_range == pytest.approx((100.0, 500.0)) and ex.state.y_range == (0.0, 9000.0)
    state = ex.state
    shown = ex.view_data
    ex._on_relayout(None, (shown.x_range[0] / shown.scale, shown.x_range[1] / shown.scale), shown.y_range)
    assert ex.state is state
    ex._on_autorange(None, True)
    assert ex.state.x_range is None and ex.state.y_range is None


def test_explorer_escapes_trace_text():
    trace = _toy_trace()
    trace.blocks.loc[1, "module"] = "<img src=x onerror=alert(1)>"
    trace.blocks.loc[1, "category"] = "<script>alert(1)</script>"
    ex = Explorer(trace)
    ex.update(colour_by="module")
    names = [t.name for t in ex.timeline.data]
    assert not any("<img" in n or "<script" in n for n in names)
    geom = ex.geometry()
    ex.zoom((0, 1000), (0, geom.address_span))
    html = ex.click(350 / ex.view_data.scale, geom.y0[1] + 100)
    assert ex.selected_block == 1
    assert "<img" not in html and "&lt;img" in html


def test_whatif_panel_against_independent_numbers(sample):
    from memlens.widgets.whatif_panel import whatif_table
    table = whatif_table(sample, "cpu", plan_seconds=0.5)
    live = table.set_index("scenario").loc["recorded (live)", "peak_bytes"]
    assert live == sample.peak_live_bytes()["cpu"]
    plan_height = table.set_index("scenario").loc["static plan", "peak_bytes"]
    assert plan_height >= live   # no static plan beats max-live
    caching = table[table["scenario"].str.startswith("caching")]["peak_bytes"]
    assert (caching >= live).all()  # an allocator reserves at least what is live
    rows = table.set_index("scenario")["peak_bytes"]
    # swapping can only lower the peak, and no link beats infinite bandwidth
    assert rows["swapping, infinite bandwidth"] <= rows["swapping"] <= live


def test_explorer_whatif_button_and_ati_figure(sample):
    ex = Explorer(sample)
    table = ex.run_whatif()
    assert len(ex.whatif_figure.data) == 1 and len(ex.whatif_figure.data[0].y) == len(table)
    assert "static plan" in ex.whatif_result.value
    # the ATI panel is memlens.viz's histogram: swappable + too-short bars; the ECDF has one curve
    assert [t.name for t in ex.ati_figure.data] == ["too short to swap", "swappable"]
    ex.w_ecdf.value = True
    assert [t.name for t in ex.ati_figure.data] == ["all intervals"]


@pytest.mark.shared
def test_real_snapshot_click_and_details(shared):
    trace = memlens.load(shared("snapshots/decomfl_memory.pickle"))
    ex = Explorer(trace)
    geom = ex.geometry()
    i = int(np.argmax(np.where(np.isnan(geom.y0), -1, geom.size)))
    ex.zoom((geom.t0[i], geom.t1[i]), (geom.y0[i] - geom.size[i], geom.y0[i] + 2 * geom.size[i]))
    assert ex.view_data.drawn >= 1
    html = ex.click((geom.t0[i] + geom.t1[i]) / 2 / ex.view_data.scale, geom.y0[i] + geom.size[i] / 2)
    row = trace.blocks.set_index("block_id").loc[ex.selected_block]
    assert int(row["size"]) == int(geom.size[i])
    assert hex(int(row["addr"])) in html and f"{int(row['size']):,} bytes" in html
    assert "records no accesses" in ex.ati_summary.value and "no access time intervals" in ex.ati_summary.value


@pytest.mark.shared
def test_trace_without_addresses_opens_on_live_memory(shared):
    trace = memlens.load(shared("kineto/kineto_resnet50_2021format.pt.trace.json.gz"))
    ex = Explorer(trace)
    assert ex.state.view == "stacked" and ex.w_view.value == "stacked"
    stacked = [t for t in ex.timeline.data if t.fill in ("tozeroy", "tonexty")]
    top = np.asarray(stacked[-1].y)
    assert top.max() == pytest.approx(trace.peak_live_bytes()[ex.state.device])


def test_run_selector_shows_the_selected_run_in_the_explorer(tmp_path):
    """A RunSet's run selector: one entry per rank in rank order, the rank that peaks highest shown first,
    and picking another rank (through the dropdown, as a user does) shows that run's blocks in the
    explorer's timeline, on the same device."""
    from memlens.widgets import explore
    small, big = _toy_trace(), _toy_trace()
    big.blocks["size"] = big.blocks["size"] * 10  # rank 1 peaks 10x higher
    small.save(tmp_path / "rank0.memlens")
    big.save(tmp_path / "rank1.memlens")
    w = explore(memlens.load_many(str(tmp_path / "rank*.memlens")))
    assert [v for _, v in w.w_run.options] == [0, 1]
    # toy peak: all four blocks are live in [300, 400): 4096 + 4096 + 1024 + 2048 = 11 KiB; rank 1 has 10x
    assert w.rank == 1
    assert [label for label, _ in w.w_run.options] == ["rank 0: peak 11.0 KiB on cuda:0",
                                                       "rank 1: peak 110.0 KiB on cuda:0"]
    assert int(w.explorer.trace.blocks["size"].sum()) == 10 * (4096 + 4096 + 1024 + 2048)
    assert w.explorer in w.children
    before = w.explorer
    w.w_run.value = 0  # the dropdown's observer switches the run
    assert w.rank == 0 and w.explorer is not before and w.explorer in w.children and before not in w.children
    assert int(w.explorer.trace.blocks["size"].sum()) == 4096 + 4096 + 1024 + 2048
    assert w.explorer.state.device == "cuda:0"
    shown = [tr for tr in w.explorer.timeline.data if getattr(tr, "x", None) is not None and len(tr.x)]
    assert shown, "the timeline of the selected run draws its blocks"
    assert "rank 1" in w.imbalance.value  # the imbalance sentence names the rank that peaks
