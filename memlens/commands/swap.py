"""`memlens swap TRACE [--bandwidth 25GB/s] [--limit 10GB] [--json]`: a swapping plan and its effect."""
from __future__ import annotations

from memlens.commands import options


def register(sub) -> None:
    p = sub.add_parser("swap", help="choose idle blocks to copy to the host and back, to lower the peak",
                       description="Plan swaps of idle intervals (one copy stream each way) and report the "
                                   "peak before/after, the infinite-bandwidth bound and the stall.")
    p.add_argument("trace", help="a trace with accesses (recorded by memlens)")
    p.add_argument("--bandwidth", default="pcie4", type=options.bandwidth,
                   help="link: '25GB/s', 'OUT,IN' ('13.2GB/s,12.2GB/s') or a preset (pcie3, pcie4, zhang, ...)")
    p.add_argument("--latency-us", type=options.microseconds, help="fixed cost of one copy, microseconds")
    p.add_argument("--limit", type=options.positive_size, help="device memory limit ('10GB'); default: minimise the peak")
    p.add_argument("--priority", default="best", choices=["best", "peak", "doa", "aoa", "wdoa"],
                   help="selection: Zhang et al.'s doa/aoa/wdoa, peak-targeted greedy, or the best of all")
    p.add_argument("--min-size", default="0", type=options.size, help="smallest block worth swapping (Zhang et al.: 1MB)")
    p.add_argument("--device", help="device of a multi-device trace (default: the largest peak)")
    p.add_argument("--top", type=options.count(0), default=10, help="swaps listed in the text output (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.analysis.bandwidth import BandwidthModel
    from memlens.cli import print_json
    from memlens.io import load
    from memlens.swap import plan_swaps
    from memlens.units import format_bytes, format_ns

    latency = None if args.latency_us is None else args.latency_us * 1e3
    model = BandwidthModel.parse(args.bandwidth, latency_ns=latency)
    trace = load(args.trace)
    options.check_device(trace, args.device)
    result = plan_swaps(trace, bandwidth=model, limit=args.limit, priority=args.priority, device=args.device,
                        min_size=args.min_size)
    if args.json:
        print_json(result.summary())
        return 0
    print(f"trace:        {args.trace} (device {result.device})")
    print(f"link:         {model.describe()}")
    print(f"peak before:  {format_bytes(result.peak_before)} ({result.peak_before:,} bytes)")
    print(f"peak after:   {format_bytes(result.peak_after)} ({result.peak_after:,} bytes), "
          f"-{format_bytes(result.saved_bytes)} with {len(result.swaps):,} swaps ({result.priority})")
    print(f"bound:        {format_bytes(result.infinite_bandwidth_peak)} at infinite bandwidth")
    if result.limit is not None:
        print(f"limit:        {format_bytes(result.limit)}: {'met' if result.met_limit else 'NOT met'}")
    print(f"traffic:      {format_bytes(result.transfer_bytes)}, estimated stall {format_ns(result.stall_ns)}")
    for row in result.swaps.nlargest(args.top, "size").itertuples():
        where = " ".join(str(x) for x in (row.category, row.op, row.module) if x)
        print(f"  block {row.block_id:>8} {format_bytes(row.size):>10}  out {format_ns(row.out_start_ns)}"
              f"  back {format_ns(row.in_start_ns)}  {where}")
    return 0
