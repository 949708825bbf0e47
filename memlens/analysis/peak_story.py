"""The peak story of a trace: what `memlens info --json` and the MCP server's ``info`` tool tell about its peak.

One composition of the analyses below it (peak cause, the top allocation sites with their source lines, the
iterations, the phases), kept here so that both the CLI and the MCP server read it from the analysis layer."""
from __future__ import annotations


def peak_story(trace, source_root=None, reader=None) -> dict:
    """The ``peak`` / ``iterations`` / ``phases`` part of ``info --json`` (see the issue-17 contract):
    per device allocated and reserved bytes at the peak, bytes by category, the cause sentence and the top
    allocation sites (each with ``source``, its line's text, when the file is found under `source_root` or
    where the frame points; `reader`, a `SourceReader`, replaces both); the number of iterations; the phases (ns since the trace start)."""
    from memlens.analysis.iterations import split_iterations
    from memlens.analysis.peak_cause import peak_cause
    from memlens.analysis.phases import trace_phases
    from memlens.analysis.source import SourceReader, top_site_sources

    its = split_iterations(trace)
    phases = [{"name": str(p["name"]), "start_ns": int(p["start_ns"]), "end_ns": int(p["end_ns"]),
               "source": str(p.get("source", ""))} for p in trace_phases(trace)]
    peak = {dev: c.to_dict() for dev, c in peak_cause(trace).items()}
    reader = reader or SourceReader(source_root)
    for cause in peak.values():
        top_site_sources(trace, cause["top_sites"], reader=reader)
    return {"peak": peak,
            "iterations": 0 if str(its["source"].iloc[0]) == "none" else int(len(its)),
            "iteration_source": str(its["source"].iloc[0]), "phases": phases}
