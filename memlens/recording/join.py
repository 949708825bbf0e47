"""Join allocator-level events with the dispatch mode's tensor-level blocks.

Each allocator event stream (the profiler's CPU/CUDA allocation events, or a CUDA snapshot's
``device_traces``) is first paired into allocator blocks (alloc -> next free of the same address).
A dispatch block matches the allocator block on the same device and address whose lifetime contains
the moment the dispatch mode first saw it, of the same size on CPU (allocators there report requested
bytes) or at least as large elsewhere (the CUDA caching allocator reports its rounded block size;
`allocator_size` keeps it, `size` stays the requested bytes). Then:

- matched blocks keep the dispatch view (accesses, attribution) and take the allocator's alloc time
  (clamped into the allocating op); `source` = "dispatch+<instrument>";
- allocator blocks no tensor showed (temporaries inside ops, workspace buffers) are added with the op
  whose interval contains them; `source` = "<instrument>"; category "temporary" when freed inside the
  op that made them, else "unknown";
- dispatch blocks no allocator saw keep `source` = "dispatch" (e.g. allocated before recording).
The two instruments run on different clocks (wall vs perf counter); a residual offset is estimated
from the matched blocks (the allocation must fall inside its op) and removed.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memlens.recording.columns import Columns, Nullable, first_occurrences, objects
from memlens.recording.instruments import AllocatorData
from memlens.recording.join_unmatched import MATCH_TOLERANCE_NS, allocator_only
from memlens.units import format_ns

_INT64_MAX = np.iinfo(np.int64).max
_NO_ALLOC_KEY = -(2 ** 62)       # match_blocks' sort key of an allocation made before the instrument started
# A join runs a few hundred array operations on tables of a few hundred rows at a one-step close, where a
# call's fixed cost outweighs its work: np.clip, np.full, np.flatnonzero, np.cumsum and ndarray.any cost 2-7x
# np.minimum(np.maximum(...)), np.empty + fill, .nonzero()[0], .cumsum() and np.count_nonzero there. Times
# stay int64 with a missing mask (no NaN float form, which costs a conversion per use).


def _minus_ones(n: int) -> np.ndarray:
    """`np.full(n, -1, dtype=np.int64)` without its Python-level wrapper (a fifth of its cost on small n)."""
    out = np.empty(n, dtype=np.int64)
    out.fill(-1)
    return out


def as_columns(table) -> Columns:
    """`table` as `Columns` (a DataFrame is converted once; Columns pass through)."""
    return table if isinstance(table, Columns) else Columns.from_frame(table)


def pair_events(events) -> Columns:
    """Allocator events (t_ns, device, addr, delta; a DataFrame or `Columns`) -> allocator blocks (device,
    addr, size, alloc_t, free_t; alloc_t / free_t `Nullable`).

    A free with no alloc before it (allocated before the instrument started) gives a row with
    alloc_t missing; an alloc never freed has free_t missing. Times stay in the events' unit.
    """
    if events is None or len(events) == 0:
        return Columns(0, {"device": np.empty(0, object), "addr": np.empty(0, np.int64),
                           "size": np.empty(0, np.int64), "alloc_t": Nullable.absent(0),
                           "free_t": Nullable.absent(0)})
    ev = as_columns(events)
    dev_code, dev_names = _factorize(ev["device"], use_na_sentinel=True)
    t_in, addr_in, delta_in = (np.asarray(ev[c], dtype=np.int64) for c in ("t_ns", "addr", "delta"))
    one_device = len(dev_names) == 1 and not np.count_nonzero(dev_code < 0)
    # by (device, address, time), equal ones in event order (np.lexsort is stable)
    order = np.lexsort((t_in, addr_in) if one_device else (t_in, addr_in, dev_code))
    t, addr, delta = t_in[order], addr_in[order], delta_in[order]
    n = len(t)
    is_alloc = delta > 0
    is_free = delta < 0
    # paired[i]: the alloc at i is freed by the event after it (same device and address)
    pairs = is_alloc[:-1] & is_free[1:] & (addr[1:] == addr[:-1])
    if not one_device:
        dev = dev_code[order]
        pairs &= dev[1:] == dev[:-1]
    paired = np.empty(n, dtype=bool)
    paired[:-1] = pairs
    paired[-1] = False
    orphan_free = is_free.copy()
    orphan_free[1:] &= ~pairs
    alloc_rows = is_alloc.nonzero()[0]
    free_rows = orphan_free.nonzero()[0]
    has = paired[alloc_rows]
    alloc_free_t = np.where(has, t[np.minimum(alloc_rows + 1, n - 1)], 0)
    names = np.asarray(dev_names, dtype=object)
    n_alloc, n_free = len(alloc_rows), len(free_rows)
    out = Columns(n_alloc + n_free)
    if n_free == 0:          # the usual case: every free has its alloc in the events
        out.cols = {
            "device": np.full(n_alloc, names[0], dtype=object) if one_device else names[dev[alloc_rows]],
            "addr": addr[alloc_rows], "size": delta[alloc_rows],
            "alloc_t": Nullable(t[alloc_rows], np.zeros(n_alloc, bool)), "free_t": Nullable(alloc_free_t, ~has)}
        return out
    rows = np.concatenate([alloc_rows, free_rows])
    out.cols = {
        "device": np.full(len(rows), names[0], dtype=object) if one_device else names[dev[rows]],
        "addr": addr[rows],
        "size": np.concatenate([delta[alloc_rows], -delta[free_rows]]),
        "alloc_t": Nullable(np.concatenate([t[alloc_rows], np.zeros(n_free, np.int64)]),
                            np.concatenate([np.zeros(n_alloc, bool), np.ones(n_free, bool)])),
        "free_t": Nullable(np.concatenate([alloc_free_t, t[free_rows]]),
                           np.concatenate([~has, np.zeros(n_free, bool)]))}
    return out


def _first_seen(blocks: Columns, accesses: Columns, ops: Columns) -> np.ndarray:
    """When the dispatch mode knew each block existed: its op's end, or its first access (-1: never)."""
    seen = _minus_ones(len(blocks))
    op_col = blocks["alloc_op_id"]
    made = ~op_col.missing
    if len(ops) and np.count_nonzero(made):
        seen[made] = ops["end_ns"][op_col.values[made]]
    if len(accesses) and len(blocks):
        # each accessed block's earliest access (a sort, not a groupby), placed on its row by block id
        acc_block = np.asarray(accesses["block_id"], dtype=np.int64)
        acc_t = np.asarray(accesses["t_ns"], dtype=np.int64)
        order = np.lexsort((acc_t, acc_block))
        sorted_block = acc_block[order]
        head = np.empty(len(order), dtype=bool)
        head[0] = True
        np.not_equal(sorted_block[1:], sorted_block[:-1], out=head[1:])
        first_block, first_t = sorted_block[head], acc_t[order[head]]
        bid = np.asarray(blocks["block_id"], dtype=np.int64)
        if np.count_nonzero(bid[1:] <= bid[:-1]) == 0:      # ids ascending (as the recorder makes them): no sort needed
            at = np.minimum(np.searchsorted(bid, first_block), len(bid) - 1)
            ok = bid[at] == first_block
            rows = at[ok]
        else:
            by_id = np.argsort(bid, kind="stable")
            at = np.minimum(np.searchsorted(bid[by_id], first_block), len(bid) - 1)
            ok = bid[by_id[at]] == first_block
            rows = by_id[at[ok]]
        vals = first_t[ok]
        fill = seen[rows] < 0
        seen[rows[fill]] = vals[fill]
    return seen


def match_blocks(blocks: Columns, seen: np.ndarray, alloc_blocks: Columns, tolerance_ns: int) -> np.ndarray:
    """For each dispatch block, the row of `alloc_blocks` that is the same allocation (-1: none).

    First choice: the allocation at that address whose [alloc, free] contains the moment the block
    was seen. Otherwise (clock skew) the nearest allocation at that address within `tolerance_ns`
    of it. Sizes must agree (see the module docstring). Each allocation matches at most one block.

    Arrays only (no frames): an as-of join by (device, address) on one sorted int64 per row, with the
    tie rules of ``pd.merge_asof`` backward / nearest (the one before wins a tie of distances).
    """
    result = _minus_ones(len(blocks))
    if len(alloc_blocks) == 0 or len(blocks) == 0:
        return result
    seen = np.asarray(seen, dtype=np.int64)
    lrow = (seen >= 0).nonzero()[0]
    if len(lrow) == 0:
        return result
    lrow = lrow[np.argsort(seen[lrow], kind="stable")]          # blocks in the order they were seen
    lkey = seen[lrow]
    addr_col = blocks["addr"]
    laddr = np.where(addr_col.missing[lrow], -1, addr_col.values[lrow])
    lsize = blocks["size"][lrow]
    alloc_col, free_col = alloc_blocks["alloc_t"], alloc_blocks["free_t"]
    # a missing alloc time (freed before the recording) sorts first: -2**62, as the float -inf clamped there
    rkey = np.where(alloc_col.missing, _NO_ALLOC_KEY, np.maximum(alloc_col.values, _NO_ALLOC_KEY))
    rfree = np.where(free_col.missing, _INT64_MAX, free_col.values)     # never freed: after everything
    rsize = alloc_blocks["size"]
    raddr = np.asarray(alloc_blocks["addr"], dtype=np.int64)
    nl, nr = len(lrow), len(rkey)
    dev_code, cpu_device = _device_codes(np.concatenate([np.asarray(blocks["device"], dtype=object)[lrow],
                                                         np.asarray(alloc_blocks["device"], dtype=object)]))
    # one int64 per row: the dense label of its (device, address, key), and of its (device, address) group,
    # from one stable sort of both sides; the right side's rows in that order are the allocations sorted by
    # (group, key), equal keys in the allocator's row order. One sorted array then answers "last allocation
    # at or before" and "first at or after" within a group.
    key, addr = np.concatenate([lkey, rkey]), np.concatenate([laddr, raddr])
    one_device = not np.count_nonzero(dev_code)
    order = np.lexsort((key, addr) if one_device else (key, addr, dev_code))
    skey, saddr = key[order], addr[order]
    new_group = np.empty(nl + nr, dtype=bool)
    new_group[0] = True
    np.not_equal(saddr[1:], saddr[:-1], out=new_group[1:])
    if not one_device:
        sdev = dev_code[order]
        new_group[1:] |= sdev[1:] != sdev[:-1]
    new_key = new_group.copy()
    new_key[1:] |= skey[1:] != skey[:-1]
    group = np.empty(nl + nr, dtype=np.int64)
    group[order] = new_group.cumsum()
    combined = np.empty(nl + nr, dtype=np.int64)
    combined[order] = new_key.cumsum()
    right_in_order = order >= nl
    rorder = order[right_in_order] - nl
    rsorted = combined[nl:][rorder]
    lc, lgroup, rgroup = combined[:nl], group[:nl], group[nl:]
    back = np.searchsorted(rsorted, lc, side="right") - 1       # last at or before (of equal keys: the last)
    back_row = rorder[np.maximum(back, 0)]
    back_row[(back < 0) | (rgroup[back_row] != lgroup)] = -1
    fwd = np.searchsorted(rsorted, lc, side="left")             # first at or after (of equal keys: the first)
    fwd_row = rorder[np.minimum(fwd, nr - 1)]
    fwd_row[(fwd >= nr) | (rgroup[fwd_row] != lgroup)] = -1
    exact_size = cpu_device[:nl]
    b_found, f_found = back_row >= 0, fwd_row >= 0
    b_safe, f_safe = np.maximum(back_row, 0), np.maximum(fwd_row, 0)

    def usable(arow, found, safe):
        asize = rsize[safe]
        return found & np.where(exact_size, asize == lsize, asize >= lsize)

    ok = usable(back_row, b_found, b_safe) & (rfree[b_safe] >= lkey)
    # nearest within the tolerance: the one before unless the one after is strictly nearer
    bdiff = lkey - rkey[b_safe]
    fdiff = rkey[f_safe] - lkey
    b_in = b_found & (bdiff <= tolerance_ns)
    f_in = f_found & (fdiff <= tolerance_ns)
    take_fwd = f_in & ~(b_in & (bdiff <= fdiff))
    near = np.where(take_fwd, fwd_row, np.where(b_in, back_row, -1))
    near_found = near >= 0
    choice = np.where(ok, back_row, np.where(usable(near, near_found, np.maximum(near, 0)), near, -1))
    # containing matches first, then the nearest ones, each in the order blocks were seen; an allocation
    # goes to the first block that picked it
    picked = (choice >= 0).nonzero()[0]
    if not len(picked):
        return result
    picked = picked[np.argsort(~ok[picked], kind="stable")]
    _, first = first_occurrences(choice[picked])
    picked = picked[first]
    result[lrow[picked]] = choice[picked]
    return result


def _one_string(values: np.ndarray) -> str | None:
    """The one string all of `values` are (the usual one-device recording; a set costs ~7x less than
    `pd.factorize` there), else None: none, several, not a string, or unhashable (the general path reports)."""
    if not len(values) or type(values[0]) is not str:
        return None
    try:
        distinct = set(values.tolist())
    except TypeError:
        return None
    return values[0] if len(distinct) == 1 else None


def _factorize(values, use_na_sentinel: bool) -> tuple[np.ndarray, np.ndarray]:
    """`pd.factorize(values, use_na_sentinel=...)` (codes in order of first appearance, the distinct values),
    answered without pandas when every value is one string (`_one_string`)."""
    values = np.asarray(values, dtype=object)
    if (one := _one_string(values)) is not None:
        return np.zeros(len(values), dtype=np.int64), np.array([one], dtype=object)
    codes, uniques = pd.factorize(values, use_na_sentinel=use_na_sentinel)
    return codes.astype(np.int64, copy=False), np.asarray(uniques, dtype=object)


def _device_codes(devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a code per row, equal where the devices' names are; whether each row's device is a CPU one) of an
    object array of devices (names, or anything whose str() is one)."""
    devices = np.asarray(devices, dtype=object)
    if (one := _one_string(devices)) is not None:      # the usual recording: no factorize
        return np.zeros(len(devices), dtype=np.int64), np.full(len(devices), one.startswith("cpu"))
    codes, values = _factorize(devices, use_na_sentinel=False)
    names = np.asarray([str(v) for v in values], dtype=object)
    _, by_name = np.unique(names.astype(str), return_inverse=True) if len(names) else (None, np.empty(0, np.int64))
    cpu = np.asarray([n.startswith("cpu") for n in names], dtype=bool)
    return by_name.reshape(-1)[codes].astype(np.int64), cpu[codes]


def estimate_offset(blocks: Columns, ops: Columns, alloc_t: np.ndarray, rows: np.ndarray) -> int:
    """Residual clock offset (ns) to subtract from allocator times: the median distance by which the
    matched allocations fall outside their op's interval (0 when most already fall inside)."""
    op_col = blocks["alloc_op_id"]
    made = ~op_col.missing & (rows >= 0)
    if not np.count_nonzero(made):
        return 0
    op = op_col.values[made]
    t = alloc_t[rows[made]]
    lo = ops["start_ns"][op]
    hi = ops["end_ns"][op]
    if not len(t):
        return 0
    # np.median, without its call cost: the middle value, or the mean of the two middle ones as float64
    outside = np.sort(t - np.minimum(np.maximum(t, lo), hi))
    mid = len(outside) // 2
    return int(outside[mid] if len(outside) % 2 else (float(outside[mid - 1]) + float(outside[mid])) / 2.0)


def join_allocator(blocks: Columns, accesses: Columns, ops: Columns, allocator: AllocatorData, to_trace_ns: int,
                   notes: list, window_ns: int | None = None) -> tuple[Columns, dict]:
    """Join every allocator stream into `blocks`; returns the new blocks table and join statistics.
    The tables are `Columns` (DataFrames are taken too, converted once).

    `window_ns`: the recording's length; events outside [0, window_ns] (a CUDA history that was
    already running before the recording, kept in the snapshot's ring buffer) are left out.
    """
    blocks, accesses, ops = as_columns(blocks), as_columns(accesses), as_columns(ops)
    streams = []
    if allocator.events is not None and len(allocator.events):
        ev = as_columns(allocator.events)
        renamed = Columns(len(ev))
        renamed.cols = {"t_ns": ev["t_unix_ns"], "device": ev["device"], "addr": ev["addr"], "delta": ev["delta"]}
        ev = renamed
        if allocator.snapshot is not None:       # CUDA blocks come from the snapshot then
            ev = ev.take(~np.char.startswith(np.asarray(ev["device"], dtype=object).astype(str), "cuda"))
        streams.append(("profiler", ev))
    if allocator.snapshot is not None:
        from memlens.recording.cuda import snapshot_events     # only here: the import statement costs ~20 us a call
        streams.append(("cuda_snapshot", as_columns(snapshot_events(allocator.snapshot))))
    stats = {}
    for name, ev in streams:
        # the four columns pair_events reads, on the trace's clock
        t = np.asarray(ev["t_ns"], dtype=np.int64) + to_trace_ns
        cols = {"t_ns": t, "device": objects(ev["device"]), "addr": np.asarray(ev["addr"]),
                "delta": np.asarray(ev["delta"])}
        ev = Columns(len(t))
        ev.cols = cols
        if window_ns is not None:
            inside = (t >= -MATCH_TOLERANCE_NS) & (t <= window_ns + MATCH_TOLERANCE_NS)
            if np.count_nonzero(inside) != len(inside):
                notes.append(f"{name}: {int((~inside).sum())} allocator events outside the recording left out")
                ev = ev.take(inside)
        blocks, stats[name] = _join_stream(blocks, accesses, ops, pair_events(ev), name)
        if stats[name]["clock_offset_ns"]:
            notes.append(f"{name} clock offset corrected by {format_ns(stats[name]['clock_offset_ns'])}")
    return blocks, stats


def _join_stream(blocks: Columns, accesses: Columns, ops: Columns, alloc_blocks: Columns, name: str):
    # times stay int64 with their missing masks (the float NaN form costs a conversion per use; the values are
    # trace nanoseconds, far below 2**53, so both forms hold the same numbers)
    seen = _first_seen(blocks, accesses, ops)
    rows = match_blocks(blocks, seen, alloc_blocks, MATCH_TOLERANCE_NS)
    alloc_col, free_col = alloc_blocks["alloc_t"], alloc_blocks["free_t"]
    offset = estimate_offset(blocks, ops, np.where(alloc_col.missing, 0, alloc_col.values), rows)
    if abs(offset) > 1000:
        alloc_col = Nullable(np.where(alloc_col.missing, 0, alloc_col.values - offset), alloc_col.missing)
        free_col = Nullable(np.where(free_col.missing, 0, free_col.values - offset), free_col.missing)
        alloc_blocks = alloc_blocks.copy()
        alloc_blocks.cols["alloc_t"], alloc_blocks.cols["free_t"] = alloc_col, free_col
        rows = match_blocks(blocks, seen, alloc_blocks, MATCH_TOLERANCE_NS)
    matched = rows >= 0
    any_matched = np.count_nonzero(matched)
    starts = ops["start_ns"] if len(ops) else np.zeros(1, np.int64)
    ends = ops["end_ns"] if len(ops) else np.zeros(1, np.int64)
    # matched: the allocator's alloc time, kept inside the allocating op; before-recording flags fixed
    mrow = np.where(matched, rows, 0)
    if len(alloc_col.values):
        a_missing, a_val = alloc_col.missing[mrow], alloc_col.values[mrow]
        f_missing, f_val = free_col.missing[mrow], free_col.values[mrow]
    else:
        a_missing = f_missing = np.ones(len(rows), dtype=bool)
        a_val = f_val = np.zeros(len(rows), dtype=np.int64)
    seen_during = matched & ~a_missing
    op_col = blocks["alloc_op_id"]
    made = ~op_col.missing
    op = np.where(op_col.missing, 0, op_col.values)
    op_safe = np.minimum(np.maximum(op, 0), len(starts) - 1)          # starts and ends have one length
    lo = np.where(made, starts[op_safe], 0)
    hi = np.where(made, ends[op_safe], _INT64_MAX)
    new_alloc = np.minimum(np.maximum(np.where(a_missing, 0, a_val), lo), hi)
    free_ns = blocks["free_ns"]
    new_alloc = np.where(free_ns.missing, new_alloc, np.minimum(new_alloc, free_ns.values))
    # never after the first access (the clocks agree only to about a microsecond)
    new_alloc = np.where(seen >= 0, np.minimum(new_alloc, seen), new_alloc)
    before = blocks["allocated_before"]
    upd = seen_during & (made | before)
    blocks = blocks.copy()
    alloc_ns = blocks["alloc_ns"]
    blocks.cols["alloc_ns"] = Nullable(np.where(upd, new_alloc, alloc_ns.values).astype(np.int64, copy=False),
                                       alloc_ns.missing & ~upd)
    fixed_before = upd & before
    has_free = matched & ~f_missing
    fill_free = has_free & free_ns.missing
    # a CUDA block used on another stream (record_stream) stays taken until the allocator frees it
    later = has_free & ~free_ns.missing & (f_val > free_ns.values)
    if np.count_nonzero(later):
        fill_free |= later & ~_device_codes(np.asarray(blocks["device"], dtype=object))[1]
    if np.count_nonzero(fill_free):
        blocks.cols["free_ns"] = Nullable(np.where(fill_free, np.maximum(f_val, new_alloc),
                                                   free_ns.values).astype(np.int64, copy=False),
                                          free_ns.missing & ~fill_free)
    if any_matched:
        source = np.array(blocks["source"], dtype=object)
        source[matched] = "dispatch+" + name
        blocks.cols["source"] = source
    asize = alloc_blocks["size"]
    if "allocator_size" in blocks:
        size_values, size_missing = blocks["allocator_size"].values.copy(), blocks["allocator_size"].missing
    else:
        size_values, size_missing = np.zeros(len(blocks), dtype=np.int64), np.ones(len(blocks), dtype=bool)
    size_values[matched] = asize[rows[matched]]
    blocks.cols["allocator_size"] = Nullable(size_values.astype(np.int64, copy=False), size_missing & ~matched)
    if np.count_nonzero(fixed_before):
        blocks.cols["allocated_before"] = before & ~fixed_before
        rule = np.array(blocks["category_rule"], dtype=object)
        relabel = fixed_before & (blocks["category"] == "unknown")
        rule[relabel] = "first seen as an input; the allocator saw it made"
        blocks.cols["category_rule"] = rule
    extra = allocator_only(alloc_blocks, rows, ops, blocks, name)
    n_matched = int(np.count_nonzero(matched))
    stats = {"allocator_blocks": int(len(alloc_blocks)), "matched": n_matched,
             "allocator_only": int(len(extra)), "dispatch_only": int(len(rows) - n_matched),
             "clock_offset_ns": int(offset) if abs(offset) > 1000 else 0}
    return Columns.concat([blocks, extra]), stats
