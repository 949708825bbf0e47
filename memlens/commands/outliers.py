"""`memlens outliers TRACE [--bandwidth 25GB/s] [--top N] [--json]`: the blocks idle longest, and what of
that idle time a host link could reclaim by swapping."""
from __future__ import annotations

from memlens.commands import options
from memlens.commands._cycle import add_cycle_args, cycle_kwargs, cycle_text, refuse_out_of_core
from memlens.commands._engine import add_engine_options, engine_for, runner_for


def register(sub) -> None:
    p = sub.add_parser("outliers", help="blocks ranked by idle memory, with what swapping could reclaim",
                       description="Rank blocks by size x longest idle interval (or Zhang et al.'s DOA/AOA/WDOA) "
                                   "and show which idle intervals are long enough to swap over the given link. "
                                   "Needs a trace with accesses (recorded by memlens).")
    p.add_argument("trace", help="a .memlens directory or any importable file")
    p.add_argument("--bandwidth", default=None, type=options.bandwidth,
                   help="host link: a rate for both directions (25GB/s), OUT,IN rates (13.2GB/s,12.2GB/s) or a "
                        "preset (pcie3, pcie4, pcie5, zhang, nvlink2, nvlink_c2c, inf); default pcie4 (25 GB/s), "
                        "or the --gpu's host link")
    p.add_argument("--latency-us", type=options.microseconds, default=None,
                   help="fixed cost of one transfer in microseconds (default: the preset's, or 10)")
    p.add_argument("--top", type=options.count(1), default=20, help="how many blocks to list (default 20)")
    p.add_argument("--priority", choices=["size_x_idle", "doa", "aoa", "wdoa"], default="size_x_idle",
                   help="ranking (default size_x_idle; doa/aoa/wdoa consider blocks >= 1 MiB idle across the peak)")
    p.add_argument("--min-size", default=None, type=options.size,
                   help="leave out smaller blocks (e.g. 64KB; default 0, or 1MiB for doa/aoa/wdoa as in Zhang et al.)")
    p.add_argument("--device", help="only blocks of this device")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: the clock, the link model, the filter summary and the blocks")
    add_engine_options(p)
    from memlens.commands._device import add_gpu_option
    add_gpu_option(p)
    add_cycle_args(p)
    p.set_defaults(func=run)


JSON_COLUMNS = ("block_id", "device", "size", "max_idle_ns", "max_idle_start_ns", "max_idle_end_ns",
                "max_idle_kind", "idle_fraction", "accesses", "swappable_intervals", "swappable_bytes_ns",
                "crosses_peak", "doa_ns", "aoa", "wdoa_ns", "score", "category", "op", "module", "stack_id")


def _plain(value):
    """numpy/pandas scalars -> JSON-ready Python values (NaN/NA -> None)."""
    import math

    import pandas as pd
    if value is None or value is pd.NA:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def run(args) -> int:
    from memlens.analysis.ati import access_intervals
    from memlens.analysis.clock import describe_clock
    from memlens.analysis.outliers import outliers
    from memlens.analysis.swappable import bandwidth_filter, filter_summary
    from memlens.commands._output import print_json
    from memlens.errors import InputError, NeedsAccessesError
    from memlens.io import load
    from memlens.units import format_bytes, format_ns, format_share

    if args.top is not None and args.top < 1:
        raise InputError(f"--top must be at least 1, got {args.top}")
    from memlens.commands._device import apply_gpu, link_for, refuse_gpu_with_dask

    trace = g = None
    dask = engine_for(args) == "dask"
    if dask:
        refuse_gpu_with_dask(args)
    else:
        trace = load(args.trace)
        options.check_device(trace, args.device)
        trace, g = apply_gpu(trace, args)
    bw = link_for(args, g)
    min_size = args.min_size
    cycle = {"steady_state": False, "iteration": None, "period_ns": None}
    if dask:
        from memlens.analysis.outofcore import engine
        refuse_out_of_core(args)
        with runner_for(args) as runner:
            ranked, summary = engine.outliers(args.trace, runner, bw, top=args.top, priority=args.priority,
                                              device=args.device, min_size=min_size)
    else:
        try:
            iv = access_intervals(trace, device=args.device, **cycle_kwargs(args))
        except NeedsAccessesError as exc:
            raise NeedsAccessesError(exc.message, args.trace) from None
        ranked = outliers(trace, bw, top=args.top, priority=args.priority, device=args.device, intervals=iv,
                          min_size=min_size)
        summary = filter_summary(bandwidth_filter(iv, bw))
        cycle = {k: iv.attrs.get(k) for k in cycle}
    if args.json:
        cols = [c for c in JSON_COLUMNS if c in ranked.columns]
        print_json({"clock": summary["clock"], "bandwidth": bw.to_dict(), "bandwidth_text": bw.describe(),
                    "priority": args.priority, "min_size": ranked.attrs.get("min_size", min_size if min_size is not None else
                                                                (0 if args.priority == "size_x_idle" else 1 << 20)),
                    "steady_state": bool(cycle["steady_state"]), "iteration": cycle["iteration"],
                    "period_ns": cycle["period_ns"],
                    "filter": {k: v for k, v in summary.items() if k not in ("bandwidth", "clock")},
                    "blocks": [{c: _plain(v) for c, v in zip(cols, row)}
                               for row in ranked[cols].itertuples(index=False)]})
        return 0
    print(f"link: {bw.describe()}")
    print(f"clock: {describe_clock(summary.get('clock'))}; {cycle_text(cycle)}")
    if summary["intervals"]:
        print(f"{format_share(summary['filtered_out_fraction'])} of {summary['intervals']:,} ATIs (access->access) are too short "
              f"to swap; the {summary['swappable']:,} others hold {format_share(summary['swappable_share'] or 0)} of the "
              f"idle byte-time")
    if len(ranked) == 0:
        print("no blocks qualify" + (" (doa/aoa/wdoa consider blocks idle across the peak, by default only those "
                                     ">= 1 MiB: see --min-size)" if args.priority != "size_x_idle" else ""))
        return 0
    # Zhang et al.'s priorities get their own column: DOA/WDOA are durations, AOA is byte-time
    score_name = {"doa": "DOA", "wdoa": "WDOA", "aoa": "AOA"}.get(args.priority)

    def score_text(value) -> str:
        if args.priority == "aoa":
            return format_bytes(value / 1e9) + "*s"
        return format_ns(value)

    extra = f" {score_name:>12}" if score_name else ""
    print(f"{'block':>8} {'size':>11} {'max idle':>11} {'kind':<17} {'swappable':>12}{extra} {'category':<16} "
          "op / module")
    for row in ranked.itertuples(index=False):
        where = " ".join(x for x in (str(row.op or ""), str(row.module or "")) if x)
        extra = f" {score_text(row.score):>12}" if score_name else ""
        print(f"{row.block_id:>8} {format_bytes(row.size):>11} {format_ns(row.max_idle_ns):>11} "
              f"{row.max_idle_kind:<17} {format_bytes(row.swappable_bytes_ns / 1e9) + '*s':>12}{extra} "
              f"{str(row.category or 'unknown'):<16} {where}")
    return 0
