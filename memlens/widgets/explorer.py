"""The explorer widget: linked views of one trace (plotly FigureWidget + ipywidgets).

Every control changes an immutable `ExplorerState`; `Explorer.refresh` recomputes the screen-sized figure
data for that state (`memlens.widgets.timeline`) and the ATI panel, so zooming the timeline (a relayout
event), filtering, picking an iteration or recolouring updates everything together. The handlers are public
methods (`update`, `zoom`, `click`, `select_iteration`, `run_whatif`) so tests drive the widget without a
browser; the browser only adds the plotly events that call them.
"""
from __future__ import annotations

import json

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from memlens.errors import InputError
from memlens.trace import CATEGORIES
from memlens.units import format_bytes, format_ns, parse_bytes
from memlens.viz.labels import binary_ticks, safe
from memlens.widgets.details import block_details, details_html, hit_test, live_at, live_html
from memlens.widgets.geometry import block_geometry
from memlens.widgets.state import AXES, COLOUR_BY, VIEWS, ExplorerState, colour_groups, iteration_window, \
    selection_mask
from memlens.widgets.timeline import PLOT_HEIGHT_PX, PLOT_WIDTH_PX, AccessMarks, blocks_view, stacked_view

MARGIN = dict(l=70, r=20, t=50, b=45)
ALL = -1   # the iteration selector's "all" (ipywidgets treats a None value as no selection)


def _default_device(trace) -> str:
    peaks = trace.peak_live_bytes()
    return max(peaks, key=lambda d: (peaks[d], d)) if peaks else "cpu"


LABEL = {"description_width": "initial"}  # a label as wide as its text (the default box cut labels off)


class Explorer(W.VBox):
    """Interactive view of a Trace; see the module docstring. Build with `memlens.widgets.explore`."""

    def __init__(self, trace, device: str | None = None):
        self.trace = trace
        self._geometry, self._marks, self._intervals = {}, {}, {}
        self._iterations = None
        self._busy = False
        self._ati_key = None      # what the ATI panel shows now (device, filters, time range, link, ECDF)
        self._syncing = False     # True while controls are set from the state (their observers must not fire)
        self.selected_block: int | None = None
        self.state = ExplorerState(device=device or _default_device(trace))
        geom = self.geometry()
        if geom.n and np.isnan(geom.y0).all():   # no addresses (e.g. 2021 Kineto files): only live memory
            self.state = self.state.with_(view="stacked")
        self.view_data = None
        self.timeline = go.FigureWidget(layout=dict(
            width=PLOT_WIDTH_PX + MARGIN["l"] + MARGIN["r"], height=PLOT_HEIGHT_PX + MARGIN["t"] + MARGIN["b"],
            margin=MARGIN, template="plotly_white", dragmode="zoom", hovermode="closest",
            legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0)))
        self.timeline.layout.on_change(self._on_relayout, "xaxis.range", "yaxis.range")
        self.timeline.layout.on_change(self._on_autorange, "xaxis.autorange")
        # only the timeline needs a FigureWidget (zoom and click events); the panels' figures are shown through
        # plotly's mimetype renderer in Output widgets, which avoids shipping plotly.js (5 MB) once per figure
        self.ati_figure, self.whatif_figure = go.Figure(), go.Figure()
        self.swap_figures: list = []  # the what-if's swap plan: load before/after, copy timeline
        self.ati_output = W.Output(layout=W.Layout(min_height="300px"))
        self.whatif_output = W.Output()
        self.details = W.HTML("<i>Click a block in the timeline for its details.</i>",
                              layout=W.Layout(width="310px", flex="0 0 310px",
                                              max_height=f"{PLOT_HEIGHT_PX + 95}px", overflow="auto"))
        self._build_controls()
        super().__init__([self.status, self._controls, W.HBox([self.timeline, self.details]), self._panels])
        self.add_class("memlens-explorer")
        self.refresh()

    # ---- controls --------------------------------------------------------------------------------
    def _build_controls(self):
        present = set(self.trace.blocks["category"].unique())
        categories = [c for c in CATEGORIES if c in present] + sorted(present - set(CATEGORIES))
        self.status = W.HTML()
        self.w_device = W.Dropdown(options=self.trace.devices or [self.state.device], value=self.state.device,
                                   description="device", layout=W.Layout(width="180px"), style=LABEL)
        self.w_view = W.ToggleButtons(options=VIEWS, value=self.state.view, description="view",
                                      style={"button_width": "80px", **LABEL})
        self.w_axis = W.ToggleButtons(options=AXES, value="time", description="x axis",
                                      style={"button_width": "60px", **LABEL})
        self.w_colour = W.Dropdown(options=COLOUR_BY, value="category", description="colour by",
                                   layout=W.Layout(width="190px"), style=LABEL)
        self.w_iteration = W.Dropdown(options=[("all", ALL)], value=ALL, description="iteration",
                                      layout=W.Layout(width="170px"), style=LABEL)
        self.w_reset = W.Button(description="reset zoom", layout=W.Layout(width="100px"))
        self.w_categories = W.SelectMultiple(options=categories, value=tuple(categories), rows=4,
                                             description="category", layout=W.Layout(width="260px"), style=LABEL)
        modules = sorted(m for m in self.trace.blocks["module"].unique() if m)
        self.w_module = W.Combobox(options=modules[:2000], placeholder="module prefix, e.g. model.layers.0",
                                   description="module", ensure_option=False, continuous_update=False,
                                   layout=W.Layout(width="330px"), style=LABEL)
        self.w_min_size = W.Text(value="0", description="min size", placeholder="e.g. 1MiB",
                                 continuous_update=False, layout=W.Layout(width="180px"), style=LABEL)
        self.w_bandwidth = W.FloatLogSlider(value=25.0, base=10, min=-1, max=3, step=0.05,
                                            description="link GB/s", continuous_update=False,
                                            layout=W.Layout(width="420px"), style=LABEL)
        self.w_ecdf = W.Checkbox(value=False, description="ECDF")
        self.ati_summary = W.HTML()
        self.w_allocator = W.Dropdown(options=["caching", "malloc", "bestfit", "bump"], value="caching",
                                      description="allocator", layout=W.Layout(width="200px"), style=LABEL)
        self.w_conf = W.Text(value="expandable_segments:True", description="ALLOC_CONF",
                             layout=W.Layout(width="360px"), style=LABEL)
        self.w_run_whatif = W.Button(description="compare", button_style="primary")
        self.whatif_result = W.HTML("<i>Compare the recorded run with another allocator configuration, a "
                                    "static plan and swapping at the ATI panel's link.</i>")
        self._controls = W.VBox([
            W.HBox([self.w_device, self.w_view, self.w_axis, self.w_colour, self.w_iteration, self.w_reset]),
            W.HBox([self.w_categories, W.VBox([self.w_module, self.w_min_size])])])
        ati = W.VBox([W.HBox([self.w_bandwidth, self.w_ecdf]), self.ati_summary, self.ati_output])
        whatif = W.VBox([W.HBox([self.w_allocator, self.w_conf, self.w_run_whatif]), self.whatif_result,
                         self.whatif_output])
        self._panels = W.Tab([ati, whatif])
        self._panels.set_title(0, "access intervals (ATI)")
        self._panels.set_title(1, "what-if")
        for w in (self.w_device, self.w_view, self.w_axis, self.w_colour, self.w_categories, self.w_bandwidth,
                  self.w_ecdf):
            w.observe(self._on_control, names="value")
        self.w_module.observe(self._on_control, names="value")
        self.w_min_size.observe(self._on_control, names="value")
        self.w_iteration.observe(self._on_iteration, names="value")
        self.w_reset.on_click(lambda _: self.zoom(None, None))
        self.w_run_whatif.on_click(lambda _: self.run_whatif())

    def _on_control(self, _change):
        if self._syncing:
            return
        try:
            min_size = parse_bytes(self.w_min_size.value or "0")
        except (InputError, ValueError) as exc:
            self.status.value = f"<span style='color:#b00'>min size: {safe(exc)}</span>"
            return
        self.update(device=self.w_device.value, view=self.w_view.value, axis=self.w_axis.value,
                    colour_by=self.w_colour.value, categories=tuple(self.w_categories.value),
                    module=self.w_module.value or "", min_size=min_size,
                    bandwidth=f"{self.w_bandwidth.value:.4g}GB/s")

    def _on_iteration(self, change):
        if not self._syncing:
            self.select_iteration(None if change["new"] == ALL else change["new"])

    def _sync_controls(self):
        """Show the state in the controls (after a method call changed it) without firing their observers."""
        from memlens.analysis.bandwidth import BandwidthModel
        state = self.state
        self._syncing = True
        try:
            self.w_device.value = state.device
            self.w_view.value = state.view
            self.w_axis.value = state.axis
            self.w_colour.value = state.colour_by
            self.w_categories.value = tuple(self.w_categories.options) if state.categories is None else \
                tuple(c for c in self.w_categories.options if c in state.categories)
            self.w_module.value = state.module
            if parse_bytes(self.w_min_size.value or "0") != state.min_size:
                self.w_min_size.value = str(state.min_size)
            gbps = BandwidthModel.parse(state.bandwidth).h2d_bytes_per_s / 1e9
            if np.isfinite(gbps) and abs(np.log10(gbps) - np.log10(self.w_bandwidth.value)) > 1e-3:
                self.w_bandwidth.value = gbps
            wanted = ALL if state.iteration is None else state.iteration
            if wanted in [v for _, v in self.w_iteration.options]:
                self.w_iteration.value = wanted
        finally:
            self._syncing = False

    # ---- cached per-device data ------------------------------------------------------------------
    def geometry(self, device: str | None = None):
        """`BlockGeometry` of `device` (default: the current one), computed once."""
        device = device or self.state.device
        if device not in self._geometry:
            self._geometry[device] = block_geometry(self.trace, device)
        return self._geometry[device]

    def access_marks(self):
        """`AccessMarks` of the current device (None when the trace records no accesses)."""
        if not self.trace.has_accesses:
            return None
        if self.state.device not in self._marks:
            self._marks[self.state.device] = AccessMarks.of(self.trace, self.geometry())
        return self._marks[self.state.device]

    def intervals(self):
        """`access_intervals` of the current device, computed once (None without accesses)."""
        if not self.trace.has_accesses:
            return None
        if self.state.device not in self._intervals:
            from memlens.analysis.ati import access_intervals
            self._intervals[self.state.device] = access_intervals(self.trace, self.state.device)
        return self._intervals[self.state.device]

    def iterations(self):
        """`split_iterations` of the trace, computed once."""
        if self._iterations is None:
            from memlens.analysis.iterations import split_iterations
            self._iterations = split_iterations(self.trace)
        return self._iterations

    # ---- handlers (public: tests call them) ------------------------------------------------------
    def update(self, **changes):
        """Apply control changes to the state and redraw. Changing device or axis resets the zoom."""
        if ("device" in changes and changes["device"] != self.state.device) or \
                ("axis" in changes and changes["axis"] != self.state.axis):
            changes.update(x_range=None, y_range=None, iteration=None)
        self.state = self.state.with_(**changes)
        self.refresh()

    def zoom(self, x_range, y_range=None):
        """Show raw-axis ranges (ns or event index; y in compacted bytes); None resets to everything."""
        self.state = self.state.with_(x_range=None if x_range is None else (float(x_range[0]), float(x_range[1])),
                                      y_range=None if y_range is None else (float(y_range[0]), float(y_range[1])))
        self.refresh()

    def select_iteration(self, iteration: int | None):
        """Zoom the time range to one iteration (None: the whole trace)."""
        if iteration is None:
            self.state = self.state.with_(iteration=None, x_range=None)
        else:
            lo, hi = iteration_window(self.iterations(), int(iteration))
            geom = self.geometry()
            x = geom.from_time(np.array([lo, hi], dtype=np.float64), self.state.axis)
            self.state = self.state.with_(iteration=int(iteration), x_range=(float(x[0]), float(x[1])))
        self.refresh()

    def click(self, x_fig: float, y_fig: float) -> str:
        """Handle a click at figure coordinates (x in ms or event index): show the block (or what is live)."""
        data = self.view_data
        x = float(x_fig) * data.scale
        geom = self.geometry()
        mask = selection_mask(geom, self.state.with_(x_range=None))
        if self.state.view == "stacked":
            self.selected_block = None
            label = format_ns(geom.to_time([x], self.state.axis)[0])
            self.details.value = live_html(live_at(geom, mask, self.state.axis, x), label)
            return self.details.value
        pos = hit_test(geom, mask, self.state.axis, x, float(y_fig), data.cell)
        if pos is None:
            self.selected_block = None
            self.details.value = "<i>No selected block there.</i>"
        else:
            self.selected_block = int(geom.block_id[pos])
            self.details.value = details_html(block_details(self.trace, geom, pos, self.intervals()))
        return self.details.value

    def run_whatif(self):
        """Run the what-if comparison for the current device with the panel's allocator settings."""
        from memlens.widgets.whatif_panel import swap_figures, whatif_html, whatif_table, whatif_traces
        configs = {"caching (recorded settings)": ("caching", None),
                   f"{self.w_allocator.value} {self.w_conf.value}".strip(): (self.w_allocator.value,
                                                                            self.w_conf.value or None)}
        try:
            table = whatif_table(self.trace, self.state.device, configs, bandwidth=self.state.bandwidth)
        except InputError as exc:
            self.whatif_result.value = f"<span style='color:#b00'>{safe(exc)}</span>"
            return None
        self.whatif_result.value = whatif_html(table)
        self.whatif_figure = go.Figure(whatif_traces(table), layout=dict(
            xaxis_title="peak bytes", width=640, height=60 + 40 * len(table), template="plotly_white",
            margin=dict(l=190, r=10, t=20, b=40)))
        self.swap_figures = swap_figures(table)
        show_figure(self.whatif_output, self.whatif_figure, *self.swap_figures)
        return table

    # ---- plotly events ---------------------------------------------------------------------------
    def _on_relayout(self, layout, x_range, y_range):
        if self._busy or x_range is None:
            return
        scale = self.view_data.scale
        new_x = (x_range[0] * scale, x_range[1] * scale)
        new_y = tuple(y_range) if (y_range is not None and self.state.view == "blocks") else None
        shown = self.view_data   # the browser echoes ranges Python set: ignore those
        if np.allclose(new_x, shown.x_range) and (new_y is None or shown.y_range is not None and
                                                  np.allclose(new_y, shown.y_range)):
            return
        self.zoom(new_x, new_y)

    def _on_autorange(self, layout, autorange):
        if not self._busy and autorange:
            self.zoom(None, None)

    def _on_timeline_click(self, trace, points, selector):
        if points.xs:
            self.click(points.xs[0], points.ys[0] if points.ys else 0.0)

    # ---- rendering -------------------------------------------------------------------------------
    def _sync_iteration_options(self):
        its = self.iterations()
        options = [("all", ALL)] + [(f"{int(k)}", int(k)) for k in its["iteration"] if k >= 0]
        if list(self.w_iteration.options) != options and its["source"].iloc[0] != "none":
            self.w_iteration.options = options

    def hover_text(self, geom, positions) -> list[str]:
        """Hover text of blocks (positions in `geom`): id, size, category, op, then the allocation stack
        (Python frames innermost first, C++ frames folded), escaped; stacks are formatted once each."""
        from memlens.analysis.peak_cause import stack_lines
        from memlens.units import format_bytes

        cache = self.__dict__.setdefault("_stack_hover", {})
        blocks = self.trace.blocks
        rows = geom.rows[positions]
        sids = blocks["stack_id"].to_numpy(dtype="float64", na_value=np.nan)[rows]
        out = []
        for p, r, sid in zip(positions, rows, sids):
            key = None if np.isnan(sid) else int(sid)
            if key not in cache:
                lines = stack_lines(self.trace.stacks, key, 10) if key is not None else []
                cache[key] = ("<br>stack:<br>" + "<br>".join(safe(ln) for ln in lines)) if lines else ""
            out.append(f"block {int(geom.block_id[p])}: {safe(format_bytes(geom.size[p]))}, "
                       f"{safe(blocks['category'].iat[r])} / {safe(blocks['op'].iat[r]) or '(unknown)'}{cache[key]}")
        return out

    def refresh(self):
        """Recompute and redraw the timeline, status line and ATI panel for the current state."""
        self._busy = True
        try:
            geom = self.geometry()
            state = self.state
            mask = selection_mask(geom, state)                      # in the time range: status, ATI
            full = selection_mask(geom, state.with_(x_range=None))  # drawing: LOD decides what is in view
            group, names, colours = colour_groups(geom, state.colour_by, full)
            if state.view == "blocks":
                data = blocks_view(geom, self.access_marks(), state, full, group, names, colours,
                                   hover=lambda pos: self.hover_text(geom, pos))
            else:
                data = stacked_view(geom, state, full, group, names, colours)
            self.view_data = data
            self._draw_timeline(data)
            self._sync_iteration_options()
            self._sync_controls()
            self._status(geom, mask, data)
            self._draw_ati(geom, mask)
        finally:
            self._busy = False

    def _draw_timeline(self, data):
        fig = self.timeline
        same_shape = [(t.type, t.name) for t in fig.data] == [(t["type"], t["name"]) for t in data.traces]
        with fig.batch_update():
            if same_shape:
                for existing, new in zip(fig.data, data.traces):
                    existing.update(new, overwrite=True)
            else:
                fig.data = ()
        if not same_shape:
            fig.add_traces(data.traces)
            for t in fig.data:
                t.on_click(self._on_timeline_click)
        with fig.batch_update():
            fig.layout.xaxis.update(title_text=data.x_title,
                                    range=[data.x_range[0] / data.scale, data.x_range[1] / data.scale])
            # binary units on the byte axis, as everywhere else (plotly's ".3s" would say "8.39MB")
            if data.y_range is not None:
                vals, text = binary_ticks(*data.y_range)
                fig.layout.yaxis.update(title_text=data.y_title, range=list(data.y_range), tickvals=vals,
                                        ticktext=text, autorange=False)
            else:
                top = max((float(np.nanmax(t["y"])) for t in data.traces if len(t.get("y", [])) and
                           t.get("type") == "scattergl"), default=1.0)
                vals, text = binary_ticks(0.0, top)
                fig.layout.yaxis.update(title_text=data.y_title, range=None, autorange=True, tickvals=vals,
                                        ticktext=text)

    def _status(self, geom, mask, data):
        lo, hi = geom.to_time(np.array(data.x_range), self.state.axis)
        text = (f"<b>{safe(self.state.device)}</b>: {int(mask.sum()):,} of {geom.n:,} blocks selected "
                f"({safe(format_bytes(float(geom.size[mask].sum())))} allocated in total), "
                f"{safe(format_ns(lo))} to {safe(format_ns(hi))}")
        if self.state.view == "blocks":
            text += (f"; {data.drawn:,} drawn one by one, {data.rastered:,} aggregated below pixel size, "
                     f"{data.accesses_shown:,} access marks")
            missing = int(np.isnan(geom.y0).sum())
            if missing:
                text += f"; {missing:,} blocks have no address (see the stacked view)"
        self.status.value = text

    def _draw_ati(self, geom, mask):
        from memlens.widgets.ati_panel import ati_figure, ati_summary_html, filtered_intervals, selection_intervals
        intervals = self.intervals()
        if intervals is None:
            self.ati_summary.value = ("<i>This trace records no accesses (its source sees only allocations and "
                                      "frees), so there are no access time intervals to show.</i>")
            return
        t_range = None if self.state.x_range is None else tuple(geom.to_time(np.array(self.state.x_range),
                                                                             self.state.axis))
        st = self.state
        key = (st.device, st.categories, st.module, st.min_size, t_range, st.bandwidth, self.w_ecdf.value)
        if key == self._ati_key:   # view, axis or colour changes leave the selection's intervals as they were
            return
        self._ati_key = key
        selected = selection_intervals(intervals, geom, mask, t_range)
        self.ati_summary.value = ati_summary_html(filtered_intervals(selected, self.state.bandwidth))
        self.ati_figure = ati_figure(selected, self.state.bandwidth, as_ecdf=self.w_ecdf.value)
        show_figure(self.ati_output, self.ati_figure)


def show_figure(output: W.Output, fig, *more) -> None:
    """Show `fig` (and `more` figures below it) in `output` as plotly's JSON mime bundles (rendered by the
    notebook's plotly extension)."""
    output.outputs = tuple(
        {"output_type": "display_data", "metadata": {},
         "data": {"application/vnd.plotly.v1+json": json.loads(f.to_json()), "text/plain": "plotly figure"}}
        for f in (fig, *more))


def explore(trace, device: str | None = None) -> Explorer:
    """The explorer widget for `trace` (a Trace or anything `memlens.load` reads), on `device` (default:
    the device with the highest peak of live bytes)."""
    if not hasattr(trace, "blocks"):
        from memlens.io.detect import load
        trace = load(trace)
    return Explorer(trace, device=device)
