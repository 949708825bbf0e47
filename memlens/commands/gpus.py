"""`memlens gpus [--json]`: the built-in GPUs that --gpu / memlens.retime can model."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("gpus", help="list the GPUs memlens can put a trace on (--gpu NAME)",
                       description="Built-in GPUs: dense peak FLOP/s per dtype, memory bandwidth, host link per "
                                   "direction, per-kernel launch floor, and the datasheet each comes from.")
    p.add_argument("--json", action="store_true", help="print a JSON list (units: FLOP/s, bytes/s, ns)")
    p.set_defaults(func=run)


def run(args) -> int:
    import math

    from memlens.commands._output import print_json
    from memlens.devicetime.gpus import gpus
    from memlens.units import format_bytes, format_ns

    table = gpus()
    if args.json:
        rows = table.to_dict(orient="records")
        for row in rows:
            for k, v in list(row.items()):
                if isinstance(v, float) and math.isnan(v):
                    row[k] = None
        print_json(rows)
        return 0
    print(f"{'name':<16}{'bf16 TFLOP/s':>13}{'fp32':>8}{'fp8':>8}{'memory':>10}{'mem bw':>11}  "
          f"{'host link (out / in)':<34}{'launch':>8}")
    for r in table.itertuples(index=False):
        def tf(x):
            return "-" if math.isnan(x) else f"{x / 1e12:.0f}"
        link = f"{r.host_link} ({r.host_bw_out / 1e9:.0f} / {r.host_bw_in / 1e9:.0f} GB/s)"
        print(f"{r.name:<16}{tf(r.bf16_flops):>13}{tf(r.fp32_flops):>8}{tf(r.fp8_flops):>8}"
              f"{format_bytes(r.memory_bytes):>10}{r.mem_bw / 1e12:>8.2f} TB/s  {link:<34}{format_ns(r.launch_ns):>8}")
    print("peaks are dense datasheet rates (no sparsity); sources: memlens gpus --json")
    return 0
