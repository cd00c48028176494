"""Statistics for the report: correlations with seeded percentile-bootstrap CIs, top-k agreement,
and the Friedman test (exact permutation p where enumerable). Vectorised over bootstrap resamples; each matches scipy.stats (tested).
Every figure is a function of the pairs, not of their order (ties are averaged, not broken).

Run: .venv/bin/python -m pytest -q tests/analysis/test_stats.py
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

METHODS = ("spearman", "kendall", "pearson")
# Fewer pairs give no correlation at all (estimate, CI and p all NaN). Below 5, no ordering of the
# points is significant at the 5 % level: the exact two-sided permutation p of Spearman or Kendall
# is at least 2/n! (2/24 = 0.083 at n = 4, 2/120 = 0.017 at n = 5), while a percentile bootstrap
# of 4 points (at most 4 distinct pairs per resample) read "+0.89 [+0.82, +1.00]" in a demo report.
MIN_PAIRS = 5


def pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r along the last axis (NaN where either side is constant)."""
    x = x - x.mean(axis=-1, keepdims=True)
    y = y - y.mean(axis=-1, keepdims=True)
    den = np.sqrt((x * x).sum(axis=-1) * (y * y).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (x * y).sum(axis=-1) / den
    return np.where(den > 0, np.clip(r, -1.0, 1.0), np.nan)


def spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman rho along the last axis: Pearson r of average ranks (scipy's definition)."""
    return pearson(sps.rankdata(x, axis=-1), sps.rankdata(y, axis=-1))


def kendall(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall tau-b along the last axis (scipy.stats.kendalltau's default variant)."""
    dx = np.sign(x[..., :, None] - x[..., None, :])
    dy = np.sign(y[..., :, None] - y[..., None, :])
    # Each unordered pair appears twice in the full matrices; the factors of 2 cancel.
    s = (dx * dy).sum(axis=(-1, -2))
    nx = (dx != 0).sum(axis=(-1, -2))
    ny = (dy != 0).sum(axis=(-1, -2))
    den = np.sqrt(nx.astype(float) * ny)
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = s / den
    return np.where(den > 0, np.clip(tau, -1.0, 1.0), np.nan)


STATISTICS = {"spearman": spearman, "kendall": kendall, "pearson": pearson}


def bootstrap_indices(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """The resampled row indices, [n_resamples, n]: the same draws scipy.stats.bootstrap makes
    with `rng=np.random.default_rng(seed)` and `paired=True`."""
    return np.random.default_rng(seed).integers(0, n, (n_resamples, n))


@dataclass(frozen=True)
class Correlation:
    method: str
    n: int
    estimate: float
    low: float  # percentile-bootstrap CI; everything NaN when n < MIN_PAIRS
    high: float
    p_value: float  # scipy's test of no association (two-sided)


def correlate(
    x, y, *, n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> list[Correlation]:
    """Spearman, Kendall and Pearson of paired samples, with percentile bootstrap CIs.

    Pairs are resampled jointly, in sorted order (by x, then y), so that the CI is a function of
    the pairs and not of their order; resamples where a statistic is undefined (a constant side)
    are dropped from that statistic's bootstrap distribution. With fewer than MIN_PAIRS pairs every
    number is NaN: no estimate is given without its interval.

    Args:
        x, y: paired samples (NaN pairs are dropped).
        n_resamples: bootstrap resamples.
        confidence: CI level, e.g. 0.95 for the 2.5th and 97.5th percentiles.
        seed: seeds numpy's default_rng (the same draws for every statistic).
    Returns:
        One Correlation per method in METHODS (`n` counts the pairs kept).
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    order = np.lexsort((y, x))  # the bootstrap draws positions: the same pairs, the same CI
    x, y = x[order], y[order]
    n = len(x)
    out = []
    idx = bootstrap_indices(n, n_resamples, seed) if n >= MIN_PAIRS else None
    for m in METHODS:
        est = lo = hi = p = float("nan")
        if idx is not None:
            est = float(STATISTICS[m](x, y))
            lo, hi = percentile_ci(_batched(STATISTICS[m], x, y, idx), confidence)
            p = _p_value(m, x, y)
        out.append(Correlation(m, n, est, lo, hi, p))
    return out


def _batched(stat, x: np.ndarray, y: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`stat` over resamples in batches, so Kendall's n×n sign matrices stay small."""
    step = max(1, 4_000_000 // max(1, len(x) ** 2))
    return np.concatenate(
        [stat(x[idx[i : i + step]], y[idx[i : i + step]]) for i in range(0, len(idx), step)]
    )


def percentile_ci(dist: np.ndarray, confidence: float) -> tuple[float, float]:
    """The percentile interval of a bootstrap distribution (linear interpolation, as scipy)."""
    dist = dist[~np.isnan(dist)]
    if len(dist) == 0:
        return float("nan"), float("nan")
    a = (1 - confidence) / 2
    lo, hi = np.quantile(dist, [a, 1 - a])
    return float(lo), float(hi)


def _p_value(method: str, x: np.ndarray, y: np.ndarray) -> float:
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    f = {"spearman": sps.spearmanr, "kendall": sps.kendalltau, "pearson": sps.pearsonr}[method]
    return float(f(x, y).pvalue)


@dataclass(frozen=True)
class TopK:
    """Top-k agreement, each figure its expected value under a uniformly random tie-break."""

    k: int
    overlap: float  # |top-k by proxy ∩ top-k by target| / k
    hit: float  # chance that the proxy's top-1 is among the target's top-k (1.0: always)
    regret: float  # best target score - target score of the proxy's top-1 (mean over its ties)
    regret_low: float  # the least and the most regret among the merges tied at the proxy's top
    regret_high: float
    tied_top: int  # merges sharing the proxy's best score (1: no tie)
    overlap_tied: bool  # the overlap differs between tie-breaks (at the k-th place of either side)


def top_share(scores: np.ndarray, k: int) -> np.ndarray:
    """Each score's chance of being among the k best when ties are broken uniformly at random:
    1 above the k-th score, 0 below it, (places left) / (tied scores) within the tie at the cut.

    Args:
        scores: higher is better, no NaN.
        k: the cut-off.
    Returns:
        Probabilities, one per score; they sum to min(k, len(scores)).
    """
    s = np.asarray(scores, float)
    above = (s[None, :] > s[:, None]).sum(axis=1)
    same = (s[None, :] == s[:, None]).sum(axis=1)
    return np.clip((k - above) / same, 0.0, 1.0)


def _pair_share(scores: np.ndarray, k: int) -> np.ndarray:
    """[i, j]: the chance that scores i and j are both among the k best under a random tie-break.
    Independent except within the tie at the cut, whose r places are a uniform r-subset of its
    g scores (both in: r(r-1) / g(g-1)); the diagonal is top_share."""
    s = np.asarray(scores, float)
    share = top_share(s, k)
    pair = np.outer(share, share)
    cut = (share > 0) & (share < 1)  # at most one tie straddles the cut
    g = int(cut.sum())
    if g:
        r = share[cut][0] * g
        pair[np.ix_(cut, cut)] = r * (r - 1) / (g * (g - 1))
    np.fill_diagonal(pair, share)
    return pair


def topk_agreement(proxy, target, ks=(1, 3, 5)) -> list[TopK]:
    """Does ranking by the proxy recover the best merges? (higher is better on both sides)

    The pairs' order does not matter: where scores tie at a cut, each figure is its expectation
    over a uniformly random tie-break (regret: the mean over the merges tied at the proxy's top),
    computed exactly. A hit strictly between 0 and 1, or regret_low < regret_high, is a tie.

    Args:
        proxy, target: paired scores (NaN pairs dropped).
        ks: cut-offs; those >= the number of pairs are skipped (they would be trivially 1).
    Returns:
        One TopK per usable k.
    """
    p, t = np.asarray(proxy, float), np.asarray(target, float)
    keep = ~(np.isnan(p) | np.isnan(t))
    p, t = p[keep], t[keep]
    n = len(p)
    if n < 2:
        return []
    pick = top_share(p, 1)  # the proxy's top-1: uniform over the merges tied at its best score
    top = p == p.max()
    regrets = t.max() - t[top]
    out = []
    for k in ks:
        if k >= n:
            continue
        pk, tk = top_share(p, k), top_share(t, k)
        # The overlap's variance over independent tie-breaks of the two rankings: zero where the
        # ties at the cuts do not change it (e.g. all tied merges are in the other's top-k).
        var = float((_pair_share(p, k) * _pair_share(t, k)).sum()) - float(pk @ tk) ** 2
        out.append(
            TopK(
                k,
                # sums of fractions such as 3 × 1/3: rounded so that "always" reads exactly 1.0
                round(float(pk @ tk) / k, 12),
                round(float(pick @ tk), 12),
                float(t.max() - pick @ t),
                float(regrets.min()),
                float(regrets.max()),
                int(top.sum()),
                var > 1e-9,
            )
        )
    return out


# The exact Friedman p is enumerated while the within-block orderings, (k!)^n, are at most this
# many; beyond, the asymptotic χ² p (poor for the few conditions these runs have: 2 blocks × 3
# treatments with one ranking in both read 0.135 against an exact 0.167).
EXACT_MAX = 1_000_000


@dataclass(frozen=True)
class Friedman:
    statistic: float
    p_value: float  # exact when p_method is "exact permutation", else p_asymptotic
    p_method: str  # "exact permutation" or "asymptotic χ²"
    p_asymptotic: float  # the χ² approximation's p (scipy's), always
    k: int  # treatments
    n: int  # blocks (conditions)
    mean_ranks: dict[str, float]  # treatment -> mean rank (1 = lowest score)


def friedman(matrix: np.ndarray, treatments: list[str]) -> Friedman:
    """Friedman rank test across treatments (columns) over blocks (rows), with scipy's tie
    correction; the statistic and p_asymptotic equal scipy.stats.friedmanchisquare(*matrix.T).
    p_value is the exact permutation p (`friedman_exact_p`) while (k!)^n <= EXACT_MAX, else the
    asymptotic one; p_method says which.

    Args:
        matrix: [n blocks, k treatments], no NaN.
        treatments: column names.
    Returns:
        Friedman; statistic and p-value NaN when every block's scores are all tied.
    Raises:
        ValueError for k < 3 or n < 2 (the test is undefined).
    """
    m = np.asarray(matrix, float)
    n, k = m.shape
    if k < 3 or n < 2:
        raise ValueError(f"Friedman test needs >= 3 treatments and >= 2 conditions, got {k}, {n}")
    if np.isnan(m).any():
        raise ValueError("Friedman test: the matrix has missing values")
    ranks = sps.rankdata(m, axis=1)
    ties = 0.0
    for row in m:
        _, counts = np.unique(row, return_counts=True)
        ties += float((counts**3 - counts).sum())
    c = 1.0 - ties / (n * k * (k * k - 1))
    rsum = ranks.sum(axis=0)
    chi2 = p = float("nan")  # every block all tied (c == 0): no ranking, the test is undefined
    if c > 1e-12:
        chi2 = (12.0 / (n * k * (k + 1)) * float((rsum**2).sum()) - 3.0 * n * (k + 1)) / c
        p = float(sps.chi2.sf(chi2, k - 1))
    exact = math.factorial(k) ** n <= EXACT_MAX
    return Friedman(
        float(chi2),
        friedman_exact_p(ranks) if exact and c > 1e-12 else p,
        "exact permutation" if exact else "asymptotic χ²",
        p,
        k,
        n,
        {t: float(r) for t, r in zip(treatments, ranks.mean(axis=0), strict=True)},
    )


def friedman_exact_p(ranks: np.ndarray) -> float:
    """The exact permutation p of the Friedman statistic: the share of the (k!)^n within-block
    orderings of the observed ranks (ties kept as ranked) whose statistic is at least the
    observed one. The tie correction is the same for every ordering, so the statistic orders
    as the sum of squared rank sums; it is enumerated as a distribution of rank-sum vectors,
    block by block, in integers (ranks doubled: ties give halves).

    Args:
        ranks: [n blocks, k treatments], each row the block's average ranks.
    Returns:
        The p-value, in (0, 1].
    """
    r2 = np.rint(np.asarray(ranks, float) * 2).astype(np.int64)
    dist: Counter[tuple[int, ...]] = Counter({(0,) * r2.shape[1]: 1})
    for row in r2:
        orders = Counter(itertools.permutations(row.tolist()))  # k! orderings, with multiplicity
        nxt: Counter[tuple[int, ...]] = Counter()
        for sums, c in dist.items():
            for perm, m in orders.items():
                nxt[tuple(a + b for a, b in zip(sums, perm, strict=True))] += c * m
        dist = nxt
    observed = int((r2.sum(axis=0) ** 2).sum())
    hits = sum(c for sums, c in dist.items() if sum(v * v for v in sums) >= observed)
    return hits / sum(dist.values())
