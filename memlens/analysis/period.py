"""Period of a symbol sequence (the allocation pattern of a training loop), found by autocorrelation.

For every lag L, the match rate m(L) is the share of positions i with ``s[i] == s[i + L]``. All lags at
once: give each distinct symbol a random unit complex number; the autocorrelation of that signal (one FFT)
is, in expectation, the number of matches at each lag, because products of different random phases
average to zero. A few independent embeddings are averaged, and the best lags are then checked exactly.

Decisions are statistical, not tuned: two symbols drawn at random agree with probability
``chance = sum(freq**2)``, so a lag is repetition, not coincidence, when its exact match rate stands
``Z_MIN`` binomial standard errors above chance; among lags whose match rate is within the sampling error
of the best (two standard errors of the difference), the smallest is the period (a multiple of a period matches as well as the period itself).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Z_MIN = 5.0  # standard errors above chance: false detection probability ~3e-7 per lag
EMBEDDINGS = 3
MAX_ANCHORS = 3  # candidate iteration starts matched against the whole sequence
CANDIDATES = 32


def _fft():
    """scipy.fft, imported on first use: it costs ~0.5 s, which `memlens info` on a trace without a repeating
    pattern to search (or with optimizer steps) need not pay."""
    from scipy import fft
    return fft


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
    nfft = _fft().next_fast_len(max(2 * n, 2))
    rng = np.random.default_rng(seed)
    total = np.zeros(n)
    if n >= 20_000:  # noise per lag ~ 1/sqrt(2 * (n - lag)): one embedding is precise enough
        embeddings = 1
    for _ in range(embeddings):
        phase = rng.uniform(0.0, 2 * np.pi, size=k)
        z = np.exp(1j * phase[symbols])
        spectrum = _fft().fft(z, nfft, workers=-1)
        spectrum *= np.conj(spectrum)
        total += _fft().ifft(spectrum, workers=-1)[:n].real
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
    best_at = int(np.argmax(exact))
    best = float(exact[best_at])
    overlap = n - candidates
    z = (exact - chance) / np.sqrt(chance * (1 - chance) / overlap)
    # a lag matches "as well as the best" when the difference is within two standard errors of the
    # difference of two binomial rates (the best's own error counts: a long lag has few pairs and is noisy)
    var = max(best * (1 - best), 1.0 / overlap.min())
    diff_se = np.sqrt(var / overlap + var / overlap[best_at])
    good = (exact >= best - 2 * diff_se) & (z >= Z_MIN)
    if not good.any():
        return None
    pick = int(np.flatnonzero(good)[0])  # candidates are sorted: the smallest qualifying lag
    return Period(period=int(candidates[pick]), match=float(exact[pick]), chance=chance,
                  z_score=float(z[pick]))


EXACT_WORK = 20_000_000  # n * width below which template matches are counted exactly


class TemplateMatcher:
    """Match rates of templates (windows of the sequence itself) against every position.

    ``match(start, width)[i] = mean(symbols[i + j] == symbols[start + j])`` for j < width (positions past the
    end disagree). Exact by sliding windows when ``n * width`` is small; otherwise by FFT cross-correlation of
    random-phase embeddings (the expectation argument of `approximate_match_rates`), with the sequence's
    spectrum computed once for all templates. One embedding suffices for templates of 1,000+ symbols
    (noise ~ 1/sqrt(2 * width)); shorter ones average `EMBEDDINGS`.
    """

    def __init__(self, symbols: np.ndarray, seed: int = 2):
        self.symbols = np.asarray(symbols, dtype=np.int64)
        self.seed = seed
        self._spectra: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def _spectrum(self, embedding: int, nfft: int):
        key = (embedding, nfft)
        if key not in self._spectra:
            rng = np.random.default_rng(self.seed + embedding)
            phase = rng.uniform(0.0, 2 * np.pi, size=int(self.symbols.max()) + 1)
            self._spectra[key] = (phase, _fft().fft(np.exp(1j * phase[self.symbols]), nfft, workers=-1))
        return self._spectra[key]

    def match(self, start: int, width: int) -> np.ndarray:
        symbols = self.symbols
        n = len(symbols)
        template = symbols[start:start + width]
        width = len(template)
        if n * width <= EXACT_WORK:
            padded = np.concatenate([symbols, np.full(width - 1, -1, dtype=symbols.dtype)])
            windows = np.lib.stride_tricks.sliding_window_view(padded, width)
            return (windows == template).mean(axis=1)
        embeddings = 1 if width >= 1000 else EMBEDDINGS
        nfft = _fft().next_fast_len(n + width)
        total = np.zeros(n)
        for e in range(embeddings):
            phase, spectrum = self._spectrum(e, nfft)
            # corr[i] = sum_j z[i + j] * conj(t[j]): a convolution with the reversed conjugate template
            kernel = _fft().fft(np.exp(-1j * phase[template[::-1]]), nfft, workers=-1)
            kernel *= spectrum
            total += _fft().ifft(kernel, workers=-1).real[width - 1:width - 1 + n]
        return total / embeddings / width


def template_match(symbols: np.ndarray, start: int, width: int) -> np.ndarray:
    """`TemplateMatcher(symbols).match(start, width)` for a single template."""
    return TemplateMatcher(symbols).match(start, width)


def iteration_starts(symbols, anchors, period: int, cost=None, expected_match: float | None = None) -> np.ndarray:
    """Start positions of the repetitions of the period-long pattern beginning at one of `anchors`.

    Each anchor's pattern is matched at every position (`template_match`); a position starts a repetition
    where its match is the best within half a period on either side, stands `Z_MIN` standard errors above
    chance and, given the period's `expected_match` rate, is nearer to it than to chance (a nearest-mean
    decision between "a repetition" and "unrelated symbols"), so a step with an inserted or reordered
    allocation is still found while a different phase of the program (setup, evaluation) is not. The anchor whose
    starts add up to the most matched symbols wins (many repetitions, each close to the pattern); ties go to
    the lowest mean `cost` at the starts (e.g. live bytes, so that iterations begin at the trough), then
    the first. Positions are indices into `symbols`, sorted.
    """
    from scipy.ndimage import maximum_filter1d

    symbols = np.asarray(symbols, dtype=np.int64)
    n = len(symbols)
    cost = np.zeros(n) if cost is None else np.asarray(cost, dtype=np.float64)
    freq = np.bincount(symbols) / max(n, 1)
    chance = float((freq ** 2).sum())
    need = chance + Z_MIN * np.sqrt(chance * (1 - chance) / period)
    if expected_match is not None:
        need = max(need, (chance + expected_match) / 2)
    best, best_score, best_cost = np.array([], dtype=np.int64), 0.0, np.inf
    matcher = TemplateMatcher(symbols)
    candidates = [int(a) for a in dict.fromkeys(np.atleast_1d(anchors).tolist()) if 0 <= a <= n - period]
    # full matching costs an FFT per anchor: try first those whose pattern recurs one period later
    local = [exact_match_rate(symbols[a:a + 2 * period], period) for a in candidates]
    candidates = [candidates[i] for i in np.argsort(local, kind="stable")[::-1][:MAX_ANCHORS]]
    for anchor in candidates:
        match = matcher.match(anchor, period)
        local_best = maximum_filter1d(match, size=period, mode="constant", cval=-1.0)
        found = np.flatnonzero((match >= local_best) & (match > need))
        if len(found):  # plateaus: keep the first of starts closer than half a period
            found = found[np.concatenate([[True], np.diff(found) >= max(period // 2, 1)])]
        score = float(match[found].sum())
        found_cost = float(cost[found].mean()) if len(found) else np.inf
        if score > best_score or (score == best_score and found_cost < best_cost):
            best, best_score, best_cost = found, score, found_cost
    return best
