"""Shared `--gpu` option of the analysis verbs: put the trace on a GPU's modeled clock before analysing
it, and take the host link from that GPU unless --bandwidth says otherwise."""
from __future__ import annotations


def add_gpu_option(parser) -> None:
    """Add ``--gpu NAME`` and ``--tf32`` to a verb's parser."""
    parser.add_argument("--gpu", default=None, metavar="NAME",
                        help="analyse on the modeled clock of this GPU (H100, H200, A100, L4, V100, MI300X ...; "
                             "see `memlens gpus`; or a JSON file from `memlens calibrate`): the trace is retimed "
                             "first, and its host link is the default --bandwidth")
    parser.add_argument("--tf32", action="store_true",
                        help="with --gpu: fp32 matmuls run at the TF32 tensor-core rate")


def apply_gpu(trace, args):
    """(trace on the requested clock, the GPU or None). Raises InputError for an unknown GPU or a trace
    without cost facts."""
    name = getattr(args, "gpu", None)
    if not name:
        return trace, None
    from memlens.devicetime import gpu
    from memlens.devicetime.retiming import retime
    g = gpu(name)
    return retime(trace, gpu=g, tf32=getattr(args, "tf32", False)), g


def link_for(args, g, default: str = "pcie4"):
    """The BandwidthModel of --bandwidth/--latency-us, or of the GPU's host link when only --gpu is given."""
    from memlens.analysis.bandwidth import BandwidthModel
    latency = None if getattr(args, "latency_us", None) is None else args.latency_us * 1e3
    if getattr(args, "bandwidth", None) is None and g is not None:
        out_bps, in_bps = g.host_bw
        model = BandwidthModel(h2d_bytes_per_s=in_bps, d2h_bytes_per_s=out_bps, latency_ns=g.latency_ns,
                               name=f"{g.name} {g.host_link}")
        return model if latency is None else model.with_latency(latency)
    return BandwidthModel.parse(args.bandwidth or default, latency_ns=latency)


def clock_line(trace_or_clock) -> str:
    """'clock: modeled H100 SXM clock' - the first line of every time-based text output (a Trace, or a
    clock dict as in ``metadata["clock"]``)."""
    from memlens.clock import clock_label
    return f"clock: {clock_label(trace_or_clock)}"


def refuse_gpu_with_dask(args) -> None:
    """--gpu retimes the whole trace in memory: not combinable with the out-of-core engine (yet)."""
    if getattr(args, "gpu", None):
        from memlens.errors import InputError
        raise InputError("--gpu needs the trace in memory (it is retimed first); use --engine memory, or "
                         "`memlens retime` then the dask engine on the retimed trace")


def file_clock(path) -> dict:
    """The clock of a saved .memlens trace from its manifest alone (for the out-of-core engine, which
    never loads the whole trace), as the contract's dict (`memlens.trace.schema.conform_clock`); host when unknown."""
    import json
    from pathlib import Path

    from memlens.trace.schema import conform_clock
    try:
        manifest = json.loads((Path(path) / "manifest.json").read_text())
        return conform_clock((manifest.get("metadata") or {}).get("clock"))
    except (OSError, ValueError, AttributeError):
        return conform_clock(None)
