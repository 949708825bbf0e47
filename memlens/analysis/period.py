"""Period of a symbol sequence (the allocation pattern of a training loop), found by autocorrelation.

For every lag L, the match rate m(L) is the share of positions i with ``s[i] == s[i + L]``. All lags at
once: give each distinct symbol a random unit complex number; the autocorrelation of that signal (one FFT)
is, in expectation, the number of matches at each lag, because products of different random phases
average to zero. A few independent embeddings are averaged, and the best lags are then checked exactly.

Decisions are statistical, not tuned: two symbols drawn at random agree with probability
``chance = sum(freq**2)``, so a lag is repetition, not coincidence, when its exact match rate stands
``Z_MIN`` binomial standard errors above chance; among lags whose match rate is within the sampling error
of the best, the smallest is the period (a multiple of a period matches as well as the period itself).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Z_MIN = 5.0  # standard errors above chance: false detection probability ~3e-7 per lag
EMBEDDINGS = 3
CANDIDATES = 32


@dataclass(frozen=True)
class Period:
    """A detected period: ``period`` (symbols), ``match`` (exact match rate at that lag), ``chance``
    (match rate of two random symbols) and ``z_score`` (standard errors of match above chance)."""

    period: int
    match: float
    chance: float
    z_score: float


def approximate_match_rates(symbols: np.ndarray, embeddings: int = EMBEDDINGS, seed: int = 0) -> np.ndarray:
    """Estimated match rate m(L) for L = 0 .. n-1 (index L), by FFT autocorrelation of random phases."""
    n = len(symbols)
    k = int(symbols.max()) + 1 if n else 0
    nfft = 1 << int(np.ceil(np.log2(max(2 * n, 2))))
    rng = np.random.default_rng(seed)
    total = np.zeros(n)
    for _ in range(embeddings):
        phase = rng.uniform(0.0, 2 * np.pi, size=k)
        z = np.exp(1j * phase[symbols])
        spectrum = np.fft.fft(z, nfft)
        total += np.fft.ifft(spectrum * np.conj(spectrum))[:n].real
    overlap = n - np.arange(n)
    return total / embeddings / np.maximum(overlap, 1)


def exact_match_rate(symbols: np.ndarray, lag: int) -> float:
    """Share of positions i with symbols[i] == symbols[i + lag]."""
    return float(np.mean(symbols[:-lag] == symbols[lag:])) if 0 < lag < len(symbols) else 0.0


def detect_period(symbols, min_repeats: int = 2) -> Period | None:
    """The period of `symbols` (non-negative int codes), or None when nothing repeats beyond chance.

    A period must repeat at least `min_repeats` times. Cost: O(n log n) for the FFT plus O(n) per exactly
    checked candidate lag.
    """
    symbols = np.asarray(symbols, dtype=np.int64)
    n = len(symbols)
    max_lag = n // min_repeats
    if max_lag < 1:
        return None
    freq = np.bincount(symbols) / n
    chance = float((freq ** 2).sum())
    if chance >= 1.0:  # a single symbol: any lag matches, the sequence carries no pattern
        return None
    approx = approximate_match_rates(symbols)
    lags = np.arange(1, max_lag + 1)
    scores = approx[1:max_lag + 1]
    top = lags[np.argsort(-scores, kind="stable")[:CANDIDATES]]
    best_lag = int(top[0])
    # the divisors of the best lag may be the true period (their multiples match as well)
    divisors = np.array([best_lag // d for d in range(2, best_lag + 1) if best_lag % d == 0], dtype=np.int64)
    candidates = np.unique(np.concatenate([top, divisors]))
    exact = np.array([exact_match_rate(symbols, int(lag)) for lag in candidates])
    best = float(exact.max())
    overlap = n - candidates
    z = (exact - chance) / np.sqrt(chance * (1 - chance) / overlap)
    best_se = np.sqrt(max(best * (1 - best), 1.0 / overlap.min()) / overlap)
    good = (exact >= best - 2 * best_se) & (z >= Z_MIN)
    if not good.any():
        return None
    pick = int(np.flatnonzero(good)[0])  # candidates are sorted: the smallest qualifying lag
    return Period(period=int(candidates[pick]), match=float(exact[pick]), chance=chance,
                  z_score=float(z[pick]))


_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _window_hashes(symbols: np.ndarray, width: int, seed: int = 1) -> np.ndarray:
    """Polynomial hash (mod 2**64) of every window of `width` symbols, by prefix sums.

    h(i) = sum_j v[s[i+j]] * B**(i+j); dividing by B**i (B odd, so invertible mod 2**64) makes windows
    at different positions comparable. numpy's uint64 arithmetic wraps, which is the modulus.
    """
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 2**63, size=int(symbols.max()) + 1, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    base = int(rng.integers(1, 2**62)) * 2 + 1
    n = len(symbols)
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(n, base, dtype=np.uint64), dtype=np.uint64)
        powers = np.concatenate([[np.uint64(1)], powers[:-1]])
        inverse = pow(base, -1, 2**64)
        inv_powers = np.cumprod(np.full(n, inverse, dtype=np.uint64), dtype=np.uint64)
        inv_powers = np.concatenate([[np.uint64(1)], inv_powers[:-1]])
        prefix = np.concatenate([[np.uint64(0)], np.cumsum(values[symbols] * powers, dtype=np.uint64)])
        count = n - width + 1
        return (prefix[width:width + count] - prefix[:count]) * inv_powers[:count]


def occurrences(symbols, anchors, period: int, cost=None) -> np.ndarray:
    """Start positions of the iteration pattern, one per repetition, from the best of `anchors`.

    For each anchor the pattern is the shortest window starting there (doubling from 8 symbols up to
    `period`) that occurs at most once per period; occurrences closer than half a period to the previous
    one are dropped. The anchor whose pattern recurs most often wins; ties go to the lowest mean `cost` at
    the occurrences (e.g. live bytes, so that iterations start at the trough), then the first. Positions are
    indices into `symbols`, sorted. Each width's window hashes are computed once for all anchors.
    """
    symbols = np.asarray(symbols, dtype=np.int64)
    anchors = np.atleast_1d(np.asarray(anchors, dtype=np.int64))
    n = len(symbols)
    expected = n / period + 1
    width = min(8, period)
    pending = list(dict.fromkeys(int(a) for a in anchors if 0 <= a < n))
    best = np.array([], dtype=np.int64)
    best_cost = np.inf
    cost = np.zeros(n) if cost is None else np.asarray(cost, dtype=np.float64)
    while pending:
        hashes = _window_hashes(symbols, width)
        still = []
        for anchor in pending:
            if anchor >= len(hashes):
                continue
            found = np.flatnonzero(hashes == hashes[anchor])
            if len(found) > expected and width < period and anchor + 2 * width <= n:
                still.append(anchor)  # not yet specific to one place per period: widen
                continue
            keep = np.concatenate([[True], np.diff(found) >= max(period // 2, 1)])
            found = found[keep]
            found_cost = float(cost[found].mean()) if len(found) else np.inf
            if len(found) > len(best) or (len(found) == len(best) and found_cost < best_cost):
                best, best_cost = found, found_cost
        pending = still
        width = min(2 * width, period)
    return best
