"""layerswap.analysis.stats against scipy.stats on the same numbers: correlations, bootstrap CIs, Friedman."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as sps

from layerswap.analysis.stats import (
    MIN_PAIRS,
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
    """scipy.stats.bootstrap(paired, percentile) with default_rng(seed) draws the same indices
    (from the pairs in correlate's sorted order)."""
    x, y = _pairs(n=25)
    order = np.lexsort((y, x))
    x, y = x[order], y[order]
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
    nan_pairs = correlate([1.0, np.nan, 3.0, 4.0], [1.0, 5.0, np.nan, 2.0])
    assert nan_pairs[0].n == 2


@pytest.mark.parametrize("n", [2, 3, MIN_PAIRS - 1])
def test_no_correlation_from_too_few_pairs(n):
    """Below MIN_PAIRS no number at all: two points used to give a bare +1.00, three or four a
    CI from resamples of a handful of distinct pairs."""
    x = np.arange(float(n))
    for c in correlate(x, x, n_resamples=50):
        assert c.n == n and np.isnan([c.estimate, c.low, c.high, c.p_value]).all(), c
    enough = correlate(np.arange(float(MIN_PAIRS)), np.arange(float(MIN_PAIRS)), n_resamples=50)
    assert all(c.estimate == pytest.approx(1.0) and not np.isnan(c.p_value) for c in enough)


def test_bootstrap_is_seeded():
    x, y = _pairs()
    a = correlate(x, y, n_resamples=300, seed=5)
    b = correlate(x, y, n_resamples=300, seed=5)
    c = correlate(x, y, n_resamples=300, seed=6)
    assert a == b and a != c


def test_correlations_do_not_depend_on_the_pairs_order():
    """The bootstrap draws positions: unsorted, the same pairs in another order got another CI."""
    x, y = _pairs(n=15, ties=True)
    ref = correlate(x, y, n_resamples=300, seed=5)
    for perm in np.random.default_rng(0).permuted(np.tile(np.arange(15), (3, 1)), axis=1):
        assert correlate(x[perm], y[perm], n_resamples=300, seed=5) == ref


def test_topk_agreement():
    target = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    perfect = {t.k: t for t in topk_agreement([6, 5, 4, 3, 2, 1], target)}
    assert perfect[1].overlap == perfect[3].overlap == perfect[5].overlap == 1.0
    assert perfect[1].regret == 0.0
    reversed_ = {t.k: t for t in topk_agreement([1, 2, 3, 4, 5, 6], target)}
    assert reversed_[3].overlap == 0.0 and not reversed_[3].hit
    assert reversed_[1].regret == pytest.approx(0.5)
    assert [t.k for t in topk_agreement([1, 2, 3], [3, 2, 1])] == [1]  # k >= n skipped
    assert not any(t.overlap_tied or t.tied_top > 1 for t in perfect.values())


def test_topk_ties_are_averaged_whatever_the_row_order():
    """A red-team's saturated proxy: two merges tie at its top, one is the target's worst of the
    top four. Swapping their rows used to flip regret 0.3 -> 0.0 and the top-3 hit no -> yes."""
    proxy = np.array([0.90, 0.90, 0.80, 0.70, 0.60])
    target = np.array([0.10, 0.40, 0.30, 0.20, 0.05])
    ref = topk_agreement(proxy, target)
    for order in itertools.permutations(range(5)):
        assert topk_agreement(proxy[list(order)], target[list(order)]) == ref
    tk = {t.k: t for t in ref}
    assert tk[1].regret == pytest.approx(0.15)  # the mean of 0.3 and 0.0
    assert (tk[1].regret_low, tk[1].regret_high) == pytest.approx((0.0, 0.3))
    assert tk[1].tied_top == 2 and tk[3].hit == pytest.approx(0.5)
    # The proxy's top 3 is {0, 1, 2} however its tie breaks: the overlap does not depend on it.
    assert tk[3].overlap == pytest.approx(2 / 3) and not tk[3].overlap_tied


def test_topk_expectations_equal_every_tie_break_enumerated():
    """Exact expectations: against the mean over every tie-break of both rankings."""
    rng = np.random.default_rng(4)
    for _ in range(30):
        p, t = rng.integers(0, 3, 4).astype(float), rng.integers(0, 3, 4).astype(float)
        if np.ptp(p) == 0:
            continue
        for tk in topk_agreement(p, t, ks=(1, 2, 3)):
            ov, hit, regret = [], [], []
            for bp, bt in itertools.product(itertools.permutations(range(4)), repeat=2):
                by_p = sorted(range(4), key=lambda i: (-p[i], bp[i]))
                by_t = sorted(range(4), key=lambda i: (-t[i], bt[i]))
                ov.append(len(set(by_p[: tk.k]) & set(by_t[: tk.k])) / tk.k)
                hit.append(by_p[0] in by_t[: tk.k])
                regret.append(t.max() - t[by_p[0]])
            assert (tk.overlap, tk.hit, tk.regret) == pytest.approx((np.mean(ov), np.mean(hit), np.mean(regret)))  # fmt: skip
            assert tk.overlap_tied == (np.ptp(ov) > 0), (p, t, tk)


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


def _brute_force_p(m: np.ndarray) -> float:
    """Every within-block permutation of the matrix, its Friedman statistic against the observed."""
    obs = sps.friedmanchisquare(*m.T).statistic
    hits = total = 0
    for perms in itertools.product(itertools.permutations(range(m.shape[1])), repeat=len(m)):
        mm = np.array([row[list(p)] for row, p in zip(m, perms, strict=True)])
        hits += sps.friedmanchisquare(*mm.T).statistic >= obs - 1e-9
        total += 1
    return hits / total


@pytest.mark.parametrize(
    "m",
    [
        [[0.1, 0.2, 0.3], [0.15, 0.25, 0.35]],  # one ranking in both: exact 1/6, χ² 0.135
        [[0.1, 0.2, 0.3], [0.3, 0.2, 0.1], [0.2, 0.1, 0.3]],
        [[0.1, 0.1, 0.3], [0.2, 0.3, 0.3], [0.1, 0.2, 0.2]],  # ties
        [[0.1, 0.2, 0.3, 0.4], [0.2, 0.1, 0.4, 0.3]],
    ],
)
def test_friedman_p_is_exact_when_the_orderings_are_few(m):
    m = np.array(m)
    f = friedman(m, [f"t{i}" for i in range(m.shape[1])])
    assert f.p_method == "exact permutation"
    assert f.p_value == pytest.approx(_brute_force_p(m), abs=1e-12)
    assert f.p_asymptotic == pytest.approx(sps.friedmanchisquare(*m.T).pvalue)


def test_friedman_p_is_asymptotic_and_says_so_when_the_orderings_are_many():
    m = np.random.default_rng(1).standard_normal((5, 5))  # 120^5 orderings
    f = friedman(m, list("abcde"))
    assert f.p_method == "asymptotic χ²" and f.p_value == f.p_asymptotic


def test_friedman_refuses_undefined_cases():
    with pytest.raises(ValueError, match="3 treatments"):
        friedman(np.ones((4, 2)), ["a", "b"])
    with pytest.raises(ValueError, match="missing"):
        friedman(np.array([[1, 2, np.nan], [1, 2, 3]]), ["a", "b", "c"])
