"""The explorer widget: linked views of one trace (plotly FigureWidget + ipywidgets).

Every control changes an immutable `ExplorerState`; `Explorer.refresh` recomputes the screen-sized figure
data for that state (`memlens.widgets.timeline`) and the ATI panel, so zooming the timeline (a relayout
event), filtering, picking an iteration or recolouring updates everything together. The handlers are public
methods (`update`, `zoom`, `click`, `select_iteration`, `run_whatif`) so tests drive the widget without a
browser; the browser only adds the plotly events that call them. The controls are in
`memlens.widgets.controls`, the drawing of the timeline and status line in `memlens.widgets.drawing`.
"""
from __future__ import annotations

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from memlens.errors import InputError
from memlens.units import format_ns
from memlens.viz.labels import safe
from memlens.widgets.controls import ExplorerControls
from memlens.widgets.details import DETAILS_WIDTH_PX, PROMPT_HTML, block_details, details_html, hit_test, live_at, live_html
from memlens.widgets.drawing import block_hover_text, draw_timeline, show_figure, status_html, timeline_widget
from memlens.widgets.geometry import block_geometry
from memlens.widgets.state import ExplorerState, colour_groups, iteration_window, selection_mask
from memlens.widgets.timeline import PLOT_HEIGHT_PX, AccessMarks, blocks_view, stacked_view


def _default_device(trace) -> str:
    peaks = trace.peak_live_bytes()
    return max(peaks, key=lambda d: (peaks[d], d)) if peaks else "cpu"


class Explorer(ExplorerControls, W.VBox):
    """Interactive view of a Trace; see the module docstring. Build with `memlens.widgets.explore`."""

    def __init__(self, trace, device: str | None = None, advice=None):
        self.trace = trace
        self._geometry, self._marks, self._intervals = {}, {}, {}
        self._iterations = None
        self._busy = False
        self._ati_key = None      # what the ATI panel shows now (device, filters, time range, link, ECDF)
        self._stack_hover: dict = {}  # stack id -> hover text (`block_hover_text`)
        self.selected_block: int | None = None
        self.state = ExplorerState(device=device or _default_device(trace))
        geom = self.geometry()
        if geom.n and np.isnan(geom.y0).all():   # no addresses (e.g. 2021 Kineto files): only live memory
            self.state = self.state.with_(view="stacked")
        self.view_data = None
        self.timeline = timeline_widget()
        self.timeline.layout.on_change(self._on_relayout, "xaxis.range", "yaxis.range")
        self.timeline.layout.on_change(self._on_autorange, "xaxis.autorange")
        # only the timeline needs a FigureWidget (zoom and click events); the panels' figures are shown through
        # plotly's mimetype renderer in Output widgets, which avoids shipping plotly.js (5 MB) once per figure
        self.ati_figure, self.whatif_figure = go.Figure(), go.Figure()
        self.swap_figures: list = []  # the what-if's swap plan: load before/after, copy timeline
        self.ati_output = W.Output(layout=W.Layout(min_height="300px"))
        self.whatif_output = W.Output()
        self.details = W.HTML(PROMPT_HTML,
                              layout=W.Layout(width=f"{DETAILS_WIDTH_PX}px", flex=f"0 0 {DETAILS_WIDTH_PX}px",
                                              max_height=f"{PLOT_HEIGHT_PX + 95}px", overflow="auto"))
        self._build_controls()
        self.advice_panel = None
        if advice is not None:       # the advisor's frontier as a third tab (`memlens.widgets.advice_panel`)
            from memlens.widgets.advice_panel import explore_advice
            self.advice_panel = explore_advice(advice)
            self._panels.children = (*self._panels.children, self.advice_panel)
            self._panels.set_title(len(self._panels.children) - 1, "advice")
        super().__init__([self.status, self._controls, W.HBox([self.timeline, self.details],
                                                                   layout=W.Layout(flex_flow="row wrap")),
                          self._panels])
        self.add_class("memlens-explorer")
        self.refresh()

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
    def hover_text(self, geom, positions) -> list[str]:
        """Hover text of blocks (positions in `geom`): see `memlens.widgets.drawing.block_hover_text`."""
        return block_hover_text(self.trace, geom, positions, self._stack_hover)

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
            draw_timeline(self.timeline, data, self._on_timeline_click)
            self._sync_iteration_options()
            self._sync_controls()
            self.status.value = status_html(self.state, geom, mask, data)
            self._draw_ati(geom, mask)
        finally:
            self._busy = False

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


def explore(trace, device: str | None = None, advice=None) -> Explorer:
    """The explorer widget for `trace` (a Trace or anything `memlens.load` reads), on `device` (default:
    the device with the highest peak of live bytes); with `advice` (of `memlens.advise`), its frontier in
    an "advice" tab."""
    if not hasattr(trace, "blocks"):
        from memlens.io.detect import load
        trace = load(trace)
    return Explorer(trace, device=device, advice=advice)
