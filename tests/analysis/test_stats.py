"""layerswap.analysis.stats against scipy.stats on the same numbers: correlations, bootstrap CIs, Friedman."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from layerswap.analysis.stats import (
    bootstrap_indices,
    correlate,
    friedman,
    kendall,
    pearson,
    spearman,
    topk_agreement,
)


def _pairs(n=20, seed=3, ties=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    y = 0.6 * x + 0.8 * rng.standard_normal(n)
    if ties:  # accuracy-like scores: few distinct values
        x, y = np.round(x, 0), np.round(y * 2, 0) / 2
    return x, y


@pytest.mark.parametrize("ties", [False, True])
def test_point_estimates_match_scipy(ties):
    x, y = _pairs(ties=ties)
    assert spearman(x, y) == pytest.approx(sps.spearmanr(x, y).statistic, abs=1e-12)
    assert kendall(x, y) == pytest.approx(sps.kendalltau(x, y).statistic, abs=1e-12)
    assert pearson(x, y) == pytest.approx(sps.pearsonr(x, y).statistic, abs=1e-12)
    by = {c.method: c for c in correlate(x, y, n_resamples=50)}
    assert by["spearman"].p_value == pytest.approx(sps.spearmanr(x, y).pvalue)
    assert by["kendall"].p_value == pytest.approx(sps.kendalltau(x, y).pvalue)
    assert by["pearson"].p_value == pytest.approx(sps.pearsonr(x, y).pvalue)


def test_vectorised_over_resamples_matches_scipy_per_resample():
    x, y = _pairs(n=12, ties=True)
    idx = bootstrap_indices(len(x), 30, seed=1)
    rho, tau = spearman(x[idx], y[idx]), kendall(x[idx], y[idx])
    for i, row in enumerate(idx):
        if np.ptp(x[row]) == 0 or np.ptp(y[row]) == 0:
            assert np.isnan(rho[i]) and np.isnan(tau[i])
            continue
        assert rho[i] == pytest.approx(sps.spearmanr(x[row], y[row]).statistic, abs=1e-12)
        assert tau[i] == pytest.approx(sps.kendalltau(x[row], y[row]).statistic, abs=1e-12)


@pytest.mark.parametrize("method", ["spearman", "kendall", "pearson"])
def test_bootstrap_ci_equals_scipy_bootstrap_with_the_same_draws(method):
    """scipy.stats.bootstrap(paired, percentile) with default_rng(seed) draws the same indices."""
    x, y = _pairs(n=25)
    ours = {c.method: c for c in correlate(x, y, n_resamples=999, confidence=0.9, seed=7)}[method]
    fn = {"spearman": spearman, "kendall": kendall, "pearson": pearson}[method]
    ref = sps.bootstrap(
        (x, y),
        lambda a, b, axis=-1: fn(a, b),
        paired=True,
        vectorized=True,
        n_resamples=999,
        confidence_level=0.9,
        method="percentile",
        rng=np.random.default_rng(7),
    )
    assert ours.low == pytest.approx(ref.confidence_interval.low, abs=1e-12)
    assert ours.high == pytest.approx(ref.confidence_interval.high, abs=1e-12)


def test_ci_known_answer_and_small_samples():
    x = np.arange(10.0)
    perfect = {c.method: c for c in correlate(x, 2 * x + 1, n_resamples=200)}
    for c in perfect.values():  # every resample (ties included) is perfectly monotone
        assert (c.estimate, c.low, c.high) == pytest.approx((1.0, 1.0, 1.0))
    tiny = correlate([1.0, 2.0], [2.0, 1.0])
    assert all(np.isnan(c.low) for c in tiny) and tiny[0].estimate == pytest.approx(-1.0)
    nan_pairs = correlate([1.0, np.nan, 3.0, 4.0], [1.0, 5.0, np.nan, 2.0])
    assert nan_pairs[0].n == 2


def test_bootstrap_is_seeded():
    x, y = _pairs()
    a = correlate(x, y, n_resamples=300, seed=5)
    b = correlate(x, y, n_resamples=300, seed=5)
    c = correlate(x, y, n_resamples=300, seed=6)
    assert a == b and a != c


def test_topk_agreement():
    target = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    perfect = {t.k: t for t in topk_agreement([6, 5, 4, 3, 2, 1], target)}
    assert perfect[1].overlap == perfect[3].overlap == perfect[5].overlap == 1.0
    assert perfect[1].regret == 0.0
    reversed_ = {t.k: t for t in topk_agreement([1, 2, 3, 4, 5, 6], target)}
    assert reversed_[3].overlap == 0.0 and not reversed_[3].hit
    assert reversed_[1].regret == pytest.approx(0.5)
    assert [t.k for t in topk_agreement([1, 2, 3], [3, 2, 1])] == [1]  # k >= n skipped


@pytest.mark.parametrize("ties", [False, True])
def test_friedman_matches_scipy(ties):
    rng = np.random.default_rng(0)
    m = rng.standard_normal((6, 4)) + np.array([0.0, 0.3, 0.6, 0.9])
    if ties:
        m = np.round(m)
    f = friedman(m, ["a", "b", "c", "d"])
    ref = sps.friedmanchisquare(*m.T)
    assert f.statistic == pytest.approx(ref.statistic, rel=1e-12)
    assert f.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert (f.k, f.n) == (4, 6)
    assert f.mean_ranks["d"] == pytest.approx(sps.rankdata(m, axis=1)[:, 3].mean())


def test_friedman_refuses_undefined_cases():
    with pytest.raises(ValueError, match="3 treatments"):
        friedman(np.ones((4, 2)), ["a", "b"])
    with pytest.raises(ValueError, match="missing"):
        friedman(np.array([[1, 2, np.nan], [1, 2, 3]]), ["a", "b", "c"])
