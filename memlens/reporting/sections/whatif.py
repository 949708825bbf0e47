"""Report section: the same run under other memory policies (allocator settings, static plan, swapping)."""
from __future__ import annotations

import pandas as pd

from memlens.reporting.markup import note, paragraph, table, tag
from memlens.reporting.sections.base import ReportContext, SectionUnavailable
from memlens.reporting.window import peak_window
from memlens.units import format_bytes, format_ns

# the what-ifs of bigger traces run on a window around the peak (their cost grows faster than linearly)
MAX_BLOCKS_WITH_ACCESSES = 10_000  # about 4 s of what-ifs on 2 cores (swap selection dominates)
MAX_BLOCKS_WITHOUT_ACCESSES = 50_000  # about 6 s (planning and simulation)
# allocator settings people try first when fragmentation bites
CONF_VARIANTS = ("expandable_segments:True", "garbage_collection_threshold:0.6,max_split_size_mb:128")


def whatif(ctx: ReportContext) -> list:
    """`memlens.whatif.compare` as a table and `memlens.whatif.whatif_figure` as bars."""
    from memlens.viz.allocator import allocator_timeline
    from memlens.viz.whatif import whatif_comparison
    from memlens.whatif import compare

    if not ctx.options.whatif:
        raise SectionUnavailable("what-if simulations were switched off for this report (whatif=False / "
                                 "--no-whatif)")
    if len(ctx.trace.blocks) == 0:
        raise SectionUnavailable("the trace has no blocks to simulate")
    max_blocks = ctx.options.whatif_max_blocks
    if max_blocks is None:  # swap planning, the slowest what-if, runs only on traces with accesses
        max_blocks = MAX_BLOCKS_WITH_ACCESSES if ctx.trace.has_accesses else MAX_BLOCKS_WITHOUT_ACCESSES
    window = peak_window(ctx.trace, max_blocks, ctx.iterations if len(ctx.trace.blocks) > max_blocks else None)
    df = compare(window.trace, bandwidth=ctx.options.bandwidth or "pcie4", conf_variants=list(CONF_VARIANTS),
                 time_limit_s=ctx.options.whatif_time_limit_s, limit=ctx.options.memory_limit)
    parts = []
    if window.blocks < window.total_blocks:
        parts.append(note(
            f"The trace has {window.total_blocks:,} blocks: the what-if simulations ran on {window.how} "
            f"({format_ns(window.start_ns)} to {format_ns(window.end_ns)}, {window.blocks:,} blocks; blocks alive "
            "across its edges count as allocated before / never freed). Run `memlens simulate`, `memlens plan` "
            "and `memlens swap` for the whole trace."))
    parts.append(paragraph(
        "How much device memory the same sequence of allocations needs when the caching allocator is "
        "simulated (recorded settings and common PYTORCH_CUDA_ALLOC_CONF variants), when every block gets a "
        "static offset from a planner, and when idle blocks are swapped to host memory. Max-live is the "
        "bound of any policy that keeps every block resident."))
    parts.append(whatif_comparison(df))
    fmt = {"bytes": lambda v: "n/a" if pd.isna(v) else f"{format_bytes(v)} ({int(v):,} B)",
           "ratio_to_max_live": lambda v: "" if pd.isna(v) else f"{v:.3f}x"}
    parts.append(table(df, fmt, {"ratio_to_max_live": "vs max-live"}))
    parts += _swap_figures(df.attrs.get("swap_plans") or {}, window)
    parts.append(paragraph("The caching allocator replayed under the recorded settings (memlens.simulate): what "
                           "it reserves from the device, what it hands out, and the live bytes of the trace."))
    parts.append(allocator_timeline(window.trace, max_points=ctx.options.max_points,
                                    x_offset_ns=window.start_ns if window.blocks < window.total_blocks else 0))
    if ctx.recorded is not None and ctx.trace.has_accesses and window.blocks == window.total_blocks:
        parts += _two_clocks_swap(ctx)
    return parts


def _two_clocks_swap(ctx: ReportContext) -> list:
    """Swapping planned on the recorded clock beside the modeled GPU clock (same link, same limit)."""
    from memlens.clock import clock_label
    from memlens.swap import plan_swaps
    from memlens.swap.planner import size_floor

    rows = []
    floor = size_floor(max(ctx.trace.peak_live_bytes().values(), default=0))  # the what-if table's floor
    for trace in (ctx.recorded, ctx.trace):
        sp = plan_swaps(trace, bandwidth=ctx.options.bandwidth or "pcie4", limit=ctx.options.memory_limit,
                        min_size=floor)
        rows.append({"clock": clock_label(trace), "device": sp.device, "peak before": sp.peak_before,
                     "peak after swapping": sp.peak_after, "swaps": len(sp.swaps),
                     "bytes copied": sp.transfer_bytes, "stall_ns": sp.stall_ns})
    df = pd.DataFrame(rows)
    fmt = {"peak before": format_bytes, "peak after swapping": format_bytes, "bytes copied": format_bytes,
           "stall_ns": format_ns}
    return [tag("h3", "swapping: recorded clock vs modeled clock"),
            paragraph("The swap plan depends on time: on the recorded (host) clock idle intervals are inflated "
                      "and swapping looks free; on the GPU clock fewer intervals fit a round trip over the link."),
            table(df, fmt, {"stall_ns": "estimated stall"})]


def _swap_figures(plans: dict, window) -> list:
    """The swap plan of each device: load before/after, the copies on their two streams, the priorities."""
    from memlens.viz.swap import swap_load_curves, swap_priorities, swap_timeline

    parts = []
    for device, plan in plans.items():
        parts.append(paragraph(
            f"Swapping on {device}: {len(plan.swaps):,} swaps ({plan.priority}) of blocks of at least "
            f"{format_bytes(plan.min_size)} (Zhang et al.'s 1 MB floor) over {plan.bandwidth_text}, each copy "
            f"paying its latency; peak {format_bytes(plan.peak_before)} -> {format_bytes(plan.peak_after)} "
            f"(infinite bandwidth: {format_bytes(plan.infinite_bandwidth_peak)}), estimated stall "
            f"{format_ns(plan.stall_ns)}. Candidates are the ATIs (end of one op to the start of the next); "
            "times are on the trace's clock" + (" of the what-if window." if window.blocks < window.total_blocks
                                                else ".") +
            " `memlens swap --steady-state` plans one iteration as a repeating period."))
        if len(plan.swaps):
            parts += [swap_load_curves(plan), swap_timeline(plan)]
        if plan.candidates_table is not None and len(plan.candidates_table):
            parts.append(swap_priorities(plan))
    return parts
