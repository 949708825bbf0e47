"""Notebook widgets: `explore(trace)` returns the linked explorer (timeline, filters, details, ATI, what-if).

    import memlens.widgets
    memlens.widgets.explore(trace)          # or, after %load_ext memlens, just evaluate `trace`

The widget's logic lives in plain modules (`state`, `geometry`, `lod`, `timeline`, `details`, `ati_panel`,
`whatif_panel`) so it runs and is tested without a browser; `explorer` wires it to ipywidgets and plotly.
"""
from __future__ import annotations


def explore(trace, device: str | None = None):
    """The explorer widget for `trace` (a Trace or a path `memlens.load` reads); see `memlens.widgets.explorer`."""
    from memlens.widgets.explorer import explore as _explore
    return _explore(trace, device=device)


__all__ = ["explore"]
