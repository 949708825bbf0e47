"""Per-block ATI across iterations: the same logical block in every step, and how stable its idle time is.

Li et al. ("Pinpointing the Memory Behaviors of DNN Training") show that the access pattern repeats every
iteration *per block*: the same tensor is idle for the same time in each step. To see that, each block must
be matched with itself in the other steps:

- a block alive across iterations (parameters, optimizer state, buffers) is the same allocation in every
  step: its logical id is its block id;
- a block allocated inside an iteration (activations, gradients, temporaries) is matched by what allocated
  it: the k-th allocation of the same (op, size, category, module) within the iteration is the same
  logical block in every step.

Its ATIs (`memlens.analysis.ati.access_intervals`, placed in the iteration where they start) are then
compared step by step: ``cv`` is the coefficient of variation of the per-iteration total idle time and
``stability`` = ``max(0, 1 - cv)`` (1: idle exactly as long in every step).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.analysis.ati import access_intervals, ati_only, iteration_of

KEY_COLUMNS = ("op", "size", "category", "module")


def logical_blocks(trace, iterations: pd.DataFrame) -> pd.DataFrame:
    """One row per block: ``block_id``, ``iteration`` (where it was allocated; -1 before the first or when
    alive before recording), ``logical_id`` (int: the same for the same logical block in every step) and
    ``persistent`` (alive across an iteration boundary and allocated before the first iteration's end)."""
    b = trace.blocks
    lo, hi = trace.time_span_ns()
    alloc = b["alloc_ns"].fillna(lo).to_numpy(np.int64)
    free = b["free_ns"].fillna(hi + 1).to_numpy(np.int64)
    it_alloc = iteration_of(alloc, iterations)
    it_alloc = np.where(b["alloc_ns"].notna().to_numpy(), it_alloc, -1)
    starts = iterations["start_ns"].to_numpy(np.int64)
    # alive across at least one iteration start after its allocation: the same allocation in several steps
    crosses = np.searchsorted(starts, free, side="left") - np.searchsorted(starts, alloc, side="right") > 0
    first_end = int(iterations["end_ns"].iloc[0]) if len(iterations) else hi
    persistent = crosses & (alloc < first_end) | (it_alloc < 0)
    key = pd.DataFrame({c: b[c].to_numpy() for c in KEY_COLUMNS if c in b.columns})
    key["iteration"] = it_alloc
    cols = [c for c in KEY_COLUMNS if c in key.columns]
    key["occurrence"] = 0
    # allocation order within each iteration (time, then the trace's event order)
    ranked = key.iloc[np.lexsort((b["alloc_seq"].fillna(-1).to_numpy(np.int64), alloc, it_alloc))]
    key.loc[ranked.index, "occurrence"] = ranked.groupby(cols + ["iteration"], sort=False).cumcount().to_numpy()
    sig = pd.MultiIndex.from_frame(key[cols + ["occurrence"]].astype(str))
    codes, _ = pd.factorize(sig)
    ids = b["block_id"].to_numpy(np.int64)
    n_sig = int(codes.max()) + 1 if len(codes) else 0
    logical = np.where(persistent, n_sig + np.arange(len(b)), codes)
    return pd.DataFrame({"block_id": ids, "iteration": it_alloc, "logical_id": logical.astype(np.int64),
                         "persistent": persistent})


def per_block_ati(trace, iterations: pd.DataFrame | None = None, intervals: pd.DataFrame | None = None,
                  steady_state: bool = False) -> pd.DataFrame:
    """ATIs of each logical block in each iteration: one row per (logical_id, iteration) with ``block_id``
    (that step's allocation), ``size``, ``category``, ``op``, ``module``, ``persistent``, ``atis`` (count),
    ``idle_ns`` (their total), ``median_ns`` and ``max_ns``. `steady_state` adds the wrap-around intervals
    (`access_intervals`); `intervals` may be passed when the caller has them."""
    from memlens.analysis.iterations import split_iterations
    its = split_iterations(trace) if iterations is None else iterations
    its = its.sort_values("start_ns").reset_index(drop=True)
    iv = ati_only(access_intervals(trace, steady_state=steady_state, iterations=its)
                  if intervals is None else intervals)
    logical = logical_blocks(trace, its)
    frame = pd.DataFrame({"block_id": iv["block_id"].to_numpy(np.int64),
                          "iteration": iteration_of(iv["start_ns"].to_numpy(np.int64), its),
                          "length_ns": iv["length_ns"].to_numpy(np.int64)})
    frame = frame[frame["iteration"] >= 0]
    frame = frame.merge(logical[["block_id", "logical_id", "persistent"]], on="block_id", how="left")
    g = frame.groupby(["logical_id", "iteration"], sort=True)
    out = pd.DataFrame({"block_id": g["block_id"].first(), "atis": g["length_ns"].size(),
                        "idle_ns": g["length_ns"].sum(), "median_ns": g["length_ns"].median(),
                        "max_ns": g["length_ns"].max(), "persistent": g["persistent"].first()}).reset_index()
    attrs = trace.blocks.drop_duplicates("block_id").set_index("block_id")
    for col in ("size", "category", "op", "module"):
        if col in attrs.columns:
            out[col] = attrs[col].reindex(out["block_id"]).to_numpy()
    out.attrs["iterations"] = int(len(its))
    out.attrs["iteration_source"] = str(its["source"].iloc[0]) if len(its) else "none"
    return out


def block_stability(trace, iterations: pd.DataFrame | None = None, per_block: pd.DataFrame | None = None,
                    steady_state: bool = False, skip_warmup: bool = True) -> pd.DataFrame:
    """How stable each logical block's idle time is across iterations, one row per logical block, least
    stable first: ``logical_id``, ``block_id`` (its allocation in the first step it appears), ``size``,
    ``category``, ``op``, ``module``, ``persistent``, ``iterations`` (steps with an ATI), ``atis_per_step``
    (median count), ``same_count`` (the same number of ATIs in every step), ``mean_idle_ns`` /
    ``std_idle_ns`` (per-step total idle time), ``cv`` and ``stability`` (see the module docstring).
    Only blocks seen in at least two steps are scored (the others get NaN). `skip_warmup` leaves the first
    iteration out when there are at least three (it creates the optimizer state and warms caches up)."""
    pb = per_block_ati(trace, iterations, steady_state=steady_state) if per_block is None else per_block
    if skip_warmup and pb.attrs.get("iterations", 0) >= 3 and len(pb):
        attrs = dict(pb.attrs)
        pb = pb[pb["iteration"] != pb["iteration"].min()]
        pb.attrs.update(attrs)
    g = pb.groupby("logical_id", sort=False)
    idle = g["idle_ns"]
    out = pd.DataFrame({"block_id": g["block_id"].first(), "persistent": g["persistent"].first(),
                        "iterations": g.size(), "atis_per_step": g["atis"].median(),
                        "same_count": g["atis"].nunique() == 1,
                        "mean_idle_ns": idle.mean(), "std_idle_ns": idle.std(ddof=0)})
    for col in ("size", "category", "op", "module"):
        if col in pb.columns:
            out[col] = g[col].first()
    mean = out["mean_idle_ns"].to_numpy(np.float64)
    std = out["std_idle_ns"].to_numpy(np.float64)
    cv = np.where(mean > 0, std / np.where(mean > 0, mean, 1), 0.0)
    cv = np.where(out["iterations"].to_numpy() >= 2, cv, np.nan)
    out["cv"] = cv
    out["stability"] = np.clip(1 - cv, 0, 1)
    out = out.reset_index().sort_values(["stability", "size"], ascending=[True, False], na_position="last")
    out.attrs.update(pb.attrs)
    return out.reset_index(drop=True)
