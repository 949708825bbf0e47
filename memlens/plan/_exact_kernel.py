"""Compiled core of the exact static-planning search (numba; see `memlens.plan.exact` for the rules).

The depth-first search is iterative: its whole state (placements, minimum offsets, section floors and
totals, cut counts, an undo trail, a record stack and a scratch heap) lives in arrays owned by the
caller, so `run` can stop after a node budget and a later call resumes exactly where it stopped. The
caller checks the clock between calls and grows the trail or heap when `run` asks for more room.

Record stack: a SPLIT record solves the time partitions between its cut points one after the other (the
root is one); a NODE record is one search node of the partition owned by the SPLIT below it.
Buffer lists of partitions, in their static preorder, and cut points live on the heap.
"""
from __future__ import annotations

import numba
import numpy as np

INF = np.int64(2**62)

# record kinds and fields
NODE, SPLIT = 0, 1
N_FIELDS = 11
# NODE: 1 owner SPLIT, 2 canonical min offset, 3 canonical min rank, 4/5 cursor (offset, rank) of the
#       last candidate tried, 6 min height (dominance), 7 buffer placed, 8 trail mark, 9 hatless,
#       10 offset level last checked
# SPLIT: 1/2 source list on the heap, 3 first cut point, 4 cut points, 5 next part, 6/7 current
#        part's list, 8/9 its sections [a, b), 10 heap top before the split
# modes of the state machine
ENTER, NEXT, RETURN, ADVANCE = 0, 1, 2, 3
# outcomes of run()
FOUND, INFEASIBLE, ABORTED, PAUSED, NEED_TRAIL, NEED_HEAP = 0, 1, 2, 3, 4, 5
# trail entry kinds
T_MINOFF, T_FLOOR, T_PLACE, T_CUTS = 0, 1, 2, 3
# registers (regs array)
R_SP, R_MODE, R_OK, R_NODES, R_TRIES, R_TRAIL, R_HEAP, R_LIMIT = 0, 1, 2, 3, 4, 5, 6, 7
N_REGS = 8
KEY_T = -1  # preorder key computed from the current section totals


@numba.njit(cache=True)
def _undo(mark, tt, trail, off, min_off, floor, total, cuts, size, slo, shi):
    """Pop the trail down to `mark`, restoring what each entry changed; returns the new trail top."""
    while tt > mark:
        tt -= 1
        kind, idx, val = trail[tt, 0], trail[tt, 1], trail[tt, 2]
        if kind == T_MINOFF:
            min_off[idx] = val
        elif kind == T_FLOOR:
            floor[idx] = val
        elif kind == T_PLACE:
            off[idx] = -1
            z = size[idx]
            for s in range(slo[idx], shi[idx]):
                total[s] += z
        else:
            for s in range(slo[idx] + 1, shi[idx]):
                cuts[s] += 1
    return tt


@numba.njit(cache=True)
def _sections_fit(floor, total, sa, sb, level, capacity):
    """Section inference: True when every section in [sa, sb) can hold its unplaced bytes above
    max(its floor, `level`) within `capacity` (nothing placed from here on sits below `level`)."""
    for s in range(sa, sb):
        f = floor[s]
        if f < level:
            f = level
        if f + total[s] > capacity:
            return False
    return True


@numba.njit(cache=True)
def section_members(slo, shi, sec_ptr):
    """The buffers alive in each section, in buffer order: CSR indices for row pointers `sec_ptr`."""
    fill = sec_ptr[:-1].copy()
    members = np.empty(sec_ptr[-1], np.int32)
    for b in range(len(slo)):
        for s in range(slo[b], shi[b]):
            members[fill[s]] = b
            fill[s] += 1
    return members


@numba.njit(cache=True)
def preorder(bufs, heur, skeys, ties, total, slo, shi):
    """`bufs` sorted by the heuristic's keys, each descending, then by the `ties` columns ascending and the
    buffer index (MiniMalloc's order; the ties keep identical buffers next to each other).

    `heur` holds column indices of `skeys`, or KEY_T for the largest current section total in the span.
    """
    k = len(bufs)
    order = np.sort(bufs)
    key = np.empty(k, np.int64)
    for col in range(ties.shape[1] - 1, -1, -1):
        for j in range(k):
            key[j] = ties[order[j], col]
        order = order[np.argsort(key, kind="mergesort")]
    for h in range(len(heur) - 1, -1, -1):
        code = heur[h]
        for j in range(k):
            b = order[j]
            if code == KEY_T:
                t = 0
                for s in range(slo[b], shi[b]):
                    if total[s] > t:
                        t = total[s]
                key[j] = -t
            else:
                key[j] = -skeys[b, code]
        order = order[np.argsort(key, kind="mergesort")]
    return order


@numba.njit(cache=True)
def run(size, align, slo, shi, nb_ptr, nb_idx, sec_ptr, sec_mem, skeys, ties, twin, heur, capacity,
        refine_cap, off, min_off, floor, total, cuts, sol, trail, heap, rec, regs, slice_nodes, place_room,
        split_room, stamp, dirty):
    """Advance the search by up to `slice_nodes` nodes; returns one of FOUND ... NEED_HEAP."""
    sp, mode, ok = regs[R_SP], regs[R_MODE], regs[R_OK]
    nodes, tries, tt, ht, limit = regs[R_NODES], regs[R_TRIES], regs[R_TRAIL], regs[R_HEAP], regs[R_LIMIT]
    stop_at = nodes + slice_nodes
    code = PAUSED
    while True:
        if mode == ENTER:
            if nodes >= limit:
                code = ABORTED
                break
            if nodes >= stop_at:
                code = PAUSED
                break
            if tt + place_room > trail.shape[0]:
                code = NEED_TRAIL
                break
            if ht + split_room > heap.shape[0]:
                code = NEED_HEAP
                break
            nodes += 1
            i = sp - 1
            d = rec[i, 1]
            min_height = INF
            for j in range(rec[d, 6], rec[d, 7]):
                b = heap[j]
                if off[b] < 0:
                    h = min_off[b] + size[b]
                    if h < min_height:
                        min_height = h
            if min_height == INF:  # every buffer of the partition is placed
                ok = 1
                mode = RETURN
                continue
            rec[i, 4] = rec[i, 2]
            rec[i, 5] = rec[i, 3] - 1
            rec[i, 6] = min_height
            rec[i, 7] = -1
            rec[i, 10] = -1
            mode = NEXT
        elif mode == NEXT:
            i = sp - 1
            d = rec[i, 1]
            b0, b1, sa, sb = rec[d, 6], rec[d, 7], rec[d, 8], rec[d, 9]
            cur_off, cur_rank = rec[i, 4], rec[i, 5]
            # the next candidate in (min offset, preorder rank) order after the cursor; starting the cursor
            # at the canonical bound skips every non-canonical candidate
            best, best_off, best_rank = -1, INF, INF
            for j in range(b0, b1):
                b = heap[j]
                if off[b] >= 0:
                    continue
                if twin[b] >= 0 and off[twin[b]] < 0:
                    continue  # an identical buffer ranked just before it goes first
                o = min_off[b]
                rk = j - b0
                if o < cur_off or (o == cur_off and rk <= cur_rank):
                    continue
                if o < best_off or (o == best_off and rk < best_rank):
                    best, best_off, best_rank = b, o, rk
            if best < 0 or best_off >= rec[i, 6]:  # dominance: every later candidate leaves a gap
                ok = 0
                mode = RETURN
                continue
            if best_off != rec[i, 10]:
                # a new offset level: nothing placed from here on sits below it, so when the sections
                # cannot hold their unplaced bytes above it, no candidate at this level or above can work
                if not _sections_fit(floor, total, sa, sb, best_off, capacity):
                    ok = 0
                    mode = RETURN
                    continue
                rec[i, 10] = best_off
            rec[i, 4], rec[i, 5] = best_off, best_rank
            tries += 1
            b, o = best, best_off
            z = size[b]
            top = o + z
            mark = tt
            trail[tt, 0], trail[tt, 1], trail[tt, 2] = T_PLACE, b, o
            tt += 1
            off[b] = o
            sol[b] = o
            lo, hi = slo[b], shi[b]
            for s in range(lo, hi):
                total[s] -= z
            # b's sections lose b: their floor rises to b's top; they, and the sections whose lowest
            # buffer moves up, are queued for the floor refresh below while their members fit the work cap
            tries_stamp = tries
            ndirty = 0
            queued = 0
            for s in range(lo, hi):
                if floor[s] < top:
                    trail[tt, 0], trail[tt, 1], trail[tt, 2] = T_FLOOR, s, floor[s]
                    tt += 1
                    floor[s] = top
                if queued <= refine_cap:
                    stamp[s] = tries_stamp
                    dirty[ndirty] = s
                    ndirty += 1
                    queued += sec_ptr[s + 1] - sec_ptr[s]
            hatless = 1
            fits = True
            for q in range(nb_ptr[b], nb_ptr[b + 1]):
                c = nb_idx[q]
                if off[c] >= 0:
                    continue
                hatless = 0
                a = align[c]
                new = top if a == 1 else (top + a - 1) // a * a
                old = min_off[c]
                if old < new:
                    trail[tt, 0], trail[tt, 1], trail[tt, 2] = T_MINOFF, c, old
                    tt += 1
                    min_off[c] = new
                    if new + size[c] > capacity:  # c can no longer fit anywhere
                        fits = False
                    if queued > refine_cap:
                        continue
                    # only sections whose lowest unplaced buffer was c can see their floor rise
                    for s in range(slo[c], shi[c]):
                        if old <= floor[s] and stamp[s] != tries_stamp:
                            stamp[s] = tries_stamp
                            dirty[ndirty] = s
                            ndirty += 1
                            queued += sec_ptr[s + 1] - sec_ptr[s]
            # unallocated floor: no unplaced buffer of a section sits below its minimum offset (refreshed
            # within a work cap; a floor left stale is lower, so still a valid bound)
            work = 0
            for t in range(ndirty):
                s = dirty[t]
                work += sec_ptr[s + 1] - sec_ptr[s]
                if work > refine_cap:
                    break
                mn = INF
                for q in range(sec_ptr[s], sec_ptr[s + 1]):
                    c = sec_mem[q]
                    if off[c] < 0 and min_off[c] < mn:
                        mn = min_off[c]
                if mn != INF and mn > floor[s]:
                    trail[tt, 0], trail[tt, 1], trail[tt, 2] = T_FLOOR, s, floor[s]
                    tt += 1
                    floor[s] = mn
            # section inference: nothing placed from here on sits below o
            if fits:
                fits = _sections_fit(floor, total, sa, sb, o, capacity)
            if not fits:
                tt = _undo(mark, tt, trail, off, min_off, floor, total, cuts, size, slo, shi)
                if hatless == 1:  # b can never be placed under a later sibling
                    ok = 0
                    mode = RETURN
                continue
            rec[i, 7], rec[i, 8], rec[i, 9] = b, mark, hatless
            # temporal decomposition: boundaries inside b's span that no unplaced buffer crosses any more
            trail[tt, 0], trail[tt, 1], trail[tt, 2] = T_CUTS, b, 0
            tt += 1
            heap[ht] = sa
            ncp = 1
            for s in range(lo + 1, hi):
                cuts[s] -= 1
                if cuts[s] == 0:
                    heap[ht + ncp] = s
                    ncp += 1
            if ncp == 1:
                rec[sp, 0], rec[sp, 1], rec[sp, 2], rec[sp, 3] = NODE, d, o, best_rank
                sp += 1
                mode = ENTER
            else:
                heap[ht + ncp] = sb
                ncp += 1
                rec[sp, 0], rec[sp, 1], rec[sp, 2], rec[sp, 3] = SPLIT, b0, b1, ht
                rec[sp, 4], rec[sp, 5], rec[sp, 10] = ncp, 0, ht
                sp += 1
                ht += ncp
                mode = ADVANCE
        elif mode == ADVANCE:
            # the SPLIT on top starts its next non-empty part, or succeeds when none is left
            k = sp - 1
            cp0, ncp = rec[k, 3], rec[k, 4]
            ht = rec[k, 10] + ncp
            started = False
            while rec[k, 5] < ncp - 1:
                part = rec[k, 5]
                rec[k, 5] = part + 1
                a, c = heap[cp0 + part], heap[cp0 + part + 1]
                cnt = 0
                for j in range(rec[k, 1], rec[k, 2]):
                    b = heap[j]
                    if off[b] < 0 and slo[b] < c and shi[b] > a:
                        heap[ht + cnt] = b
                        cnt += 1
                if cnt == 0:
                    continue
                heap[ht:ht + cnt] = preorder(heap[ht:ht + cnt], heur, skeys, ties, total, slo, shi)
                rec[k, 6], rec[k, 7], rec[k, 8], rec[k, 9] = ht, ht + cnt, a, c
                ht += cnt
                rec[sp, 0], rec[sp, 1], rec[sp, 2], rec[sp, 3] = NODE, k, 0, 0
                sp += 1
                started = True
                break
            if started:
                mode = ENTER
            else:
                ok = 1
                mode = RETURN
        else:  # RETURN: the top record finished with `ok`; hand the result to the one below
            k = sp - 1
            if rec[k, 0] == SPLIT:
                ht = rec[k, 10]
            sp -= 1
            if sp == 0:
                code = FOUND if ok == 1 else INFEASIBLE
                break
            p = sp - 1
            if rec[p, 0] == NODE:
                if ok == 1:
                    continue  # a solution: propagate it (placements stay; the trail still covers them)
                tt = _undo(rec[p, 8], tt, trail, off, min_off, floor, total, cuts, size, slo, shi)
                if rec[p, 9] == 0:
                    mode = NEXT
            elif ok == 1:
                mode = ADVANCE  # this part is solved: on to the next one
    regs[R_SP], regs[R_MODE], regs[R_OK] = sp, mode, ok
    regs[R_NODES], regs[R_TRIES], regs[R_TRAIL], regs[R_HEAP] = nodes, tries, tt, ht
    return code
