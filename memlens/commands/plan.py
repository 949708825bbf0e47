"""`memlens plan INPUT [--time-limit S] [--out plan.csv] [--json]`: a static offset plan and its bound."""
from __future__ import annotations

from memlens.commands import options


def register(sub) -> None:
    p = sub.add_parser("plan", help="static offset plan (one arena, fixed offsets) vs the max-live bound",
                       description="Plan a fixed offset for every block (heuristic portfolio, exact search, "
                                   "local search) and compare its height with max-live.")
    p.add_argument("input", help="any trace memlens can load, or a buffer CSV id,lower,upper,size")
    p.add_argument("--time-limit", type=options.duration_s_or_zero, default=5.0, metavar="S",
                   help="seconds of search after the heuristics (default 5)")
    p.add_argument("--alignment", type=options.alignment, default=1, metavar="BYTES", help="offset alignment (default 1)")
    p.add_argument("--device", help="device of a multi-device trace (default: the largest peak)")
    p.add_argument("--iteration", type=options.count(0), help="plan only this iteration (by iteration marks, optimizer "
                   "steps or the detected repeating allocation pattern)")
    p.add_argument("--out", type=options.output_path, metavar="plan.csv", help="write the plan as id,lower,upper,size,offset")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.cli import print_json
    from memlens.errors import InputError
    from memlens.plan import plan
    from memlens.units import format_bytes

    from memlens.commands._engine import require_in_memory
    require_in_memory(args.input, "the offset planner")
    result = plan(args.input, time_limit_s=args.time_limit, alignment=args.alignment,
                  iteration=args.iteration, device=args.device)
    if args.out:
        result.to_csv(args.out)
    s = result.summary()
    if args.out:
        s["out"] = args.out
    if args.json:
        print_json(s)
        return 0
    print(f"input:        {args.input}" + (f" (device {s['device']})" if s["device"] else ""))
    print(f"buffers:      {s['buffers']:,}")
    print(f"max-live:     {format_bytes(s['max_live'])} ({s['max_live']:,} bytes)")
    print(f"plan height:  {format_bytes(s['height'])} ({s['height']:,} bytes), {s['ratio']:.4f} x max-live, "
          f"{'optimal (proven)' if s['optimal'] else 'not proven optimal'}")
    if s["lower_bound"] > s["max_live"]:
        print(f"lower bound:  {s['lower_bound']:,} bytes (proven above max-live)")
    print(f"algorithm:    {s['algorithm']}")
    print(f"best greedy:  {s['best_heuristic']} {s['best_heuristic_height']:,} bytes "
          f"({s['best_heuristic_height'] / max(s['max_live'], 1):.4f} x max-live)")
    print(f"time:         {s['seconds']:.2f} s")
    if args.out:
        print(f"written:      {args.out}")
    return 0
