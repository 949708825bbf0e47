"""`memlens predict --world-size 8 [--strategy fsdp2] -- python train.py`: the per-rank table.

The script runs as each predicted rank under torch's fake process group (`memlens.prediction.distributed`);
it uses its strategy itself (``fully_shard``, ``DistributedDataParallel``, ``ZeroRedundancyOptimizer``,
``torch.distributed.pipelining`` stages and schedules: ``pp``, every stage rank runs):
memlens never wraps the model. ``--strategy`` states what the script is expected to use, and the command
fails when the run shows otherwise, so a table is never labelled with a strategy that did not run.
"""
from __future__ import annotations


def _ranks_option(text: str):
    from memlens.errors import InputError
    if text in ("auto", "all", "first"):
        return text
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--ranks {text!r}: auto, all, first or a comma list of ranks") from None


def run_ranks(args, argv: list[str]) -> int:
    """Predict the script (`argv`: script and its arguments) per rank; print the table (or JSON). Exit status:
    0 when every rank ran to its end, 1 when the script failed on a rank (no verdict printed), 2 when
    ``--strategy`` was not what the script used."""
    from memlens.commands._output import print_json
    from memlens.prediction.distributed.ranks import predict_ranks
    from memlens.units import format_bytes, format_ns
    options = {"conf": args.conf, "cudnn_workspace": args.cudnn_workspace,
               "kernel_scratch": not args.no_kernel_scratch}
    d = predict_ranks(argv[0], args.gpu, args.capacity, world_size=args.world_size, ranks=_ranks_option(args.ranks),
                      args=argv[1:], nccl_channels=args.nccl_channels, **options)
    s = d.summary()
    mismatch = None
    if args.strategy and not d.errors and args.strategy not in d.strategies:
        mismatch = (f"--strategy {args.strategy}: the script used "
                    f"{', '.join(sorted(d.strategies)) or 'no sharding strategy memlens recognises'}; "
                    "memlens does not wrap the model, so the prediction is not one of that strategy")
    s["strategy_error"] = mismatch
    written = {}
    if args.out and not d.errors:       # one rank: OUT itself; several: OUT/rank<r>.memlens per rank that ran
        import os
        for rank, p in sorted(d.predictions.items()):
            path = args.out if len(d.predictions) == 1 else os.path.join(args.out, f"rank{rank}.memlens")
            p.trace.save(path)
            written[rank] = path
    s["traces"] = list(written.values())
    report_path = getattr(args, "report", None)
    if report_path and not d.errors:
        from memlens.reporting.predicted_ranks import write_predicted_ranks_report
        write_predicted_ranks_report(d, report_path, saved=written)
        s["report"] = report_path
    timing = {} if d.errors else d.step_time()      # ns on the modeled GPU clock, collectives included
    s["step_time"] = {str(r): {k: v for k, v in t.items() if k != "schedule"} for r, t in timing.items()}
    if args.json:
        print_json(s)
    else:
        print(f"gpu:        {d.gpu}, world size {d.world_size}, strategy used: "
              f"{', '.join(sorted(d.strategies)) or 'none recognised'}")
        if d.errors:
            for rank, err in sorted(d.errors.items()):
                print(f"rank {rank}:     the script raised {err}; no prediction")
        else:
            print(d.table())
            print(f"ranks:      {d.symmetry}")
            print(f"NCCL:       {d.nccl['bytes']:,} bytes per rank counted against capacity "
                  f"({d.nccl.get('formula', '')}; {d.nccl['source']})")
            print(f"fits:       {d.fits()}")
            for rank, t in sorted(timing.items()):
                print(f"step time:  rank {rank} {format_ns(t['step_ns'])} on the modeled GPU clock (compute "
                      f"{format_ns(t['compute_ns'])}, {t['collectives']} collectives {format_ns(t['comm_ns'])} over "
                      f"{t['link']}, exposed {format_ns(t['exposed_comm_ns'])}; modeled, not measured)")
                if "pipeline_step_ns" in t:       # pipeline stages joined on one clock (pipeline_time)
                    print(f"pipeline:   rank {rank} waited {format_ns(t['wait_ns'])} for its neighbours, received "
                          f"{format_bytes(t['p2p_bytes'])} in {format_ns(t['p2p_ns'])} of transfers; whole step "
                          f"{format_ns(t['pipeline_step_ns'])}, this rank idle {format_ns(t['bubble_ns'])} of it")
                if t["note"]:
                    print(f"note:       rank {rank}: {t['note']}")
        if written:
            print(f"traces:     {', '.join(written.values())}")
        if s.get("report"):
            print(f"report:     {s['report']}")
        for note in d.notes:
            print(f"note:       {note}")
        if mismatch:
            print(f"error:      {mismatch}")
    if d.errors:
        return 1
    return 2 if mismatch else 0
