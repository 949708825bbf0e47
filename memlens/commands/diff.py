"""`memlens diff A B [--json] [-o diff.html]`: what changed between two runs."""
from __future__ import annotations

from memlens.commands import options


def register(sub) -> None:
    p = sub.add_parser("diff", help="compare two traces (peak, live at peak, blocks, iterations, ATI)",
                       description="Compare trace A (before) with trace B (after): change in peak, in live "
                                   "memory at the peak by category/module/op, blocks that appear or disappear, "
                                   "iterations and ATI; says what it cannot compare.")
    p.add_argument("a", help="trace A (before): a .memlens directory or any importable file")
    p.add_argument("b", help="trace B (after)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("-o", "--output", default=None, type=options.output_path, help="also write an HTML page with the overlay figure")
    p.add_argument("--top", type=options.count(1), default=20, help="rows per table (default 20)")
    options.add_categories_option(p)  # both traces categorised by the same rules
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from memlens.commands._output import print_json
    from memlens.analysis.diff import diff
    from memlens.errors import InputError, printable

    if args.top < 1:
        raise InputError(f"--top must be at least 1, got {args.top}")
    if sys.stderr.isatty():
        print(f"comparing {args.a} with {args.b} ...", file=sys.stderr)
    a, b = args.a, args.b
    if args.categories is not None:
        from memlens.io import load
        a, b = (options.with_categories(load(path), args.categories) for path in (args.a, args.b))
    d = diff(a, b, name_a=args.a, name_b=args.b)
    page = None
    if args.output:
        from memlens.reporting.diff_page import diff_report
        page = diff_report(d, args.output, top=args.top)
    if args.json:
        out = d.to_dict(top=args.top)
        if page is not None:
            out["html"] = str(args.output)
            out["html_sections"] = [s.to_dict() for s in page.sections]
        print_json(out)
        return 0
    for line in d.summary():
        print(printable(line))
    _print_stacks(d.stacks, min(args.top, 10))
    if page is not None:
        print(f"diff page: {args.output}")
    return 0


def _print_stacks(stacks, top: int) -> None:
    """The largest stack changes at the peak: change, delta, A -> B bytes, the site, then the stack (cut)."""
    from memlens.errors import printable
    from memlens.units import format_bytes

    if stacks is None or len(stacks) == 0:
        return
    print(f"Stacks at the peak, largest changes first ({min(top, len(stacks))} of {len(stacks):,}):")
    for r in stacks.head(top).itertuples(index=False):
        sign = "+" if r.delta >= 0 else "-"
        print(printable(f"  {r.change:<9} {sign + format_bytes(abs(int(r.delta))):>11}  ({format_bytes(int(r.bytes_a))} "
                        f"-> {format_bytes(int(r.bytes_b))})  {r.site}"))
        if r.stack != r.site:
            stack = str(r.stack)
            print(printable(f"            {stack if len(stack) <= 200 else stack[:197] + '...'}"))
