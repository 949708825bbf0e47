"""`Advice`: the verified plans of `memlens.advise`, ranked by the objective, with the table, the memory /
time frontier and, when nothing fits, how far the closest plan misses."""
from __future__ import annotations

from dataclasses import dataclass, field

OBJECTIVES = ("fit", "fastest_fit", "pareto")


def _n_changes(plan) -> int:
    return (len(plan.checkpoint) + bool(plan.conf) + bool(plan.strategy) + bool(plan.autocast)
            + len(plan.optimizer_kwargs) + (plan.micro_batch is not None))


def frontier(plans: list) -> list:
    """The plans no other plan beats on both device bytes needed and modeled step time (ties kept once),
    fastest first; plans without both figures are left out. When no plan has a modeled step time (a
    recording's allocator settings, replayed: they leave its kernels as they were), memory alone decides: the
    plan needing the least device memory (of equal ones, the one with the fewest changes)."""
    timed = [p for p in plans if p.error is None and p.step_ns is not None and p.device_bytes_needed is not None]
    if not timed:
        sized = [p for p in plans if p.error is None and p.device_bytes_needed is not None]
        return [min(sized, key=lambda p: (p.device_bytes_needed, _n_changes(p)))] if sized else []
    timed.sort(key=lambda p: (p.step_ns, p.device_bytes_needed, _n_changes(p)))
    out, least = [], None
    for p in timed:
        if least is None or p.device_bytes_needed < least:
            out.append(p)
            least = p.device_bytes_needed
    return out


def keep_frontier_traces(plans: list, baseline) -> None:
    """Drop (set to None) the trace of every plan of `plans` that is neither `baseline` nor on the memory /
    time frontier of `plans`; in place. The search calls it after each verified plan, so a trace goes as soon as
    a later plan beats its plan on both device memory and modeled step time (a beaten plan never returns to the
    frontier): at any moment at most the frontier so far and the baseline hold traces."""
    keep = {id(p) for p in frontier(plans)} | {id(baseline)}
    for p in plans:
        if id(p) not in keep:
            p.trace = None


def rank(plans: list, objective: str) -> list:
    """`plans` in the objective's order: fitting plans first (``"fit"``: fewest changes, then fastest;
    ``"fastest_fit"``: fastest; ``"pareto"``: only frontier plans, fastest), then the others, closest to
    fitting first, failed plans last."""
    pool = frontier(plans) if objective == "pareto" else [p for p in plans if p.error is None]
    fitting = [p for p in pool if p.fits]
    if objective == "fit":
        fitting.sort(key=lambda p: (_n_changes(p), p.step_ns or 0, p.device_bytes_needed))
    else:
        fitting.sort(key=lambda p: (p.step_ns or 0, p.device_bytes_needed))
    missing = sorted((p for p in pool if not p.fits), key=lambda p: (p.device_bytes_needed, p.step_ns or 0))
    failed = [p for p in plans if p.error is not None] if objective != "pareto" else []
    return fitting + missing + failed


@dataclass
class Advice:
    """The answer of `memlens.advise`: `plans` ranked by `objective`; `baseline` (the step as it is);
    `capacity` (bytes of device memory per GPU); `notes` (what could not be searched, and why; which step of the step function the peaks are)."""

    plans: list
    baseline: object
    capacity: int | None
    objective: str
    notes: list = field(default_factory=list)

    def __post_init__(self):
        keep_frontier_traces(self.plans, self.baseline)     # a trace is kept for the timeline of these only
        self.plans = rank(self.plans, self.objective)

    @property
    def best(self):
        """The first plan that fits (None when none does: see `closest` and `miss_bytes`)."""
        return next((p for p in self.plans if p.fits), None)

    @property
    def closest(self):
        """The plan needing the least device memory (the one to report when nothing fits)."""
        ok = [p for p in self.plans if p.error is None and p.device_bytes_needed is not None]
        return min(ok, key=lambda p: p.device_bytes_needed) if ok else None

    @property
    def miss_bytes(self) -> int:
        """Bytes by which the closest plan misses the capacity (0 when a plan fits or no capacity was given)."""
        c = self.closest
        if self.best is not None or c is None or self.capacity is None:
            return 0
        return max(int(c.device_bytes_needed - self.capacity), 0)

    def frontier(self) -> list:
        """The memory / time Pareto frontier of the verified plans, fastest first."""
        return frontier(self.plans)

    def table(self):
        """One row per ranked plan (``pandas.DataFrame``): changes, peak_allocated, peak_reserved,
        device_bytes_needed (bytes per rank, the largest over the ranks), fits, step_ns, baseline_step_ns,
        delta_ns (modeled, ns), recompute_ns (the solver's estimate), error."""
        import pandas as pd
        return pd.DataFrame(self.rows())

    def rows(self) -> list[dict]:
        """The rows of `table` as plain Python values (None where a figure is missing)."""
        def num(v):
            return None if v is None else int(v)
        return [{"changes": p.changes, "peak_allocated": num(p.peak_allocated), "peak_reserved": num(p.peak_reserved),
                 "device_bytes_needed": num(p.device_bytes_needed), "fits": None if p.fits is None else bool(p.fits),
                 "step_ns": num(p.step_ns), "baseline_step_ns": num(p.baseline_step_ns), "delta_ns": num(p.delta_ns),
                 "recompute_ns": num(p.recompute_ns), "error": p.error} for p in self.plans]

    def to_dict(self) -> dict:
        """The advice as JSON-ready data (bytes, ns): ``summary``, ``capacity``, ``objective``, ``plans`` (`rows`, in
        rank order), ``best`` (the best plan's row with ``rank``, 1-based,
        and ``snippet``; None when no plan fits), ``best_snippet``, ``miss_bytes`` and ``notes``."""
        rows = self.rows()
        best = None
        if self.best is not None:
            i = next(i for i, p in enumerate(self.plans) if p is self.best)
            best = {"rank": i + 1, **rows[i], "snippet": self.best.snippet}
        return {"summary": self.summary(), "capacity": self.capacity, "objective": self.objective, "plans": rows,
                "best": best, "best_snippet": None if best is None else best["snippet"],
                "miss_bytes": self.miss_bytes, "notes": list(self.notes)}

    def summary(self) -> str:
        """The verdict in one or two sentences, from the same plans as `table`."""
        from memlens.units import format_bytes
        cap = "the GPU's memory" if self.capacity is None else format_bytes(self.capacity)
        if self.best is not None:
            b = self.best
            retry = ("; past the limit the allocator frees its cached blocks and retries, as torch's does"
                     if self.capacity is not None and b.device_bytes_needed > self.capacity else "")
            step = ("" if b.step_ns is None else
                    f"; modeled step {_ms(b.step_ns)} against {_ms(b.baseline_step_ns)} as it is")
            return (f"fits {cap}: {b.changes} (peak allocated {format_bytes(b.peak_allocated)} per GPU, "
                    f"{format_bytes(b.device_bytes_needed)} of device memory with no limit{retry}{step})")
        c = self.closest
        if c is None:
            return "no plan could be predicted"
        return (f"no plan fits {cap}: the closest, {c.changes}, needs {format_bytes(c.device_bytes_needed)} per "
                f"GPU, {format_bytes(self.miss_bytes)} too much")


def _ms(ns) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:.2f} ms"
