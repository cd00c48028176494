"""The indicator table states no verdict its numbers cannot support: its figures do not depend on
the order or the names of the merges (a tie at the top is averaged, not broken by position; the
bootstrap resamples the pairs in sorted order), and no correlation is given from fewer than
stats.MIN_PAIRS merges (two points used to read "+1.00").

Run: .venv/bin/python -m pytest -q tests/analysis/test_indicator_ties.py
"""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from layerswap.analysis.indicators import indicator_table, indicators_section
from layerswap.analysis.load import load_run
from layerswap.analysis.report import _strict
from layerswap.analysis.sections import Table
from layerswap.analysis.stats import MIN_PAIRS

TASK = "world_mgsm_direct_xa"
FILES = ("experts/registry.parquet", "search/trials.parquet", "promotion/results.parquet")
COLUMN, INDICATOR = "objective", "merge: objective"  # the search's best predictor here


def _copy(run_dir, dest):
    """The synthetic run's result files (no checkpoints) in a folder of the test's own."""
    for rel in FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(run_dir / rel, dest / rel)
    return dest


def _as_written(data: dict) -> dict:
    """A section's data as summary.json holds it (NaN as null)."""
    return json.loads(json.dumps(_strict(data), allow_nan=False))


def _tables(sec) -> dict[str, pd.DataFrame]:
    return {b.caption: b.df for b in sec.blocks if isinstance(b, Table)}


def _saturated(run_dir, tmp_path):
    """A saturated indicator: the target's worst merge ties the indicator's best one (which is
    in the target's top 3)."""
    run = _copy(run_dir, tmp_path / "tied")
    df, _ = indicator_table(load_run(run), TASK)
    worst = df.loc[df["target"].idxmin(), "recipe_id"]
    trials = pd.read_parquet(run / FILES[1])
    trials.loc[trials["recipe_id"] == worst, COLUMN] = trials[COLUMN].max()
    trials.to_parquet(run / FILES[1])
    return run


def test_figures_do_not_depend_on_the_merges_order_or_names(run_dir, tmp_path):
    """Promotion's merges renamed so that they come in reverse order, its rows reversed: the same
    numbers, CIs included (the math expert's indicators tie for the merges built from one
    expert, and the objective ties at its top). A tie used to go to the first merge by name."""
    run = _saturated(run_dir, tmp_path)
    flipped = _copy(run, tmp_path / "flipped")
    prom = pd.read_parquet(flipped / FILES[2])
    names = sorted(prom["model"].unique())
    prom["model"] = prom["model"].map({m: f"{len(names) - i:03d}_{m}" for i, m in enumerate(names)})
    prom.iloc[::-1].reset_index(drop=True).to_parquet(flipped / FILES[2])
    a = indicators_section(load_run(run), n_resamples=50, seed=0)
    b = indicators_section(load_run(flipped), n_resamples=50, seed=0)
    assert _as_written(a.data) == _as_written(b.data)
    for (ca, ta), (cb, tb) in zip(_tables(a).items(), _tables(b).items(), strict=True):
        assert ca == cb
        pd.testing.assert_frame_equal(ta, tb)


def test_a_tie_at_the_top_reads_tied_with_its_mean_and_range(run_dir, tmp_path):
    run = _saturated(run_dir, tmp_path)
    sec = indicators_section(load_run(run), n_resamples=50, seed=0)
    table = next(t for c, t in _tables(sec).items() if TASK in c).set_index("indicator")
    row = next(r for r in sec.data[TASK] if r["indicator"] == INDICATOR)
    df, _ = indicator_table(load_run(run), TASK)
    top = df[df[INDICATOR] == df[INDICATOR].max()]
    regrets = df["target"].max() - top["target"]
    assert row["tied_at_top"] == len(top) == 2
    assert row["regret"] == pytest.approx(regrets.mean())  # not the tie-break's pick
    cell = table.loc[INDICATOR, "regret"]
    assert cell == f"{regrets.mean():.3f} (mean of 2 tied: {regrets.min():.3f}–{regrets.max():.3f})"
    # One tied pick is in the target's top 3, the other its worst: a hit for one tie-break in two.
    assert row["top1_in_target_top3"] == 0.5
    assert table.loc[INDICATOR, "top-1 in target top-3"] == "tied: 50% chance"


def test_fewer_merges_than_the_minimum_give_no_correlation(run_dir, tmp_path, monkeypatch):
    """Promotion kept MIN_PAIRS - 1 candidates: each correlation cell says so (null in
    summary.json), the top-k columns still say what picking by the indicator would have lost."""
    run = _copy(run_dir, tmp_path)
    prom = pd.read_parquet(run / FILES[2])
    keep = prom.loc[prom["kind"] == "candidate", "recipe_id"].drop_duplicates()[: MIN_PAIRS - 1]
    prom[(prom["kind"] != "candidate") | prom["recipe_id"].isin(keep)].to_parquet(run / FILES[2])
    import layerswap.analysis.indicators as indicators

    titles, scatter = [], indicators.scatter
    monkeypatch.setattr(indicators, "scatter", lambda *a, **kw: titles.append(kw["title"]) or scatter(*a, **kw))  # fmt: skip
    sec = indicators_section(load_run(run), n_resamples=50, seed=0)
    # Nor in the scatters' titles (they read "Spearman +nan").
    assert titles and all(t.endswith(f"too few merges for a correlation (n={MIN_PAIRS - 1})") for t in titles), titles  # fmt: skip
    assert f"Correlations need at least {MIN_PAIRS} merges" in sec.blocks[0]
    table = next(t for c, t in _tables(sec).items() if TASK in c).set_index("indicator")
    data = _as_written(sec.data)
    row = next(r for r in data[TASK] if r["indicator"] == INDICATOR)
    n = MIN_PAIRS - 1
    for m in ("spearman", "kendall", "pearson"):
        assert table.loc[INDICATOR, f"{m} [95% CI]"] == f"too few merges (n={n})"
        assert row[m] == {"estimate": None, "low": None, "high": None}
    assert isinstance(row["regret"], float) and row["n"] == n
