"""`memlens swap TRACE [--bandwidth 25GB/s] [--limit 10GB] [--json]`: a swapping plan and its effect."""
from __future__ import annotations

from memlens.commands import options
from memlens.commands._cycle import add_cycle_args, cycle_kwargs, cycle_text


def register(sub) -> None:
    p = sub.add_parser("swap", help="choose idle blocks to copy to the host and back, to lower the peak",
                       description="Plan swaps of idle intervals (one copy stream each way) and report the "
                                   "peak before/after, the infinite-bandwidth bound and the stall.")
    p.add_argument("trace", help="a trace with accesses (recorded by memlens)")
    p.add_argument("--bandwidth", default=None, type=options.bandwidth,
                   help="link: '25GB/s', 'OUT,IN' ('13.2GB/s,12.2GB/s') or a preset (pcie3, pcie4, zhang, ...); "
                        "default pcie4, or the --gpu's host link")
    p.add_argument("--latency-us", type=options.microseconds, help="fixed cost of one copy, microseconds")
    p.add_argument("--limit", type=options.positive_size, help="device memory limit ('10GB'); default: minimise the peak")
    p.add_argument("--priority", default="best", choices=["best", "peak", "doa", "aoa", "wdoa"],
                   help="selection: Zhang et al.'s doa/aoa/wdoa, peak-targeted greedy, or the best of all")
    p.add_argument("--min-size", default="1MiB", type=options.size,
                   help="smallest block worth swapping (default 1MiB, Zhang et al.'s 1 MB floor; 0 for all)")
    p.add_argument("--device", help="device of a multi-device trace (default: the largest peak)")
    p.add_argument("--top", type=options.count(0), default=10, help="swaps listed in the text output (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    from memlens.commands._device import add_gpu_option
    add_gpu_option(p)
    add_cycle_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.analysis.clock import describe_clock
    from memlens.commands._output import print_json
    from memlens.trace import clock_of
    from memlens.commands._device import apply_gpu, link_for
    from memlens.io import load
    from memlens.swap import plan_swaps
    from memlens.units import format_bytes, format_ns

    from memlens.commands._engine import require_in_memory
    require_in_memory(args.trace, "swap planning")
    trace = load(args.trace)
    options.check_device(trace, args.device)
    trace, g = apply_gpu(trace, args)
    model = link_for(args, g)
    result = plan_swaps(trace, bandwidth=model, limit=args.limit, priority=args.priority, device=args.device,
                        min_size=args.min_size, **cycle_kwargs(args))
    if args.json:
        print_json({"clock": clock_of(trace), **result.summary()})
        return 0
    print(f"trace:        {args.trace} (device {result.device})")
    print(f"link:         {model.describe()}")
    print(f"clock:        {describe_clock(result.clock)}")
    print(f"planned:      {cycle_text(result.summary())}; blocks >= {format_bytes(result.min_size)}")
    steady = " (steady state, one period)" if result.steady_state else ""
    print(f"peak before:  {format_bytes(result.peak_before)} ({result.peak_before:,} bytes){steady}")
    print(f"peak after:   {format_bytes(result.peak_after)} ({result.peak_after:,} bytes), "
          f"-{format_bytes(result.saved_bytes)} with {len(result.swaps):,} swaps ({result.priority})")
    print(f"bound:        {format_bytes(result.infinite_bandwidth_peak)} at infinite bandwidth")
    if result.limit is not None:
        print(f"limit:        {format_bytes(result.limit)}: {'met' if result.met_limit else 'NOT met'}")
    if len(result.swaps) == 0 and result.smaller_candidates:
        print(f"hint:         no block of {format_bytes(result.min_size)} or more can be swapped; "
              f"{result.smaller_candidates:,} idle intervals of smaller blocks could: try --min-size 0")
    late = int((result.swaps["stall_ns"] > 0).sum())
    print(f"traffic:      {format_bytes(result.transfer_bytes)}, estimated stall {format_ns(result.stall_ns)} "
          f"({late:,} copy-ins end after the start of the op that needs the block; {result.clock.get('kind')} clock)")
    for row in result.swaps.nlargest(args.top, "size").itertuples():
        where = " ".join(str(x) for x in (row.category, row.op, row.module) if x)
        wrap = "  wraps" if row.crosses_boundary else ""
        stall = f"  STALLS {format_ns(row.stall_ns)}" if row.stall_ns > 0 else ""
        print(f"  block {row.block_id:>8} {format_bytes(row.size):>10}  out {format_ns(row.out_start_ns)}"
              f"  in {format_ns(row.in_start_ns)}-{format_ns(row.in_end_ns)}  needed at {format_ns(row.idle_to_ns)}"
              f"{stall}{wrap}  {where}")
    return 0
