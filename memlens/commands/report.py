"""`memlens report TRACE -o report.html`: one self-contained HTML report (opens offline)."""
from __future__ import annotations

from memlens.commands import options


def register(sub) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML report of a trace",
                       description="Write one HTML file (plotly.js inlined, no network needed) with the summary, "
                                   "live memory, the peak, largest blocks, ATI and outliers, iterations, what-if "
                                   "comparisons and the trace metadata.")
    p.add_argument("trace", nargs="+",
                   help="a .memlens directory or any importable file; several (the ranks of a job) give one page "
                        "comparing their peaks, with a run selector")
    p.add_argument("-o", "--output", default=None, type=options.output_path,
                   help="HTML file to write (default: TRACE name + .html)")
    p.add_argument("--title", default=None, help="page title")
    p.add_argument("--bandwidth", default=None, type=options.bandwidth,
                   help="host<->device link for ATI/swapping (e.g. 25GB/s or a preset such as pcie4_x16)")
    p.add_argument("--x", choices=("time", "event"), default="time",
                   help="x axis of time plots: wall-clock time or event index")
    p.add_argument("--sections", default=None, type=options.name_list(),
                   help="comma-separated subset of sections (summary,live,peak,largest,allocator,timeline,ati,"
                        "outliers,iterations,whatif,metadata)")
    p.add_argument("--no-whatif", action="store_true", help="skip the what-if simulations (faster)")
    p.add_argument("--memory-limit", default=None, type=options.positive_size, help="memory limit for the swapping what-if (e.g. 2GB)")
    p.add_argument("--source-root", default=None, metavar="DIR",
                   help="show the source line of each allocation site, finding the frames' files under DIR; "
                        "without it, the files where the frames point are read when present")
    p.add_argument("--json", action="store_true", help="print the path and each section's status as JSON")
    from memlens.commands._engine import add_engine_options
    options.add_categories_option(p)
    add_engine_options(p)  # dask: the sections from out-of-core aggregates, whole-trace what-ifs on a window
    from memlens.commands._device import add_gpu_option
    add_gpu_option(p)
    p.set_defaults(func=run)


def _default_output(trace_path: str) -> str:
    import os
    base = os.path.basename(os.path.normpath(trace_path))
    for suffix in (".memlens", ".pickle", ".json.gz", ".json", ".csv", ".gz"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return f"{base or 'trace'}.html"


def run(args) -> int:
    import sys

    from memlens.io import load
    from memlens.reporting import build_report

    if len(args.trace) > 1:
        if args.categories is not None:
            from memlens.errors import InputError
            raise InputError("--categories applies to the report of one trace (the page of several compares "
                             "their peaks, not categories)")
        return _run_many(args)
    args.trace = args.trace[0]
    from memlens.commands._engine import engine_for, require_in_memory
    if engine_for(args) == "dask":
        options.refuse_categories_out_of_core(args, "the report")
        return _run_out_of_core(args)
    require_in_memory(args.trace, "the report")
    from memlens.commands._device import on_measured_clock, source_gpu_of
    source = source_gpu_of(args)     # an unknown --source-gpu is refused before the trace is loaded
    if source is not None and not args.gpu:
        from memlens.errors import InputError
        raise InputError("--source-gpu says which GPU measured the profile; give the GPU to retime it onto with --gpu")
    if args.source_root is not None:
        from memlens.analysis.source import SourceReader
        SourceReader(args.source_root)  # a bad --source-root is refused before the trace is loaded
    progress = sys.stderr.isatty()
    if progress:
        print(f"loading {args.trace} ...", file=sys.stderr)
    trace = options.with_categories(load(args.trace), args.categories)
    sections = args.sections
    report_options = {"x": args.x, "whatif": not args.no_whatif}
    if args.bandwidth:
        report_options["bandwidth"] = args.bandwidth
    if args.memory_limit:
        report_options["memory_limit"] = args.memory_limit
    if args.gpu:
        report_options["gpu"] = args.gpu
        report_options["tf32"] = args.tf32
    if source is not None:
        report_options["source_gpu"] = source
        trace = on_measured_clock(trace, source, args.trace)
    if args.source_root is not None:
        report_options["source_root"] = args.source_root
    built = build_report(trace, title=args.title, sections=sections, progress=progress,
                         source_name=args.trace, **report_options)
    return _write(args, built)


def _run_out_of_core(args) -> int:
    """The report of a saved trace larger than memory: `memlens.reporting.outofcore`."""
    from memlens.commands._device import refuse_gpu_with_dask
    from memlens.commands._engine import runner_for
    from memlens.reporting.outofcore import build_report_out_of_core

    refuse_gpu_with_dask(args)
    report_options = {"x": args.x, "whatif": not args.no_whatif}
    if args.bandwidth:
        report_options["bandwidth"] = args.bandwidth
    if args.memory_limit:
        report_options["memory_limit"] = args.memory_limit
    with runner_for(args) as runner:
        built = build_report_out_of_core(args.trace, runner, title=args.title, sections=args.sections,
                                         source_name=args.trace, **report_options)
    return _write(args, built)


def _write(args, built) -> int:
    from memlens.commands._output import print_json
    from memlens.units import format_bytes

    out = built.write(args.output or _default_output(args.trace))
    if args.json:
        print_json({"path": str(out), "bytes": out.stat().st_size, "seconds": round(built.seconds, 3),
                    "sections": [s.to_dict() for s in built.sections]})
        return 0
    print(f"report: {out} ({format_bytes(out.stat().st_size)}, {built.seconds:.1f} s)")
    for s in built.sections:
        if s.status != "ok":
            print(f"  {s.key}: {s.status}: {s.message}")
    return 0


def _run_many(args) -> int:
    from memlens.commands._output import print_json
    from memlens.reporting.runs_page import DEFAULT_SECTIONS, build_runs_report
    from memlens.units import format_bytes

    sections = args.sections or DEFAULT_SECTIONS
    report_options = {"x": args.x, "whatif": not args.no_whatif}
    if args.bandwidth:
        report_options["bandwidth"] = args.bandwidth
    if args.memory_limit:
        report_options["memory_limit"] = args.memory_limit
    built = build_runs_report(args.trace, title=args.title, sections=sections, **report_options)
    out = built.write(args.output or "runs.html")
    if args.json:
        print_json({"path": str(out), "bytes": out.stat().st_size, "seconds": round(built.seconds, 3),
                    "runs": [{"run": r.name, "rank": r.rank, "path": r.path, "rank_source": r.rank_source}
                             for r in built.runset.runs],
                    "imbalance": built.runset.imbalance(), "sections": built.status()})
        return 0
    print(f"report: {out} ({format_bytes(out.stat().st_size)}, {len(built.runset)} runs, {built.seconds:.1f} s)")
    print(f"imbalance: {built.runset.imbalance()}")
    return 0
