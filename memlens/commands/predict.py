"""`memlens predict --gpu H100 --capacity 80GiB [--out run.memlens] -- python train.py ARGS`.

Runs a script under `memlens.predict` (fake `cuda`, no GPU, no real memory) and prints the predicted peaks;
`--out` writes the predicted trace (a `.memlens` directory any memlens command reads). The script runs in
this process after memlens has loaded its fake-CUDA shim, which is why this route works where the script
itself imports torch first.
"""
from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser("predict", help="predict a script's GPU memory without a GPU",
                       description="Run `-- python script.py args` on fake cuda tensors and predict peak "
                                   "allocated/reserved bytes through the caching-allocator simulator.")
    p.add_argument("--gpu", default="H100", help="GPU model (H100, H200, A100, L4, ...; default H100) or a JSON file from "
                                                    "`memlens calibrate` (its base GPU's memory facts)")
    p.add_argument("--capacity", default=None, help="device memory to check against, e.g. 80GiB "
                                                    "(default: the GPU's)")
    p.add_argument("--conf", default=None, help="PYTORCH_CUDA_ALLOC_CONF (default: the environment's)")
    p.add_argument("--cudnn-workspace", default=None, metavar="SIZE",
                   help="cuDNN workspace allowance per convolution call, e.g. 256MiB (default: none; cuDNN's "
                        "algorithm choice cannot be known without the GPU)")
    p.add_argument("--no-kernel-scratch", action="store_true",
                   help="leave out the modelled CUDA kernel temporaries (index_put sort, reduction buffers)")
    p.add_argument("--out", default=None, help="write the predicted trace to this .memlens path (with --world-size and "
                                                "several ranks run: OUT/rank<r>.memlens)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="predict sharded training per rank: the script runs as each predicted rank of N under "
                        "torch's fake process group (its own init_process_group, FSDP2, DDP, pipeline stages "
                        "run as written)")
    p.add_argument("--strategy", choices=("fsdp2", "ddp", "zero", "pp"), default=None,
                   help="with --world-size: the strategy the script itself uses (pp: torch.distributed."
                        "pipelining stages); memlens checks it was used (it does not wrap the model)")
    p.add_argument("--ranks", default="auto",
                   help="with --world-size: auto (rank 0 and the last; all when they differ), all, first, or a "
                        "comma list of ranks")
    p.add_argument("--nccl-channels", type=int, default=None,
                   help="with --world-size: NCCL channels in the NCCL memory allowance (default 16)")
    p.add_argument("--report", default=None, metavar="HTML",
                   help="with --world-size: write the multi-run report of the predicted ranks (one page, a rank "
                        "selector; marked as predicted on the modeled clock)")
    p.add_argument("command", nargs=argparse_remainder(), help="-- python script.py [args]")
    p.set_defaults(func=run)


def argparse_remainder():
    import argparse
    return argparse.REMAINDER


def _script_argv(command: list[str]) -> list[str]:
    from memlens.errors import InputError
    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if cmd and (cmd[0].endswith("python") or cmd[0].split("/")[-1].startswith("python")):
        cmd = cmd[1:]
    if not cmd or not cmd[0].endswith(".py"):
        raise InputError("predict: give the script after --, e.g. `memlens predict -- python train.py`")
    return cmd


def run(args) -> int:
    import os

    from memlens.commands._output import print_json
    from memlens.errors import InputError
    from memlens.prediction.predictor import Prediction
    from memlens.script_runner import run_script
    from memlens.units import format_bytes

    argv = _script_argv(args.command)
    script = argv[0]
    if not os.path.isfile(script):
        raise InputError(f"{script}: no such script")
    if args.world_size is not None:
        from memlens.commands.predict_ranks import run_ranks
        return run_ranks(args, argv)
    p = Prediction(args.gpu, args.capacity, conf=args.conf, cudnn_workspace=args.cudnn_workspace,
                   kernel_scratch=not args.no_kernel_scratch)
    failure = None
    try:
        with p:
            run_script(script, argv[1:])
    except SystemExit as exc:
        if exc.code not in (0, None):
            failure = f"the script exited with {exc.code}"
    except Exception:  # the script's own error: shown as Python shows it, and no verdict (below)
        if p.failure is None:   # not the script's: memlens's own (the shim, say) reports itself
            raise
        import traceback
        traceback.print_exc()
        failure = f"the script raised {p.failure}"
    if failure is not None:
        # a run that did not complete has no peak to report and must never be said to fit
        print(f"memlens predict: {script}: no prediction: {failure}", file=sys.stderr)
        return 1
    if p.trace is None:
        raise InputError(f"{script}: nothing was predicted (no trace)")
    if args.out:
        p.trace.save(args.out)
    s = p.summary()
    oom = p.oom
    s["oom"] = str(oom) if oom is not None else None
    if args.json:
        print_json(s)
    else:
        print(f"gpu:                {s['gpu']}")
        print(f"peak allocated:     {format_bytes(s['peak_allocated'])} ({s['peak_allocated']:,} bytes)")
        print(f"peak reserved:      {format_bytes(s['peak_reserved'])} ({s['peak_reserved']:,} bytes)")
        print(f"device memory need: {format_bytes(s['device_bytes_needed'])} (reserved + CUDA context)")
        if s.get("device_busy_ns") is not None:
            from memlens.units import format_ns
            print(f"modeled GPU time:   {format_ns(s['device_busy_ns'])} busy (memlens.retime's cost model)")
        print(f"fits:               {s['fits']}" + (f"  ({s['oom']})" if s["oom"] else ""))
        if args.out:
            print(f"trace:              {args.out}")
        if p.standin_note:
            print(f"note:               {p.standin_note}")
    return 0
