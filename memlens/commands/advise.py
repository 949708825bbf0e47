"""`memlens advise --gpu H100 --capacity 40GiB [--world-size 8] [--objective fit] -- python train.py ARGS`,
or `memlens advise --capacity 40GiB TRACE` (a recording: allocator settings only); `--report FILE` also writes
the HTML report of the step as it is with the Advice section.

Prints the ranked plans of `memlens.advise` (each verified by predicting the step with it applied), the best
plan's code, or the closest plan and by how much it misses. Exit 0 with a plan that fits, 3 when none does,
1 when the script fails (no advice), 2 for bad options.
"""
from __future__ import annotations

import sys

from memlens.commands import options

EXIT_NO_FIT = 3


def register(sub) -> None:
    p = sub.add_parser("advise", help="advise changes that make a training script fit a GPU, verified by prediction",
                       description="Search activation checkpointing, sharding (with --world-size) and allocator "
                                   "settings for `-- python script.py args`; every plan is predicted with the "
                                   "change applied. A script defining build_model() and step(model, optimizer) "
                                   "gets the whole search; any other script, allocator settings only.")
    p.add_argument("--gpu", default="H100", help="GPU model (H100, A100, L4, ...; default H100)")
    p.add_argument("--capacity", type=options.positive_size, default=None,
                   help="device memory per GPU to fit, e.g. 40GiB (default: the GPU's)")
    p.add_argument("--world-size", type=options.count(minimum=1), default=None, metavar="N",
                   help="search sharding strategies on N GPUs too (DDP is the baseline)")
    p.add_argument("--objective", choices=("fit", "fastest_fit", "pareto"), default="fit",
                   help="fit: fitting plans, fewest changes first (default); fastest_fit: fastest modeled step "
                        "first; pareto: only the memory/time frontier")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--report", type=options.output_path, default=None, metavar="FILE",
                   help="also write the offline HTML report of the step as it is (its predicted trace, or the "
                        "recording) with the Advice section: ranked plans, memory/time frontier, each plan's code")
    p.add_argument("command", nargs=_remainder(), help="-- python script.py [args], or a trace file")
    p.set_defaults(func=run)


def _remainder():
    import argparse
    return argparse.REMAINDER


def run(args) -> int:
    from memlens.advice.advisor import AdviceFailed
    from memlens.advice.script import advise_script
    from memlens.commands.predict import _script_argv
    from memlens.errors import InputError
    rest = [a for a in args.command if a != "--"]
    if len(rest) == 1 and not rest[0].endswith(".py"):       # a recorded or imported trace
        from memlens.advice.recorded import advise_trace
        advice = advise_trace(rest[0], args.capacity, args.objective)
        source = rest[0]
    else:
        try:
            argv = _script_argv(args.command)
        except InputError:
            raise InputError("advise: give a trace, or the script after --, e.g. `memlens advise --capacity 40GiB "
                             "-- python train.py`") from None
        try:
            advice = advise_script(argv[0], argv[1:], gpu=args.gpu, capacity=args.capacity,
                                   world_size=args.world_size, objective=args.objective)
        except AdviceFailed as exc:
            print(f"memlens advise: {argv[0]}: {exc}", file=sys.stderr)
            return 1
        source = argv[0]
    if args.report is not None:
        from memlens.reporting import report
        # the what-ifs replay allocator settings the advice has already replayed: left out to keep it quick
        report(advice.baseline.trace, args.report, advice=advice, whatif=False,
               title=f"memlens advise: {source}", source_name=f"{source} (as it is, predicted)"
               if source.endswith(".py") else source)
        print(f"memlens advise: report written to {args.report}", file=sys.stderr)
    if args.json:
        from memlens.commands._output import print_json
        print_json(advice.to_dict())
    else:
        _print(advice)
    return 0 if advice.best is not None else EXIT_NO_FIT


def _print(advice) -> None:
    from memlens.units import format_bytes
    print(advice.summary())
    print()
    print(f"{'#':>2}  {'fits':<5} {'peak alloc':>10} {'peak resv':>10} {'needs':>10} {'step (ms)':>10} "
          f"{'vs as is':>9}  changes")
    for i, p in enumerate(advice.plans, 1):
        if p.error is not None:
            print(f"{i:>2}  {'error':<5} {'':>10} {'':>10} {'':>10} {'':>10} {'':>9}  {p.changes}: {p.error}")
            continue
        step = "n/a" if p.step_ns is None else f"{p.step_ns / 1e6:.2f}"
        delta = "n/a" if p.delta_ns is None else f"{p.delta_ns / 1e6:+.2f}"
        print(f"{i:>2}  {str(p.fits):<5} {format_bytes(p.peak_allocated):>10} {format_bytes(p.peak_reserved):>10} "
              f"{format_bytes(p.device_bytes_needed):>10} {step:>10} {delta:>9}  {p.changes}")
    for note in advice.notes:
        print(f"note: {note}")
    if advice.best is not None:
        print("\nTo apply the best plan (also `plan.apply(model)` in Python):\n")
        print(advice.best.snippet)
