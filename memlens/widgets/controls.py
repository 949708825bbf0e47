"""The explorer's controls: which widgets set the view, how their changes reach the state, and how the state
is shown back in them.

`ExplorerControls` is mixed into `memlens.widgets.explorer.Explorer`, which provides ``trace``, ``state``,
``iterations()`` and the handlers the controls call (``update``, ``select_iteration``, ``zoom``,
``run_whatif``). Each control's observer turns a change into one handler call; `_sync_controls` sets the
controls from the state after a handler changed it, with the observers held off.
"""
from __future__ import annotations

import ipywidgets as W
import numpy as np

from memlens.errors import InputError
from memlens.trace import CATEGORIES
from memlens.units import parse_bytes
from memlens.viz.labels import safe
from memlens.widgets.state import AXES, COLOUR_BY, VIEWS

ALL = -1   # the iteration selector's "all" (ipywidgets treats a None value as no selection)
LABEL = {"description_width": "initial"}  # a label as wide as its text (the default box cut labels off)


class ExplorerControls:
    """The explorer's control widgets (``w_*``, ``status``, ``ati_summary``, ``whatif_result``) and their
    observers; see the module docstring for what the host class provides."""

    _syncing = False     # True while controls are set from the state (their observers must not fire)

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
        self._panels.set_title(0, "intervals (ATI)")
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

    def _sync_iteration_options(self):
        its = self.iterations()
        options = [("all", ALL)] + [(f"{int(k)}", int(k)) for k in its["iteration"] if k >= 0]
        if list(self.w_iteration.options) != options and its["source"].iloc[0] != "none":
            self.w_iteration.options = options
