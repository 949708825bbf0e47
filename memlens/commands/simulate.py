"""`memlens simulate TRACE [--allocator ...] [--conf ...] [--capacity 80GB] [--json]`: what an allocator
(PyTorch's caching allocator under given settings, or a baseline) would reserve for the trace's requests."""
from __future__ import annotations

from memlens.commands import options

ALLOCATOR_CHOICES = ("caching", "malloc", "bestfit", "bump")


def register(sub) -> None:
    p = sub.add_parser(
        "simulate", help="replay a trace through an allocator model (what-if settings)",
        description="Replay the trace's allocations through PyTorch's CUDACachingAllocator policy (or a "
                    "baseline) and print peak reserved/allocated bytes, segment reservations and OOMs.")
    p.add_argument("trace", help="a .memlens directory or any importable file (CUDA snapshot, ...)")
    p.add_argument("--allocator", choices=ALLOCATOR_CHOICES, default="caching",
                   help="allocator model (default: caching)")
    p.add_argument("--conf", default=None,
                   help="PYTORCH_CUDA_ALLOC_CONF string, e.g. 'expandable_segments:True' "
                        "(default: the settings recorded in the trace)")
    p.add_argument("--capacity", default=None,
                   help="device memory the allocator may use, e.g. 80GB (default: inferred from the "
                        "recording's OOM entries when it has some, else unlimited; 'unlimited' lifts it)")
    p.add_argument("--device", default=None, help="only this device (e.g. cuda:0)")
    p.add_argument("--initial-state", choices=("auto", "warm", "empty"), default="auto",
                   help="start from the state rebuilt from the recording (warm) or empty (default: auto)")
    p.add_argument("--json", action="store_true", help="print one JSON object: device -> results")
    from memlens.commands._device import add_gpu_option
    add_gpu_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.commands._output import print_json
    from memlens.io import load
    from memlens.simulate import simulate
    from memlens.units import format_bytes

    from memlens.commands._device import apply_gpu, clock_line

    from memlens.commands._engine import require_in_memory
    require_in_memory(args.trace, "the allocator replay")
    trace = load(args.trace)
    options.check_device(trace, args.device)
    trace, _ = apply_gpu(trace, args)
    result = simulate(trace, allocator=args.allocator, conf=args.conf, capacity=args.capacity,
                      device=args.device, initial_state=args.initial_state)
    if args.json:
        print_json(result.to_dict())
        return 0
    conf = result.conf or "(defaults)" if args.allocator == "caching" else "-"
    print(f"trace:      {args.trace}")
    print(clock_line(trace).replace("clock: ", "clock:      "))
    print(f"allocator:  {args.allocator}  conf: {conf}"
          + (f"  capacity: {format_bytes(result.capacity)}" if result.capacity else ""))
    for dev, r in result.devices.items():
        sizes = r.segment_allocs
        print(f"{dev}: ({r.initial_state} start, {len(r.timeline) - 1:,} requests)")
        print(f"  peak reserved:   {format_bytes(r.peak_reserved)} ({r.peak_reserved:,} bytes)")
        print(f"  peak allocated:  {format_bytes(r.peak_allocated)} ({r.peak_allocated:,} bytes)")
        print(f"  final reserved:  {format_bytes(r.final_reserved)}")
        # the largest gap at any moment, not the difference of the two peaks (they need not coincide)
        print(f"  cached unused:   {format_bytes(r.peak_fragmentation)} at most (reserved minus allocated, "
              "largest over the replay)")
        print(f"  segment allocs:  {len(sizes):,} ({format_bytes(sum(sizes))}); frees: {len(r.segment_frees):,}")
        if r.recorded is not None:
            rec = r.recorded
            diff = r.peak_reserved - rec["peak_reserved"]
            if rec.get("initial_reserved"):
                print(f"  recorded reserved at start: {format_bytes(rec['initial_reserved'])} (reserved before "
                      "recording began)")
            print(f"  recorded peak reserved: {format_bytes(rec['peak_reserved'])} "
                  f"(simulated {'+' if diff >= 0 else '-'}{format_bytes(abs(diff))}), "
                  f"{len(rec['segment_allocs']):,} recorded segment allocs")
        for oom in r.ooms[:5]:
            print(f"  OOM at seq {oom['seq']}: {format_bytes(oom['requested'])} requested with "
                  f"{format_bytes(oom['reserved'])} reserved, {format_bytes(oom['allocated'])} allocated")
        if len(r.ooms) > 5:
            print(f"  ... {len(r.ooms) - 5} more OOMs")
        for note in r.notes:
            print(f"  note: {note}")
    return 0
