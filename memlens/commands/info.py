"""`memlens info TRACE [--json]`: what a trace holds, and its peak live bytes per device."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("info", help="summarise a trace (any supported format)",
                       description="Print blocks, accesses, ops, devices, duration and peak live bytes.")
    p.add_argument("trace", help="a .memlens directory or any importable file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.cli import print_json
    from memlens.io import load
    from memlens.units import format_bytes, format_ns

    trace = load(args.trace)
    s = trace.summary()
    if args.json:
        print_json(s)
        return 0
    print(f"trace:     {args.trace} ({s['source_kind']})")
    print(f"blocks:    {s['blocks']:,}  (alive at end {s['alive_at_end']:,}, allocated before recording "
          f"{s['allocated_before']:,}, freed without alloc {s['free_without_alloc']:,})")
    print(f"accesses:  {s['accesses']:,}" + ("" if s["has_accesses"] else "  (this source records none)"))
    print(f"ops:       {s['ops']:,}")
    print(f"duration:  {format_ns(s['duration_ns'])}")
    for dev, peak in s["peak_live_bytes"].items():
        print(f"peak live: {dev}: {format_bytes(peak)} ({peak:,} bytes)")
    for note in s["notes"]:
        print(f"note:      {note}")
    return 0
