"""`memlens plan INPUT [--time-limit S] [--out plan.csv] [--json]`: a static offset plan and its bound."""
from __future__ import annotations

from memlens.commands import options


EXIT_RESERVE_S = 0.3  # seconds kept for writing the plan and exiting
# the README's cs336 training snapshot (7,190 buffers) needs ~6 s to reach its proven optimum on a loaded 2-core
# machine (1.0060 x max-live after 5 s); a plan proven optimal earlier returns at once
DEFAULT_TIME_LIMIT_S = 15.0


def register(sub) -> None:
    p = sub.add_parser("plan", help="static offset plan (one arena, fixed offsets) vs the max-live bound",
                       description="Plan a fixed offset for every block (heuristic portfolio, exact search, "
                                   "local search) and compare its height with max-live.")
    p.add_argument("input", help="any trace memlens can load, or a buffer CSV id,lower,upper,size")
    p.add_argument("--time-limit", type=options.duration_s_or_zero, default=DEFAULT_TIME_LIMIT_S, metavar="S",
                   help="seconds the whole command may take, from its start to the validated plan (default 15, "
                        "less when a plan is proven optimal sooner; "
                        "below the time one plan needs, that one plan is the result)")
    p.add_argument("--alignment", type=options.alignment, default=1, metavar="BYTES", help="offset alignment (default 1)")
    p.add_argument("--device", help="device of a multi-device trace (default: the largest peak)")
    p.add_argument("--iteration", type=options.count(0), help="plan only this iteration (by iteration marks, optimizer "
                   "steps or the detected repeating allocation pattern)")
    p.add_argument("--out", type=options.output_path, metavar="plan.csv", help="write the plan as id,lower,upper,size,offset")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.commands._output import print_json
    from memlens.errors import InputError
    from memlens.plan import plan
    from memlens.units import format_bytes

    import gc

    # the limit holds for the command as a whole: its clock started with the process, and what follows the
    # plan (writing it, exiting) is kept out of the planner's share
    started = command_started_at()
    from memlens.commands._engine import require_in_memory
    require_in_memory(args.input, "the offset planner")
    result = plan(args.input, time_limit_s=max(args.time_limit - EXIT_RESERVE_S, 0.0), alignment=args.alignment,
                  iteration=args.iteration, device=args.device, started_at=started)
    # the interpreter's last garbage collection walks every object numba and pandas made (~1 s on a busy
    # machine); nothing of ours needs finalizing, so leave them out of it
    gc.freeze()
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
    if not s["optimal"]:
        print(f"              (not proven within --time-limit {args.time_limit:g} s: a longer limit may find a "
              "lower plan or prove this one)")
    if s["lower_bound"] > s["max_live"]:
        print(f"lower bound:  {s['lower_bound']:,} bytes (proven above max-live)")
    print(f"algorithm:    {s['algorithm']}")
    print(f"best greedy:  {s['best_heuristic']} {s['best_heuristic_height']:,} bytes "
          f"({s['best_heuristic_height'] / max(s['max_live'], 1):.4f} x max-live)")
    print(f"time:         {s['seconds']:.2f} s")
    if args.out:
        print(f"written:      {args.out}")
    return 0


def seconds_since_process_start() -> float:
    """Seconds since this process started (Linux: /proc; 0 where that cannot be read)."""
    import os
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: start time in ticks
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def command_started_at() -> float:
    """`time.perf_counter()` value at which this command began: the process start when memlens is the
    process's program (the `memlens` script, `python -m memlens`), else now (called in-process: a test,
    a notebook)."""
    import os
    import sys
    import time

    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    own = (spec is not None and spec.name == "memlens.__main__") or os.path.basename(sys.argv[0] or "") == "memlens"
    now = time.perf_counter()
    return now - seconds_since_process_start() if own else now
