"""`memlens retime TRACE -o OUT --gpu H100 [--source-gpu A100]`: the trace on the modeled clock of a GPU, saved
(a measured profile: its kernel times scaled from the GPU that measured them)."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("retime", help="put a trace on the modeled clock of a GPU and save it",
                       description="Model each op's duration on the GPU (per op class: GEMM waves, attention "
                                   "blocks, bandwidth-bound kernels with launch floors), lay the ops back to back "
                                   "in recorded order, re-stamp accesses and block lifetimes, and save the "
                                   "result. Needs a trace recorded by memlens (per-op cost facts).")
    p.add_argument("trace", help="a .memlens directory recorded by memlens")
    p.add_argument("-o", "--output", required=True, help="the .memlens directory to write")
    p.add_argument("--gpu", default="H100", help="GPU name (see `memlens gpus`; default H100) or a JSON file from `memlens calibrate`")
    p.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=None,
                   help="fp32 matmuls and convolutions run at the TF32 tensor-core rate (--no-tf32: neither); "
                        "default: what the trace says, else PyTorch's defaults, stated with the clock")
    from memlens.commands._device import add_source_gpu_option
    add_source_gpu_option(p)
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it is a memlens trace")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.commands._output import print_json
    from memlens.clock import clock_label
    from memlens.trace import clock_of
    from memlens.devicetime.retiming import retime
    from memlens.io import load
    from memlens.units import format_ns

    from memlens.commands._device import on_measured_clock, source_gpu_of
    source = source_gpu_of(args)     # an unknown name is refused before the trace is read
    trace = on_measured_clock(load(args.trace), source, args.trace)
    out = retime(trace, gpu=args.gpu, tf32=args.tf32, source_gpu=source)
    path = out.save(args.output, overwrite=args.overwrite)
    # a class's time is its ops' own time (device_self_ns): a nested op counts once, not once per parent
    by_class = (out.ops.groupby("op_class").agg(ops=("op_id", "size"), kernels=("kernels", "sum"),
                                                device_ns=("device_self_ns", "sum")).sort_values("device_ns",
                                                                                            ascending=False))
    clock = out.metadata["clock"]
    if args.json:
        print_json({"path": str(path), "clock": clock, "recorded_clock": clock_of(trace),
                    "recorded_duration_ns": int(trace.duration_ns), "duration_ns": int(out.duration_ns),
                    "by_class": by_class.reset_index().to_dict(orient="records")})
        return 0
    print(f"wrote {path}")
    print(f"clock: {clock_label(out)} (from the {clock_label(trace)})")
    print(f"duration: {format_ns(trace.duration_ns)} recorded -> {format_ns(out.duration_ns)} modeled; "
          f"{clock['kernels']:,} kernels, device busy {format_ns(clock['device_busy_ns'])}")
    total = max(int(by_class["device_ns"].sum()), 1)
    for name, row in by_class.iterrows():
        if row.ops:
            print(f"  {name:<14}{int(row.ops):>8,} ops{int(row.kernels):>8,} kernels  {format_ns(row.device_ns):>10}"
                  f"  {row.device_ns / total:6.1%}")
    return 0
