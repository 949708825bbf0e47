"""`memlens info TRACE [--json]`: what a trace holds, and its peak live bytes per device."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("info", help="summarise a trace (any supported format)",
                       description="Print blocks, accesses, ops, devices, duration, peak live and reserved bytes, what "
                                   "caused the peak and where it was allocated, iterations and phases.")
    p.add_argument("trace", help="a .memlens directory or any importable file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def story(trace) -> dict:
    """The ``peak`` / ``iterations`` / ``phases`` part of ``info --json`` (see the issue-17 contract):
    per device allocated and reserved bytes at the peak, bytes by category, the cause sentence and the top
    allocation sites; the number of iterations; the phases (ns since the trace start)."""
    from memlens.analysis.iterations import split_iterations
    from memlens.analysis.peak_cause import peak_cause

    its = split_iterations(trace)
    phases = [{"name": str(p["name"]), "start_ns": int(p["start_ns"]), "end_ns": int(p["end_ns"]),
               "source": str(p.get("source", ""))} for p in trace.metadata.get("phases") or []]
    return {"peak": {dev: c.to_json() for dev, c in peak_cause(trace).items()},
            "iterations": 0 if str(its["source"].iloc[0]) == "none" else int(len(its)),
            "iteration_source": str(its["source"].iloc[0]), "phases": phases}


def run(args) -> int:
    from memlens.cli import print_json
    from memlens.io import load
    from memlens.units import format_bytes, format_ns

    trace = load(args.trace)
    s = trace.summary()
    told = story(trace)
    if args.json:
        print_json({**s, **told})
        return 0
    print(f"trace:     {args.trace} ({s['source_kind']})")
    print(f"blocks:    {s['blocks']:,}  (alive at end {s['alive_at_end']:,}, allocated before recording "
          f"{s['allocated_before']:,}, freed without alloc {s['free_without_alloc']:,})")
    print(f"accesses:  {s['accesses']:,}" + ("" if s["has_accesses"] else "  (this source records none)"))
    print(f"ops:       {s['ops']:,}")
    print(f"duration:  {format_ns(s['duration_ns'])}")
    for dev, peak in s["peak_live_bytes"].items():
        print(f"peak live: {dev}: {format_bytes(peak)} ({peak:,} bytes)")
        cause = told["peak"].get(dev)
        if cause is None:
            continue
        if cause["reserved_bytes"] is not None:
            print(f"reserved:  {dev}: peak {format_bytes(cause['reserved_bytes'])} "
                  f"({cause['reserved_bytes']:,} bytes; memory reserved before recording included)")
        print(f"cause:     {cause['cause']}")
        for site in cause["top_sites"][:5]:
            print(f"site:      {format_bytes(site['bytes']):>10}  {site['site']}")
    print(f"iterations: {told['iterations']}" + (f" ({told['iteration_source']})" if told["iterations"] else ""))
    if told["phases"]:
        names = [p["name"] for p in told["phases"]]
        print(f"phases:    {len(names)}: " + ", ".join(names[:8]) + (" ..." if len(names) > 8 else ""))
    for note in s["notes"]:
        print(f"note:      {note}")
    return 0
