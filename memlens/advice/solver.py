"""Which modules to checkpoint, and how: the cheapest recompute that frees enough memory.

A multiple-choice covering knapsack: each module takes one option (none, or one checkpoint mode with the
bytes it frees and the recompute ns it costs); choose options freeing at least `need` bytes with the least
total recompute time, ties broken by more bytes freed. Solved exactly by dynamic programming over the
Pareto frontier of (bytes freed, ns) after each module: a partial choice that frees no more bytes for no
less time than another can never complete into a better answer, so it is dropped. Identical repeated
blocks collapse the frontier to a few points per count, which keeps it small in practice; `max_states`
bounds it (then the frontier is thinned evenly, and the answer may be near-optimal rather than optimal).
"""
from __future__ import annotations

from typing import Sequence


def choose(options: Sequence[Sequence[tuple[str, int, int]]], need: int, max_states: int = 20000):
    """Pick one option (or none) per item: `options[i]` lists item i's ``(mode, bytes_freed, cost_ns)``.

    Returns ``(choice, freed, cost)``: `choice` a list with the chosen mode or None per item, minimizing
    `cost` subject to ``freed >= need``; when no choice frees `need`, the one freeing the most bytes (least
    cost among those). `need` <= 0 chooses nothing."""
    # state: (freed, cost, picks) where picks is a tuple of (item, mode)
    states = [(0, 0, ())]
    for i, opts in enumerate(options):
        grown = list(states)
        for freed, cost, picks in states:
            for mode, b, ns in opts:
                if b > 0:
                    grown.append((freed + int(b), cost + int(ns), picks + ((i, mode),)))
        states = _frontier(grown, need, max_states)
    enough = [s for s in states if s[0] >= max(need, 0)]
    if enough:
        best = min(enough, key=lambda s: (s[1], -s[0], len(s[2])))
    else:
        best = max(states, key=lambda s: (s[0], -s[1]))
    choice: list = [None] * len(options)
    for i, mode in best[2]:
        choice[i] = mode
    return choice, best[0], best[1]


def _frontier(states, need: int, max_states: int):
    """The non-dominated states: sorted by cost, keep one only when it frees more than every cheaper one.
    Bytes past `need` count as `need` (any state that covers the need is as good as another by bytes),
    except that among covering states the cheapest is kept."""
    states.sort(key=lambda s: (s[1], -s[0]))
    out, best = [], -1
    for s in states:
        freed = min(s[0], need) if need > 0 else s[0]
        if freed > best:
            out.append(s)
            best = freed
    if len(out) > max_states:
        step = len(out) / max_states
        out = [out[int(k * step)] for k in range(max_states)] + [out[-1]]
    return out
