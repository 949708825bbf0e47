"""`memlens ati TRACE [--json]`: the distribution of access time intervals (ATI) of a trace's blocks."""
from __future__ import annotations

from memlens.commands._engine import add_engine_options, engine_for, runner_for


def register(sub) -> None:
    p = sub.add_parser("ati", help="access time intervals: how long blocks sit between accesses",
                       description="Quantiles and a log-binned histogram of every block's access time "
                                   "intervals (alloc -> first access -> ... -> last access -> free). Needs a "
                                   "trace with accesses (recorded by memlens).")
    p.add_argument("trace", help="a .memlens directory or any importable file")
    p.add_argument("--device", help="only blocks of this device (e.g. cuda:0)")
    p.add_argument("--by", choices=["kind", "category", "module", "op", "size_class", "iteration", "device"],
                   help="also break the statistics down by this attribute")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_engine_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.analysis.ati import access_intervals, ati_by, ati_stats
    from memlens.analysis.distributions import log_histogram
    from memlens.cli import print_json
    from memlens.errors import NeedsAccessesError
    from memlens.io import load
    from memlens.units import format_ns

    if engine_for(args) == "dask":
        from memlens.analysis.outofcore import engine
        from memlens.errors import InputError
        if args.by:
            raise InputError("--by is not available with the dask engine yet (it needs every group's intervals "
                             "at once); use --engine memory")
        with runner_for(args) as runner:
            stats = engine.ati(args.trace, runner, device=args.device)
        hist = stats.pop("histogram")
        outside = stats.pop("accesses_outside_lifetime")
        groups = None
    else:
        trace = load(args.trace)
        try:
            iv = access_intervals(trace, device=args.device)
        except NeedsAccessesError as exc:
            raise NeedsAccessesError(exc.message, args.trace) from None
        stats = ati_stats(iv)
        hist = log_histogram(iv["length_ns"].to_numpy(), per_decade=1)
        outside = iv.attrs.get("accesses_outside_lifetime", 0)
        groups = ati_by(trace, args.by, iv) if args.by else None
    if args.json:
        doc = {"intervals": stats["count"], **stats,
               "histogram": hist.to_dict(orient="records"),
               "accesses_outside_lifetime": outside}
        if groups is not None:
            doc["by"] = {"key": args.by, "groups": groups.to_dict(orient="records")}
        print_json(doc)
        return 0
    if stats["count"] == 0:
        print(f"{args.trace}: no intervals (no blocks{' on ' + args.device if args.device else ''})")
        return 0
    print(f"intervals: {stats['count']:,} over {stats['blocks']:,} blocks "
          f"({stats['truncated']:,} bounded by the trace start/end)")
    print(f"p50 {format_ns(stats['p50_ns'])}   p90 {format_ns(stats['p90_ns'])}   "
          f"p99 {format_ns(stats['p99_ns'])}   max {format_ns(stats['max_ns'])}   mean {format_ns(stats['mean_ns'])}")
    print("kinds: " + ", ".join(f"{k} {v:,}" for k, v in stats["by_kind"].items()))
    print("histogram (share of intervals per decade):")
    for row in hist.itertuples():
        if row.count:
            label = f"[{format_ns(row.lo)}, {format_ns(row.hi)})"
            print(f"  {label:>24} {row.count:>10,} {row.fraction:6.1%} {'#' * int(round(40 * row.fraction))}")
    if groups is not None:
        print(f"by {args.by}:")
        for row in groups.itertuples(index=False):
            print(f"  {str(getattr(row, args.by)):<30} {row.count:>9,} intervals  p50 {format_ns(row.p50_ns):>10}  "
                  f"p90 {format_ns(row.p90_ns):>10}  max {format_ns(row.max_ns):>10}")
    return 0
