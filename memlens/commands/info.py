"""`memlens info TRACE [TRACE ...] [--json]`: what a trace holds, its peak live and reserved bytes per device,
what caused the peak, its iterations and phases.

With several files (the ranks of one job, or runs to compare) it prints each one's summary and how far
apart their peaks are (`memlens.load_many`)."""
from __future__ import annotations

from memlens.analysis.peak_story import peak_story
from memlens.commands._engine import add_engine_options, engine_for, runner_for
from memlens.errors import printable


def register(sub) -> None:
    p = sub.add_parser("info", help="summarise a trace (any supported format), or several",
                       description="Print blocks, accesses, ops, devices, duration, peak live and reserved bytes, what "
                                   "caused the peak and where it was allocated, iterations and phases. With several "
                                   "files: each one's summary, its rank, and the imbalance of the peaks.")
    p.add_argument("trace", nargs="+", help="a .memlens directory or any importable file (several allowed)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    from memlens.commands.options import add_categories_option
    add_categories_option(p)
    p.add_argument("--source-root", default=None, metavar="DIR",
                   help="show each top site's source line, finding the frames' files under DIR (by the longest "
                        "tail of their path); without it, the files where the frames point are read when present")
    add_engine_options(p)
    p.set_defaults(func=run)


def _summary(args, path) -> dict:
    """The summary of one file; in memory it also carries the peak story (cause, sites, iterations, phases)."""
    from argparse import Namespace
    one = Namespace(**{**vars(args), "trace": path})
    if engine_for(one) == "dask":
        from memlens.commands.options import refuse_categories_out_of_core
        refuse_categories_out_of_core(args, "info")
        from memlens.analysis.outofcore import engine
        with runner_for(one) as runner:
            return engine.summary(path, runner)
    from memlens.commands.options import with_categories
    from memlens.io import load
    if getattr(args, "source_root", None) is not None:
        from memlens.analysis.source import SourceReader
        SourceReader(args.source_root)  # a bad --source-root is refused before the file is loaded
    trace = with_categories(load(path), getattr(args, "categories", None))
    told = {**trace.summary(), **peak_story(trace, getattr(args, "source_root", None))}
    if "categories" in trace.metadata:  # the user's rules decided the categories
        told["categories"] = trace.metadata["categories"]
    return told


def _say(text: str) -> None:
    """One line of the text summary, with control and bidi characters from the file (frame names,
    unrecognised actions, phase names) written as escapes, so that a trace cannot drive the terminal."""
    print(printable(text))


def _print(path: str, s: dict) -> None:
    from memlens.units import format_bytes, format_ns
    _say(f"trace:     {path} ({s['source_kind']})")
    _say(f"blocks:    {s['blocks']:,}  (alive at end {s['alive_at_end']:,}, allocated before recording "
          f"{s['allocated_before']:,}, freed without alloc {s['free_without_alloc']:,})")
    _say(f"accesses:  {s['accesses']:,}" + ("" if s["has_accesses"] else "  (this source records none)"))
    _say(f"ops:       {s['ops']:,}")
    from memlens.clock import clock_label
    _say(f"duration:  {format_ns(s['duration_ns'])} on the {clock_label(s.get('clock') or {'kind': 'host'})}")
    if s.get("categories"):
        _say(f"categories: by {len(s['categories']['rules'])} rule(s) of {s['categories']['source']}")
    for dev, peak in s["peak_live_bytes"].items():
        _say(f"peak live: {dev}: {format_bytes(peak)} ({peak:,} bytes)")
        cause = s.get("peak", {}).get(dev)
        if cause is None:
            continue
        if cause["reserved_bytes"] is not None:
            _say(f"reserved:  {dev}: peak {format_bytes(cause['reserved_bytes'])} "
                  f"({cause['reserved_bytes']:,} bytes; memory reserved before recording included)")
        _say(f"cause:     {cause['cause']}")
        for site in cause["top_sites"][:5]:
            _say(f"site:      {format_bytes(site['bytes']):>10}  {site['site']}")
            if site.get("source"):
                _say(f"           {'':>10}  | {site['source']}")
    if "iterations" in s:  # the out-of-core summary has no peak story
        _say(f"iterations: {s['iterations']}" + (f" ({s['iteration_source']})" if s["iterations"] else ""))
    if s.get("phases"):
        names = [p["name"] for p in s["phases"]]
        _say(f"phases:    {len(names)}: " + ", ".join(names[:8]) + (" ..." if len(names) > 8 else ""))
    for note in s["notes"]:
        _say(f"note:      {note}")


def run(args) -> int:
    from memlens.commands._output import print_json

    if len(args.trace) == 1:
        s = _summary(args, args.trace[0])
        if args.json:
            print_json(s)
        else:
            _print(args.trace[0], s)
        return 0
    from argparse import Namespace

    from memlens.analysis.runs import imbalance_sentence, imbalance_stats, load_many, peaks_frame
    runs = load_many(args.trace)
    engines = [engine_for(Namespace(**{**vars(args), "trace": r.path})) for r in runs.runs]
    # one parallel load per file gives the summary and the peak breakdown (of memlens's own categories)
    if "dask" not in engines and getattr(args, "categories", None) is None:
        summaries = list(zip(runs.runs, runs.summaries()))
        peaks = runs.peaks()
    else:  # out of core or re-categorised: the peaks come from each file's own summary
        summaries = [(r, _summary(args, r.path)) for r in runs.runs]
        peaks = peaks_frame([{"run": r.name, "rank": r.rank, "path": r.path, "device": dev, "allocated_bytes": b,
                              "rank_source": r.rank_source}
                             for r, s in summaries for dev, b in s["peak_live_bytes"].items()])
    stats = imbalance_stats(peaks)
    imbalance = imbalance_sentence(stats)
    if args.json:
        print_json({"runs": [{"path": r.path, "rank": r.rank, "rank_source": r.rank_source, **s}
                             for r, s in summaries],
                    "peaks": peaks.astype(object).where(peaks.notna(), None).to_dict(orient="records"),
                    "imbalance": imbalance, "imbalance_stats": stats})
        return 0
    for r, s in summaries:
        _say(f"== {r.name} (rank from {r.rank_source})")
        _print(r.path, s)
    _say(f"imbalance: {imbalance}")
    return 0
