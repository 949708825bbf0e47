"""The analyses stated in sentences with numbers, for people (reports, notebooks, the CLI).

`findings(trace)` runs what the trace supports and says plainly what it cannot compute and why (a CUDA
snapshot has no accesses, so no ATI, bandwidth filter or idle outliers). `findings_html` renders the
sentences as an HTML list with every value escaped.
"""
from __future__ import annotations

import html

import numpy as np

from memlens.analysis.bandwidth import DEFAULT, BandwidthModel
from memlens.trace import clock_of
from memlens.units import format_bytes, format_ns

IDLE_SHARE = 0.4  # "idle for more than 40% of the step" - the share named in the sentence


def _pct(x: float) -> str:
    from memlens.units import format_share  # one percentage format everywhere (never 100% beside 99.8% of the same value)
    return format_share(x)


def _count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 block', '2,345 blocks'."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {plural or noun + 's'}"


def _overview(trace) -> str:
    s = trace.summary()
    total = int(trace.blocks["size"].sum())
    what = (f"{_count(s['accesses'], 'access', 'accesses')} by {_count(s['ops'], 'op')}"
            if s["has_accesses"] else "no per-access data")
    return (f"The trace ({s['source_kind']}) holds {_count(s['blocks'], 'block')} ({format_bytes(total)} allocated in "
            f"total) on {', '.join(s['devices']) or 'no device'} over {format_ns(s['duration_ns'])}, with {what}.")


def _peak(trace) -> list[str]:
    from memlens.analysis.peak import peak_breakdown
    out = []
    for p in peak_breakdown(trace).values():
        text = p.describe()
        module = p.module_sentence()
        if module:
            text += " " + module
        out.append(text)
    return out


def _iterations(trace, iv):
    from memlens.analysis.iterations import split_iterations
    from memlens.analysis.stability import iteration_stability
    its = split_iterations(trace)
    source = str(its["source"].iloc[0])
    if source == "none":
        return its, [("No repeating allocation pattern was found and the trace has no iteration markers, so it "
                      "is analysed as one piece (call memlens.step() once per training step to mark them).")]
    how = {"marker": "from explicit markers", "optimizer": "from optimizer steps",
           "detected": f"by detecting the repeating allocation pattern "
                       f"({its.attrs.get('period_allocations', '?')} allocations per step)",
           "backward": "from the backward passes in the stacks", "zero_grad": "from the zero_grad calls",
           "model calls": "from repeated calls of the model in the stacks"}.get(source, f"from {source}")
    stab = iteration_stability(trace, its, iv)
    duration = float(np.median(its["end_ns"] - its["start_ns"]))
    found = "1 iteration was" if len(its) == 1 else f"{len(its):,} iterations were"
    text = f"{found} found {how}; a typical one lasts {format_ns(duration)}."
    if stab["score"] is not None:
        parts = ", ".join(f"{k} {_pct(v)}" for k, v in stab["components"].items())
        text += (f" Consecutive iterations are {_pct(stab['score'])} alike (median; {parts}), "
                 f"the least alike pair {_pct(stab['min_score'])}.")
    return its, [text]


def _access_findings(trace, bw: BandwidthModel, its, iv) -> list[str]:
    from memlens.analysis.ati import ati_stats
    from memlens.analysis.outliers import outliers
    from memlens.analysis.swappable import bandwidth_filter, filter_summary
    s = ati_stats(iv)
    if s["count"] == 0:
        return ["The trace has accesses but no block accessed twice: there is no access time interval (ATI) "
                "to measure."]
    out = [f"Of {_count(s['count'], 'access time interval')} (ATI: from the end of one op using a block to the "
           f"start of the next; lifetime edges apart), half are shorter than {format_ns(s['p50_ns'])} and 90% "
           f"shorter than {format_ns(s['p90_ns'])}; {_pct(s['fraction_below']['100us'])} are under 100 us "
           f"and {_pct(s['fraction_below']['1ms'])} under 1 ms."]
    flt = filter_summary(bandwidth_filter(iv, bw))
    share = flt["swappable_share"]
    out.append(f"{_pct(flt['filtered_out_fraction'])} of the ATIs are shorter than the time to move "
               f"their block out and back in over {bw.describe()}; the {flt['swappable']:,} that are long enough "
               f"hold {_pct(share) if share is not None else 'none'} of the idle byte-time.")
    ranked = outliers(trace, bw, top=None, intervals=iv)
    if len(its) > 1 or its["source"].iloc[0] != "none":
        step = float(np.median(its["end_ns"] - its["start_ns"]))
        step_name = "the step"
    else:
        step = float(trace.duration_ns)
        step_name = "the trace"
    idle = ranked[ranked["max_idle_ns"] > IDLE_SHARE * step]
    if len(idle) and step > 0:
        by_cat = idle.groupby("category")["size"].sum().sort_values(ascending=False)
        cats = ", ".join(f"{c or 'unknown'} {format_bytes(b)}" for c, b in by_cat.head(3).items())
        out.append(f"{_count(len(idle), 'block')} of {format_bytes(idle['size'].sum())} in total "
                   f"{'is' if len(idle) == 1 else 'are'} idle for more than "
                   f"{_pct(IDLE_SHARE)} of {step_name} ({format_ns(step)}) at a stretch: {cats}.")
    if len(ranked):
        top = ranked.iloc[0]
        where = " ".join(x for x in (str(top.get("op") or ""), f"in {top['module']}" if top.get("module") else "")
                         if x)
        out.append(f"The biggest idle block by size x idle time is block {top['block_id']} "
                   f"({format_bytes(top['size'])}, {top.get('category') or 'unknown'}{', ' + where if where else ''}), "
                   f"idle for {format_ns(top['max_idle_ns'])} ({_pct(top['idle_fraction'])} of its lifetime).")
    if set(trace.devices) == {"cpu"} and clock_of(trace)["kind"] == "host":   # not once retimed
        out.append("These times come from a CPU run: ops take far longer than on a GPU, so intervals are longer "
                   "and more of them pass the bandwidth filter than they would on a GPU.")
    return out


def _fragmentation(trace) -> list[str]:
    from memlens.analysis.fragmentation import fragmentation
    out = []
    for dev, f in fragmentation(trace).items():
        if "reserved_bytes" in f and f["reserved_bytes"] > 0:
            text = (f"On {dev} the allocator had reserved {format_bytes(f['reserved_bytes'])} at the end of "
                    f"recording, of which {format_bytes(f['reserved_unallocated_bytes'])} "
                    f"({_pct(f['fragmentation'])}) was cached but unallocated")
            if f.get("free_blocks"):
                text += (f", split into {f['free_blocks']:,} free blocks, the largest "
                         f"{format_bytes(f['largest_free_block'])}")
            out.append(text + ".")
        if f.get("reserved_over_live"):
            before = f.get("initial_reserved_bytes") or 0
            out.append(f"Its reserved memory peaked at {format_bytes(f['peak_reserved_bytes'])}, "
                       f"{f['reserved_over_live']:.2f}x the peak of live blocks"
                       + (f" ({format_bytes(before)} of it already reserved when recording began)" if before else "")
                       + ".")
    return out


def findings(trace, bandwidth: BandwidthModel | str | None = None) -> list[str]:
    """Sentences with numbers describing `trace`: overview, peak per device, iterations and their
    stability, ATI and the bandwidth filter at `bandwidth` (default PCIe 4.0 x16), idle outliers, and
    allocator fragmentation where segments exist. Analyses that need accesses are replaced by one sentence
    saying why they cannot run."""
    bw = BandwidthModel.parse(bandwidth) if bandwidth is not None else DEFAULT
    out = [_overview(trace)]
    if len(trace.blocks) == 0:
        return out + [trace.no_blocks[0].upper() + trace.no_blocks[1:] + ": there is no memory to analyse."]
    out += _peak(trace)
    iv = None
    if trace.has_accesses:
        from memlens.analysis.ati import access_intervals
        iv = access_intervals(trace)  # once, for the iterations' ATI similarity and the access findings
    its, text = _iterations(trace, iv)
    out += text
    if trace.has_accesses:
        out += _access_findings(trace, bw, its, iv)
    else:
        source = trace.metadata.get("source_kind", "unknown")
        out.append(f"This trace ({source}) records allocations and frees but not which op read or wrote each "
                   "block, so access intervals (ATI), the bandwidth filter and idle outliers cannot be computed; "
                   "record the run with memlens.record to get them.")
    out += _fragmentation(trace)
    return out


def findings_html(sentences: list[str], css_class: str = "memlens-findings") -> str:
    """The sentences as ``<ul class=...><li>...</li></ul>``, every sentence HTML-escaped."""
    items = "".join(f"<li>{html.escape(s)}</li>" for s in sentences)
    return f'<ul class="{html.escape(css_class, quote=True)}">{items}</ul>'
