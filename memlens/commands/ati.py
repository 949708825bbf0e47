"""`memlens ati TRACE [--json]`: the distribution of access time intervals (ATI) of a trace's blocks."""
from __future__ import annotations

from memlens.commands import options
from memlens.commands._cycle import add_cycle_args, cycle_kwargs, cycle_text, refuse_out_of_core
from memlens.commands._engine import add_engine_options, engine_for, runner_for


def register(sub) -> None:
    p = sub.add_parser("ati", help="access time intervals: how long blocks sit between accesses",
                       description="Quantiles and a log-binned histogram of every block's access time "
                                   "intervals (ATI: from the end of the op of one access to the start of the op "
                                   "of the next), with the lifetime edges (alloc -> first access, last access "
                                   "-> free) beside them. Needs a trace with accesses (recorded by memlens).")
    p.add_argument("trace", help="a .memlens directory or any importable file")
    p.add_argument("--device", help="only blocks of this device (e.g. cuda:0)")
    p.add_argument("--by", choices=["kind", "category", "module", "op", "size_class", "iteration", "device"],
                   help="also break the statistics down by this attribute")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_engine_options(p)
    from memlens.commands._device import add_gpu_option
    add_gpu_option(p)
    add_cycle_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.analysis.ati import access_intervals, ati_by, ati_only, ati_stats
    from memlens.analysis.clock import describe_clock
    from memlens.analysis.distributions import log_histogram
    from memlens.commands._output import print_json
    from memlens.errors import NeedsAccessesError
    from memlens.io import load
    from memlens.units import format_ns

    from memlens.trace import clock_of
    from memlens.commands._device import apply_gpu, file_clock, refuse_gpu_with_dask

    trace = None
    if engine_for(args) == "dask":
        from memlens.analysis.outofcore import engine
        from memlens.errors import InputError
        refuse_gpu_with_dask(args)
        refuse_out_of_core(args)
        if args.by:
            raise InputError("--by is not available with the dask engine yet (it needs every group's intervals "
                             "at once); use --engine memory")
        with runner_for(args) as runner:
            stats = engine.ati(args.trace, runner, device=args.device)
        hist = stats.pop("histogram")
        extra = {"accesses_outside_lifetime": stats.pop("accesses_outside_lifetime"),
                 "overlapping_ops": stats.pop("overlapping_ops"), "window_ns": None, "iteration_source": None}
        groups = None
    else:
        trace = load(args.trace)
        options.check_device(trace, args.device)
        trace, _ = apply_gpu(trace, args)
        try:
            iv = access_intervals(trace, device=args.device, **cycle_kwargs(args))
        except NeedsAccessesError as exc:
            raise NeedsAccessesError(exc.message, args.trace) from None
        stats = ati_stats(iv)
        hist = log_histogram(ati_only(iv)["length_ns"].to_numpy(), per_decade=1)
        extra = {"accesses_outside_lifetime": iv.attrs.get("accesses_outside_lifetime", 0),
                 "overlapping_ops": iv.attrs.get("overlapping_ops", 0),
                 "window_ns": iv.attrs.get("window_ns"), "iteration_source": iv.attrs.get("iteration_source")}
        groups = ati_by(trace, args.by, iv) if args.by else None
    if args.json:
        doc = {"clock": clock_of(trace) if trace is not None else file_clock(args.trace), "intervals": stats["count"], **stats,
               "histogram": hist.to_dict(orient="records"),
               "definition": "access->access: end of the op of one access to the start of the op of the next",
               **extra}
        if groups is not None:
            doc["by"] = {"key": args.by, "groups": groups.to_dict(orient="records")}
        print_json(doc)
        return 0
    print(f"clock: {describe_clock(stats['clock'])}; {cycle_text(stats)}")
    if stats["count"] == 0:
        print(f"{args.trace}: no access->access intervals (no block accessed twice"
              f"{' on ' + args.device if args.device else ''})")
    else:
        print(f"ATI (access->access, end of one op to start of the next): {stats['count']:,} intervals over "
              f"{stats['blocks']:,} blocks" + (f", {stats['wrap_around']:,} wrap around the iteration boundary"
                                                if stats["wrap_around"] else ""))
        print(f"p50 {format_ns(stats['p50_ns'])}   p90 {format_ns(stats['p90_ns'])}   p99 "
              f"{format_ns(stats['p99_ns'])}   max {format_ns(stats['max_ns'])}   mean {format_ns(stats['mean_ns'])}")
    print("lifetime edges, beside the ATI (not in it):")
    for kind, e in stats["edges"].items():
        if e["count"]:
            print(f"  {kind:<15} {e['count']:>9,}   p50 {format_ns(e['p50_ns']):>10}   max {format_ns(e['max_ns']):>10}")
    if stats["truncated"]:
        print(f"  ({stats['truncated']:,} edges bounded by the trace start/end)")
    if stats["count"] == 0:
        return 0
    print("ATI histogram (share of intervals per decade):")
    for row in hist.itertuples():
        if row.count:
            label = f"[{format_ns(row.lo)}, {format_ns(row.hi)})"
            print(f"  {label:>24} {row.count:>10,} {row.fraction:6.1%} {'#' * int(round(40 * row.fraction))}")
    if groups is not None:
        print(f"by {args.by}" + (" (ATI only)" if args.by != "kind" else "") + ":")
        for row in groups.itertuples(index=False):
            print(f"  {str(getattr(row, args.by)):<30} {row.count:>9,} intervals  p50 {format_ns(row.p50_ns):>10}  "
                  f"p90 {format_ns(row.p90_ns):>10}  max {format_ns(row.max_ns):>10}")
    return 0
