"""Statistics for the report: correlations with seeded percentile-bootstrap CIs, top-k agreement,
and the Friedman test. Vectorised over bootstrap resamples; each matches scipy.stats (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

METHODS = ("spearman", "kendall", "pearson")


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
    low: float  # percentile-bootstrap CI; NaN when n < 3
    high: float
    p_value: float  # scipy's test of no association (two-sided)


def correlate(
    x, y, *, n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> list[Correlation]:
    """Spearman, Kendall and Pearson of paired samples, with percentile bootstrap CIs.

    Pairs are resampled jointly; resamples where a statistic is undefined (a constant side) are
    dropped from that statistic's bootstrap distribution.

    Args:
        x, y: paired samples (NaN pairs are dropped).
        n_resamples: bootstrap resamples.
        confidence: CI level, e.g. 0.95 for the 2.5th and 97.5th percentiles.
        seed: seeds numpy's default_rng (the same draws for every statistic).
    Returns:
        One Correlation per method in METHODS.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    n = len(x)
    out = []
    idx = bootstrap_indices(n, n_resamples, seed) if n >= 3 else None
    for m in METHODS:
        est = float(STATISTICS[m](x, y)) if n >= 2 else float("nan")
        lo = hi = p = float("nan")
        if idx is not None:
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
    k: int
    overlap: float  # |top-k by proxy ∩ top-k by target| / k
    hit: bool  # the proxy's top-1 is among the target's top-k
    regret: float  # best target score - target score of the proxy's top-1


def topk_agreement(proxy, target, ks=(1, 3, 5)) -> list[TopK]:
    """Does ranking by the proxy recover the best merges? (higher is better on both sides)

    Ties are broken by position (stable sort), so results are deterministic.

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
    by_p = np.argsort(-p, kind="stable")
    by_t = np.argsort(-t, kind="stable")
    out = []
    for k in ks:
        if k >= n:
            continue
        overlap = len(set(by_p[:k]) & set(by_t[:k])) / k
        out.append(TopK(k, overlap, bool(by_p[0] in set(by_t[:k])), float(t.max() - t[by_p[0]])))
    return out


@dataclass(frozen=True)
class Friedman:
    statistic: float
    p_value: float
    k: int  # treatments
    n: int  # blocks (conditions)
    mean_ranks: dict[str, float]  # treatment -> mean rank (1 = lowest score)


def friedman(matrix: np.ndarray, treatments: list[str]) -> Friedman:
    """Friedman rank test across treatments (columns) over blocks (rows), with scipy's tie
    correction; equals scipy.stats.friedmanchisquare(*matrix.T).

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
    return Friedman(
        float(chi2),
        p,
        k,
        n,
        {t: float(r) for t, r in zip(treatments, ranks.mean(axis=0), strict=True)},
    )
