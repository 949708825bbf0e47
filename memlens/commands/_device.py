"""Shared `--gpu` option of the analysis verbs: put the trace on a GPU's modeled clock before analysing
it, and take the host link from that GPU unless --bandwidth says otherwise."""
from __future__ import annotations


def add_gpu_option(parser) -> None:
    """Add ``--gpu NAME`` and ``--tf32`` / ``--no-tf32`` to a verb's parser."""
    import argparse
    parser.add_argument("--gpu", default=None, metavar="NAME",
                        help="analyse on the modeled clock of this GPU (H100, H200, A100, L4, V100, MI300X ...; "
                             "see `memlens gpus`; or a JSON file from `memlens calibrate`): the trace is retimed "
                             "first, and its host link is the default --bandwidth")
    parser.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=None,
                        help="with --gpu: fp32 matmuls and convolutions run at the TF32 tensor-core rate "
                             "(--no-tf32: neither); default: what the trace says, else PyTorch's defaults "
                             "(matmul off, cuDNN convolutions on; ROCm neither), stated with the clock")
    add_source_gpu_option(parser)


def add_source_gpu_option(parser) -> None:
    """Add ``--source-gpu NAME``: the GPU a measured profile ran on."""
    parser.add_argument("--source-gpu", default=None, metavar="NAME",
                        help="with --gpu: the GPU the profile was measured on (a name from `memlens gpus` or a "
                             "JSON file), when the trace's device name does not say it; the trace's measured "
                             "kernel times are scaled op by op onto --gpu instead of modeled from shapes")


def source_gpu_of(args):
    """The GPU of ``--source-gpu`` (None when not given). InputError naming the known GPUs for an unknown name."""
    name = getattr(args, "source_gpu", None)
    if name is None:
        return None
    from memlens.devicetime import gpu
    return gpu(name)


def on_measured_clock(trace, source, path=None):
    """`trace` on its measured kernel clock when ``--source-gpu`` is given (a CUDA recording already is; an
    imported profile is moved onto the clock of its kernels), so that retime scales the measured times; as
    it is otherwise. InputError naming `path` when the trace has no kernel times to scale."""
    from memlens.trace import clock_of
    if source is None or clock_of(trace).get("kind") == "cuda":
        return trace
    from memlens.clock import onto_kernel_clock
    from memlens.errors import InputError
    try:
        return onto_kernel_clock(trace, gpu=source.name)
    except InputError as exc:
        raise InputError(f"--source-gpu scales measured kernel times onto --gpu, but {exc}", path) from None


def apply_gpu(trace, args):
    """(trace on the requested clock, the GPU or None). With ``--source-gpu`` the measured kernel times are
    scaled from that GPU (`memlens.retime`'s ``source_gpu``). Raises InputError for an unknown GPU, for
    --source-gpu without --gpu, or for a trace without cost facts (or, with --source-gpu, kernel times)."""
    name = getattr(args, "gpu", None)
    source = source_gpu_of(args)
    if not name:
        if source is not None:
            from memlens.errors import InputError
            raise InputError("--source-gpu says which GPU measured the profile; give the GPU to retime it onto "
                             "with --gpu")
        return trace, None
    from memlens.devicetime import gpu
    from memlens.devicetime.retiming import retime
    g = gpu(name)
    trace = on_measured_clock(trace, source, getattr(args, "trace", None))
    return retime(trace, gpu=g, tf32=getattr(args, "tf32", None), source_gpu=source), g


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
    """'clock: modeled H100 SXM clock; TF32 matmul off, conv on (...)' - the first line of every time-based
    text output (a Trace, or a clock dict as in ``metadata["clock"]``); a modeled clock says its TF32
    settings and where they came from."""
    from memlens.clock import clock_label, tf32_label
    from memlens.trace import clock_of
    clock = trace_or_clock if isinstance(trace_or_clock, dict) else clock_of(trace_or_clock)
    tf32 = tf32_label(clock.get("tf32")) if clock.get("kind") == "modeled" else ""
    return f"clock: {clock_label(clock)}" + (f"; {tf32}" if tf32 else "")


def refuse_gpu_with_dask(args) -> None:
    """--gpu retimes the whole trace in memory: not combinable with the out-of-core engine (yet)."""
    if getattr(args, "gpu", None) or getattr(args, "source_gpu", None):
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
