"""The explorer's filter state and what it selects: pure functions, testable without a browser.

`ExplorerState` holds every control's value; `selection_mask` turns it into a boolean mask over a
device's `BlockGeometry`; `colour_groups` assigns each selected block a colour group (the largest groups
by bytes get their own colour, the rest share "other").
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from memlens.trace import CATEGORIES
from memlens.viz.labels import color_for
from memlens.widgets.geometry import BlockGeometry, Factor

AXES = ("time", "event")
VIEWS = ("blocks", "stacked")
COLOUR_BY = ("category", "module", "op")
MAX_COLOUR_GROUPS = 10   # the 9 largest groups by bytes + "other"

@dataclass(frozen=True)
class ExplorerState:
    """Every control of the explorer. Ranges are on the current x axis (ns or event index); None = all."""

    device: str
    axis: str = "time"
    view: str = "blocks"
    colour_by: str = "category"
    categories: tuple[str, ...] | None = None
    module: str = ""                  # module path prefix: "model.layers.0" keeps its submodules too
    min_size: int = 0                 # bytes
    iteration: int | None = None
    x_range: tuple[float, float] | None = None
    y_range: tuple[float, float] | None = None
    bandwidth: str = "pcie4_x16"      # link for the ATI threshold: a preset name or "25GB/s"

    def with_(self, **changes) -> "ExplorerState":
        """A copy with `changes` applied (the state is immutable so that handlers can compare states)."""
        return replace(self, **changes)


def module_matches(names: np.ndarray, prefix: str) -> np.ndarray:
    """Mask over distinct module `names`: equal to `prefix` or inside it (``prefix.child``)."""
    prefix = prefix.strip().rstrip(".")
    if not prefix:
        return np.ones(len(names), dtype=bool)
    return np.array([n == prefix or n.startswith(prefix + ".") for n in names], dtype=bool)


def factor_mask(factor: Factor, keep_names) -> np.ndarray:
    """Mask over blocks whose factor value is in `keep_names`."""
    keep = np.isin(factor.names, np.asarray(list(keep_names), dtype=object))
    return keep[factor.codes] if len(factor.codes) else np.zeros(0, dtype=bool)


def selection_mask(geom: BlockGeometry, state: ExplorerState) -> np.ndarray:
    """Blocks of `geom` kept by the category, module and minimum-size filters and the time range.

    The time range keeps blocks whose lifetime overlaps it (on the state's axis).
    """
    mask = geom.size >= state.min_size
    if state.categories is not None:
        mask &= factor_mask(geom.category, state.categories)
    if state.module.strip():
        mask &= module_matches(geom.module.names, state.module)[geom.module.codes]
    if state.x_range is not None:
        lo, hi = state.x_range
        mask &= (geom.x1(state.axis) > lo) & (geom.x0(state.axis) < hi)
    return mask


def colour_factor(geom: BlockGeometry, colour_by: str) -> Factor:
    """The factor that colours blocks: category, module or op."""
    if colour_by not in COLOUR_BY:
        raise ValueError(f"colour_by must be one of {COLOUR_BY}, not {colour_by!r}")
    return getattr(geom, colour_by)


def colour_groups(geom: BlockGeometry, colour_by: str, mask: np.ndarray | None = None):
    """Colour group per block, plus the groups' names and colours.

    The `MAX_COLOUR_GROUPS - 1` values holding the most bytes among the masked blocks keep their own
    group (categories in their canonical order, others by bytes); the rest form "other". Returns
    (group per block as int32, names (raw trace text: escape before display), colours).
    """
    factor = colour_factor(geom, colour_by)
    weights = geom.size if mask is None else np.where(mask, geom.size, 0.0)
    bytes_per = np.bincount(factor.codes, weights=weights, minlength=len(factor.names))
    ranked = [c for c in np.argsort(-bytes_per, kind="stable") if bytes_per[c] > 0]
    top = ranked[:MAX_COLOUR_GROUPS - 1] if len(ranked) > MAX_COLOUR_GROUPS else ranked
    if colour_by == "category":
        canonical = {name: i for i, name in enumerate(CATEGORIES)}
        top = sorted(top, key=lambda c: canonical.get(factor.names[c], len(canonical)))
    lookup = np.full(len(factor.names), len(top), dtype=np.int32)
    lookup[np.asarray(top, dtype=np.int64)] = np.arange(len(top), dtype=np.int32)
    names = [str(factor.names[c]) or "(unknown)" for c in top]
    if len(ranked) > len(top):
        names.append("other")
    colours = [color_for(name, i, colour_by) for i, name in enumerate(names)]
    group = lookup[factor.codes] if len(factor.codes) else np.zeros(0, dtype=np.int32)
    return group, names, colours


def iteration_window(iterations, iteration: int) -> tuple[int, int]:
    """[start_ns, end_ns) of iteration number `iteration` from a `split_iterations` frame."""
    row = iterations[iterations["iteration"] == iteration]
    if len(row) == 0:
        raise ValueError(f"no iteration {iteration} (known: {iterations['iteration'].tolist()})")
    return int(row["start_ns"].iloc[0]), int(row["end_ns"].iloc[0])
