"""The multi-run report for a per-rank prediction: ``memlens predict --world-size N --report ranks.html``.

One page (`memlens.reporting.runs_page`) with a run per rank that was predicted by its own run, a rank selector,
and notes saying that the page is a prediction on the modeled GPU clock and which predicted rank stands for
the ranks not run. The peaks shown are the prediction's own (the caching-allocator replay on the modeled GPU:
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` as predicted), not re-derived from the traces.
"""
from __future__ import annotations

import os
import shutil
import tempfile


def stands_for_notes(prediction) -> list[str]:
    """One sentence per predicted rank that stands for others: ``rank 0 stands for ranks 1, 2`` ."""
    covered: dict[int, list[int]] = {}
    for r in prediction.results:
        if not r.ran:
            covered.setdefault(r.stands_for, []).append(r.rank)
    return [f"rank {src} stands for rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} "
            f"(not run: {prediction.symmetry or 'assumed alike'})" for src, others in sorted(covered.items())]


NOT_SAVED = "not saved (memlens predict --out DIR keeps the rank traces)"


def build_predicted_ranks_report(prediction, *, directory: str, title: str | None = None, saved: dict | None = None,
                                 temporary: bool = False, **options):
    """Build the multi-run report of a `DistributedPrediction`: each rank that ran becomes one run of the
    page, read from its saved trace (`saved`: {rank: path} the caller wrote) or else saved to
    ``directory/rank<r>.memlens`` (the report loads runs from files). `temporary`: `directory` is deleted
    once the page is built, so the page names no path there (`NOT_SAVED` instead). Returns the
    `memlens.reporting.runs_page.RunsReport`. `options` go to `build_runs_report`."""
    from memlens.analysis.runs import Run, RunSet
    from memlens.errors import InputError
    from memlens.reporting.runs_page import build_runs_report
    if prediction.errors:
        raise InputError("no report: the code failed on rank(s) "
                         f"{', '.join(map(str, sorted(prediction.errors)))}, so nothing was predicted")
    runs, shown = [], {}
    for rank, p in sorted(prediction.predictions.items()):
        path = (saved or {}).get(rank)
        if path is None or not os.path.exists(path):
            path = os.path.join(directory, f"rank{rank}.memlens")
            p.trace.metadata["rank"] = rank
            p.trace.save(path)
            if temporary:
                shown[path] = NOT_SAVED
        runs.append(Run(path, rank, "prediction"))
    runset = RunSet(runs)
    peaks = runset.peaks()
    by_rank = {r.rank: r for r in prediction.results}
    gpu_rows = peaks["device"].astype(str) == "cuda:0"
    # the prediction's allocator replay, not the traces' requested bytes: the numbers `memlens predict` prints
    peaks.loc[gpu_rows, "allocated_bytes"] = [by_rank[r].peak_allocated for r in peaks.loc[gpu_rows, "rank"]]
    peaks.loc[gpu_rows, "reserved_bytes"] = [by_rank[r].peak_reserved for r in peaks.loc[gpu_rows, "rank"]]
    notes = [f"Predicted, not measured: {prediction.world_size} ranks on {prediction.gpu} under torch's fake "
             "process group; times are on the modeled GPU clock; peaks are the caching-allocator replay's "
             "(predicted max_memory_allocated / max_memory_reserved)."]
    notes += stands_for_notes(prediction)
    stages = getattr(prediction, "stages", {})
    if stages:
        notes.append("Pipeline stages (torch.distributed.pipelining), each rank run on its own: " + "; ".join(
            f"rank {r}: stage {', '.join(map(str, s))}" for r, s in sorted(stages.items())) + ".")
    notes += [f"note: {n}" for n in prediction.notes]
    report = build_runs_report(runset, title=title or f"memlens prediction: {prediction.world_size} ranks on "
                                                      f"{prediction.gpu} (modeled clock)", shown_paths=shown,
                               **options)
    report.notes, report.peaks = notes, peaks
    return report


def write_predicted_ranks_report(prediction, path, *, title: str | None = None, saved: dict | None = None,
                                 **options) -> str:
    """Write the report of `prediction` (a `DistributedPrediction`) to `path` (HTML, atomic). The page names
    the ranks' traces the caller saved (`saved`: {rank: path}); the others live in a temporary directory
    only while the page is built, and the page says they were not saved. Returns the path."""
    directory = tempfile.mkdtemp(prefix="memlens-ranks-")
    try:
        report = build_predicted_ranks_report(prediction, directory=directory, title=title, saved=saved,
                                              temporary=True, **options)
        return report.write(path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
