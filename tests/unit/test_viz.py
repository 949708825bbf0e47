"""Figure functions and level-of-detail reductions, checked against brute-force computations."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memlens import Trace
from memlens.viz import lod
from memlens.viz.live import live_memory, live_series
from memlens.viz.tables import largest_blocks, largest_blocks_table
from memlens.viz.timeline import block_rects, timeline
from report_support import XSS_NAMES, brute_force_live, constructed_trace


def test_extrema_indices_keep_every_bins_min_max_and_the_peak():
    rng = np.random.default_rng(0)
    x = np.cumsum(rng.exponential(1.0, 200_000))
    y = np.cumsum(rng.normal(0, 1, 200_000))
    bins = 500
    keep = lod.extrema_indices(x, y, bins)
    assert len(keep) <= 4 * bins + 1
    assert int(np.argmax(y)) in set(keep.tolist())
    assert np.all(np.diff(keep) > 0)
    # per bin, the kept points hold the true min and max of that bin
    b = np.minimum(((x - x[0]) / ((x[-1] - x[0]) / bins)).astype(int), bins - 1)
    true = pd.DataFrame({"b": b, "y": y}).groupby("b")["y"].agg(["min", "max"])
    kept = pd.DataFrame({"b": b[keep], "y": y[keep]}).groupby("b")["y"].agg(["min", "max"])
    pd.testing.assert_frame_equal(true, kept)


def test_extrema_indices_small_input_is_untouched():
    assert lod.extrema_indices(np.arange(10.0), np.arange(10.0), 100).tolist() == list(range(10))


def test_rasterize_conserves_area_and_places_it():
    edges = np.linspace(0, 10, 11)
    # one rectangle covering cells x 2..4, y 1..2 exactly, one tiny inside cell (7, 8)
    grid = lod.rasterize([2, 7.2], [5, 7.3], [1, 8.1], [3, 8.2], edges, edges)
    assert grid.shape == (10, 10)
    assert grid.sum() == pytest.approx(3 * 2 + 0.1 * 0.1)
    assert grid[1:3, 2:5] == pytest.approx(np.ones((2, 3)))
    assert grid[8, 7] == pytest.approx(0.01)
    assert grid[0].sum() == 0


def test_compress_gaps_shrinks_empty_ranges_and_keeps_overlaps():
    start = np.array([10**12, 100, 150, 10**12 + 50, 5000])
    size = np.array([100, 100, 10, 10, 20])
    y, info = lod.compress_gaps(start, size, gap=7)
    # regions: [100,200) (two blocks), [5000,5020), [1e12, 1e12+100)
    assert info["regions"] == 3
    assert y[1] == 0 and y[2] == 50
    assert y[4] == 100 + 7
    assert y[0] == 100 + 7 + 20 + 7 and y[3] == y[0] + 50
    assert info["span"] == 100 + 7 + 20 + 7 + 100


def test_live_series_matches_brute_force_and_stacks_to_total():
    trace = constructed_trace()
    for device in trace.devices:
        peak, curve = brute_force_live(trace, device)
        s = live_series(trace, device, by="category")
        assert s.peak_bytes == peak
        assert s.events == len(curve)
        assert s.total.tolist() == curve  # small trace: nothing is reduced
        stacked = np.sum(list(s.groups.values()), axis=0)
        assert stacked.tolist() == s.total.tolist()
    s = live_series(trace, "cuda:0", by="category")
    # at the peak: parameter 4000 + activation 1000 + temporary 300
    i = int(np.argmax(s.total))
    assert {k: int(v[i]) for k, v in s.groups.items()} == {"parameter": 4000, "activation": 1000, "temporary": 300}


def test_live_series_reduces_big_curve_but_keeps_exact_peak():
    rng = np.random.default_rng(1)
    n = 50_000
    alloc = np.sort(rng.integers(0, 10**9, n))
    life = rng.integers(1, 10**7, n)
    blocks = pd.DataFrame({"block_id": np.arange(n), "device": "cuda:0", "size": rng.integers(1, 1 << 20, n),
                           "alloc_ns": alloc, "free_ns": alloc + life,
                           "category": rng.choice(["activation", "gradient", "temporary"], n)})
    trace = Trace.from_tables(blocks)
    s = live_series(trace, "cuda:0", max_points=2000, top_groups=2)
    assert len(s.x) <= 2001
    assert s.peak_bytes == trace.peak_live_bytes()["cuda:0"]
    assert s.total.max() == s.peak_bytes
    # 3 groups with top_groups=2: folding a single group into "other" would hide it for nothing
    assert set(s.groups) == {"activation", "gradient", "temporary"}
    assert np.array_equal(np.sum(list(s.groups.values()), axis=0), s.total)


def test_live_memory_figure_has_one_row_per_device_and_a_peak_marker():
    trace = constructed_trace()
    fig = live_memory(trace, by="module", x="event")
    peaks = [t for t in fig.data if t.name == "peak"]
    assert len(peaks) == 2
    # one unit for all rows, the binary unit of the largest peak: KiB
    assert sorted(p.y[0] * 1024 for p in peaks) == pytest.approx([50, 5300])
    assert fig.layout.yaxis.title.text == "live memory (KiB)"
    assert fig.layout.xaxis2.title.text.startswith("event index")


def test_figure_text_from_the_trace_is_escaped():
    trace = constructed_trace(names=XSS_NAMES)
    for fig in (live_memory(trace, by="module"), timeline(trace), largest_blocks_table(trace)):
        text = fig.to_json()
        assert "<script" not in text and "<img" not in text and "<svg" not in text
        assert "&lt;script&gt;" in text


def test_largest_blocks_agree_with_a_plain_sort():
    trace = constructed_trace()
    df = largest_blocks(trace, n=5)
    expected = sorted(((-r.size, r.block_id) for r in trace.blocks.itertuples()))[:5]
    assert list(zip(-df["size"], df["block_id"])) == expected
    assert df.loc[0, "location"] == "model.layer2:7 model.layer1"  # stack 0 is on the parameter, block 0
    lifetime = df.set_index("block_id")["lifetime_ns"]
    assert lifetime[1] == 50  # activation of iteration 0: 10 -> 60


def test_timeline_draws_the_largest_blocks_and_aggregates_the_rest():
    trace = constructed_trace(n_iter=30)
    fig = timeline(trace, device="cuda:0", max_blocks=10)
    bars = [t for t in fig.data if t.type == "bar"]
    heat = [t for t in fig.data if t.type == "heatmap"]
    assert sum(len(b.x) for b in bars) == 10
    assert len(heat) == 1 and "51 small blocks" in heat[0].name  # 61 cuda blocks - 10 drawn
    assert any(t.name == "accesses" for t in fig.data)
    rects = block_rects(trace, "cuda:0", x="event")
    assert rects.attrs["y_mode"] == "address"
    assert (rects["x1"] >= rects["x0"]).all()
    # the parameter lives from before the first event to past the last (61 allocs + 60 frees on cuda:0)
    param = rects[rects["block_id"] == 0].iloc[0]
    assert param["x0"] == 0 and param["x1"] == 121


def test_timeline_without_addresses_stacks_on_live_bytes():
    blocks = pd.DataFrame({"block_id": [0, 1, 2], "device": "cpu", "size": [10, 20, 30],
                           "alloc_ns": [0, 5, 6], "free_ns": [10, 7, 20]})
    rects = block_rects(Trace.from_tables(blocks), "cpu")
    assert rects.attrs["y_mode"] == "stacked"
    assert rects["y0"].tolist() == [0, 10, 30]


def test_public_figure_functions_are_exported():
    import memlens.viz as viz

    for name in viz.__all__:
        assert callable(getattr(viz, name)), name


def test_whatif_comparison_escapes_the_table_text():
    from memlens.viz.whatif import whatif_comparison

    table = pd.DataFrame({"device": ["<b>cuda:0</b>"] * 2, "stage": ["max-live", "static plan"],
                          "variant": ["", "<img src=x onerror=alert(1)>"], "bytes": pd.array([100, 120], "Int64"),
                          "ratio_to_max_live": [1.0, 1.2], "note": ["ok", "<script>x</script>"]})
    text = whatif_comparison(table).to_json()
    assert "<img" not in text and "<script" not in text and "<b>cuda" not in text


def test_allocator_timeline_keeps_the_simulated_peaks():
    from memlens.simulate import simulate
    from memlens.viz.allocator import allocator_timeline

    trace = constructed_trace(n_iter=6)
    result = simulate(trace, allocator="caching", device="cuda:0")
    sim = result.devices["cuda:0"]
    fig = allocator_timeline(trace, result=result, device="cuda:0")
    curves = {t.name: np.asarray(t.y) for t in fig.data}
    unit = {"B": 1, "KiB": 1024, "MiB": 2**20}[fig.layout.yaxis.title.text.split("(")[1].rstrip(")")]
    assert curves["reserved (simulated)"].max() * unit == pytest.approx(sim.peak_reserved)
    assert curves["allocated (simulated)"].max() * unit == pytest.approx(sim.peak_allocated)
    assert curves["live (trace)"].max() * unit == pytest.approx(5300)
    # the allocator rounds every request up (512 B at least) and caches whole segments
    assert sim.peak_reserved >= sim.peak_allocated >= 5300


def test_timeline_address_ticks_name_real_addresses():
    blocks = pd.DataFrame({"block_id": [0, 1, 2], "device": "cuda:0", "addr": [0x1000, 0x1100, 0x7F0000000000],
                           "size": [256, 64, 512], "alloc_ns": [0, 1, 2], "free_ns": [5, 6, 7]})
    fig = timeline(Trace.from_tables(blocks))
    assert list(fig.layout.yaxis.ticktext) == ["0x1000", "0x7f0000000000"]
    gap = 0.02 * (320 + 512)  # 2% of the occupied bytes: regions [0x1000, 0x1140) and [0x7f..., +512)
    assert list(fig.layout.yaxis.tickvals) == pytest.approx([0, 320 + gap])


def test_peak_composition_matches_the_live_blocks_at_the_peak():
    from memlens.viz.peak import peak_composition

    trace = constructed_trace(names=XSS_NAMES)
    fig = peak_composition(trace, by="op")
    cuda = {t.name: t.y[0] for t in fig.data if t.orientation != "h" and t.x[0] == "cuda:0"}
    # KiB: parameter 4000 B, activation 1000 B, temporary 300 B at the cuda:0 peak
    assert {k: round(v * 1024) for k, v in cuda.items()} == {"parameter": 4000, "activation": 1000,
                                                              "temporary": 300}
    assert "<script" not in fig.to_json() and "<img" not in fig.to_json()


def test_time_unit_suits_the_span():
    from memlens.viz.labels import time_axis, time_unit

    assert time_unit(350) == (1.0, "ns")
    assert time_unit(50_000) == (1e3, "\u00b5s")
    assert time_unit(2e8) == (1e6, "ms")
    assert time_unit(3e10) == (1e9, "s")
    assert time_axis("time") == (1e6, "time since trace start (ms)")  # no span: milliseconds, as before
    with pytest.raises(ValueError):
        time_axis("wallclock")


def test_swap_figures_show_the_plan():
    """Load curves, copy timeline and priority ranking drawn from a plan whose numbers are known: A (1 GB)
    idles from 1 ms to 500 ms while B (2 GB) lives 200-300 ms."""
    import pandas as pd

    from memlens.analysis.bandwidth import BandwidthModel
    from memlens.swap import plan_swaps
    from memlens.trace import Trace
    from memlens.viz import swap_load_curves, swap_priorities, swap_timeline

    gb, ms = 1_000_000_000, 1_000_000
    blocks = pd.DataFrame({"block_id": [0, 1], "device": "cuda:0", "size": [gb, 2 * gb],
                           "alloc_ns": [0, 200 * ms], "free_ns": [600 * ms, 300 * ms]})
    ops = pd.DataFrame({"op_id": [0, 1, 2, 3], "name": "op", "start_ns": [0, 200 * ms, 299 * ms, 500 * ms],
                        "end_ns": [ms, 201 * ms, 300 * ms, 501 * ms]})
    acc = pd.DataFrame({"block_id": [0, 1, 1, 0], "t_ns": [0, 200 * ms, 299 * ms, 500 * ms],
                        "op_id": [0, 1, 2, 3], "is_write": False})
    plan = plan_swaps(Trace.from_tables(blocks, acc, ops), bandwidth=BandwidthModel(10 * gb, 10 * gb, 10_000))
    assert plan.peak_after == 2 * gb
    curves = swap_load_curves(plan)
    after = [t for t in curves.data if t.name == "after swapping"][0]
    before = [t for t in curves.data if t.name == "recorded"][0]
    assert max(after.y) == 2 * gb and max(before.y) == 3 * gb
    assert "host clock" in curves.layout.title.text and "10.0 us" in curves.layout.title.text
    timeline = swap_timeline(plan)
    lanes = {t.name: t for t in timeline.data}
    out = lanes["copy-out (device->host)"]
    # 1 GB at 10 GB/s + 10 us: 100.01 ms, starting when the op that used A ends (1 ms)
    assert list(out.base) == [pytest.approx(1.0)] and list(out.x) == [pytest.approx(100.01)]
    back = lanes["copy-in (host->device)"]
    assert back.base[0] + back.x[0] == pytest.approx(500.0)  # just in time for the next access
    prio = swap_priorities(plan)
    assert len(prio.data) == 3 and all(len(t.y) == 1 for t in prio.data)
    assert list(prio.data[0].marker.color) == ["#54A24B"]  # the kept swap is coloured
