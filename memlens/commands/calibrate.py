"""`memlens calibrate PROFILE -o mygpu.json [--base H100]`: a GPU fitted to a real profile's kernels."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the device-time model to the kernels of your own profile",
                       description="Fit the cost model's per-class constants (fixed part and throughput part "
                                   "of each op class) to the kernel times a real profile measured, starting "
                                   "from a built-in GPU, and save the result as JSON. Use it wherever a GPU "
                                   "is asked for: --gpu mygpu.json.")
    p.add_argument("profile", help="a profile with op shapes and kernel times (Kineto/torch.profiler JSON, "
                                   "or a .memlens trace recorded on CUDA)")
    from memlens.commands import options
    p.add_argument("-o", "--output", required=True, type=options.output_path, help="the JSON file to write (e.g. mygpu.json)")
    p.add_argument("--base", default="H100", help="the built-in GPU to start from (see `memlens gpus`; "
                                                  "default H100)")
    import argparse
    p.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=None,
                   help="fp32 matmuls and convolutions ran at the TF32 tensor-core rate (--no-tf32: neither; "
                        "default: PyTorch's defaults, matmul off and cuDNN convolutions on)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from memlens.commands._output import print_json
    from memlens.devicetime.calibration import calibrate
    from memlens.devicetime.gpus import save_gpu
    from memlens.units import format_ns

    g = calibrate(args.profile, base=args.base, tf32=args.tf32)
    path = save_gpu(g, args.output)
    info = g.calibration
    if args.json:
        print_json({"path": str(path), "gpu": g.name, "calibration": info,
                    "class_scale": {k: list(v) for k, v in g.class_scale.items()}})
        return 0
    print(f"wrote {path}: {g.name}")
    print(f"total modeled / measured: {info['total_ratio_before']:.2f} built-in -> "
          f"{info['total_ratio_after']:.2f} calibrated")
    print(f"  {'class':<14}{'ops':>6}{'measured':>11}{'built-in':>10}{'fitted':>8}{'fixed x':>9}{'rate x':>8}")
    for cls, c in sorted(info["classes"].items(), key=lambda kv: -kv[1]["measured_ns"]):
        print(f"  {cls:<14}{c['ops']:>6}{format_ns(c['measured_ns']):>11}{c['ratio_before']:>10.2f}"
              f"{c['ratio_after']:>8.2f}{c['fixed_factor']:>9.2f}{c['throughput_factor']:>8.2f}")
    print(f"use it with --gpu {path}")
    return 0
