"""Report details a new user's red-team found misleading in `layerswap analyze`'s report: a
verdict on a constant indicator or target, a "layer swap" row that was the mean of the
candidates, a Friedman count without its unit, a recipes table without the transition weights,
heatmap cells that read alike at two decimals, and an axis label cut off at the figure's edge.

Run: .venv/bin/python -m pytest -q tests/analysis/test_report_details.py
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text

import layerswap.analysis.figures as figures
from layerswap.analysis.indicators import indicators_section
from layerswap.analysis.load import load_run, trial_by_recipe
from layerswap.analysis.report import _strict
from layerswap.analysis.search_plots import search_section
from layerswap.analysis.sections import Table
from layerswap.analysis.stats import friedman
from layerswap.analysis.treatments import treatment_tables, treatment_values, treatments_section

TASK = "world_mgsm_direct_xa"
FILES = ("experts/registry.parquet", "search/trials.parquet", "promotion/results.parquet")


def _copy(run_dir, tmp_path):
    """The synthetic run's result files (no checkpoints) in a folder of the test's own."""
    for rel in FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(run_dir / rel, tmp_path / rel)
    return tmp_path


def _rows(sec, task=TASK):
    table = next(b.df for b in sec.blocks if isinstance(b, Table) and task in b.caption)
    data = json.loads(json.dumps(_strict(sec.data), allow_nan=False))[task]
    return table.set_index("indicator"), {r["indicator"]: r for r in data}


def _undecided(cells: pd.Series, row: dict) -> None:
    """A row with no verdict: every statistic's cell says it cannot tell, summary.json null."""
    stats = cells.drop(["level", "n", "dev items"])
    assert all(str(v).startswith("cannot tell") for v in stats), stats.to_dict()
    for m in ("spearman", "kendall", "pearson"):
        assert row[m] == {"estimate": None, "low": None, "high": None}
    assert row["top3_overlap"] is row["top1_in_target_top3"] is row["regret"] is None


def test_a_constant_indicator_gets_no_verdict(run_dir):
    """The language expert's Belebele is the same for every promoted merge (all were built from
    one expert): no correlation, and no top-k 'yes'/'no' or regret from an arbitrary tie-break."""
    table, data = _rows(indicators_section(load_run(run_dir), n_resamples=50, seed=0))
    name = "language expert: belebele_xa_dev"
    _undecided(table.loc[name], data[name])
    assert "constant indicator" in table.loc[name, "spearman [95% CI]"]
    varied = "merge: objective"
    assert data[varied]["regret"] is not None and data[varied]["spearman"]["estimate"] > 0


def test_a_constant_target_gets_no_verdict(run_dir, tmp_path):
    run = _copy(run_dir, tmp_path)
    prom = pd.read_parquet(run / FILES[2])
    prom.loc[prom["task"] == TASK, "value"] = 0.25  # every merge scores the same
    prom.to_parquet(run / FILES[2])
    table, data = _rows(indicators_section(load_run(run), n_resamples=50, seed=0))
    for name in table.index:
        _undecided(table.loc[name], data[name])
    assert "constant target" in table.loc["merge: objective", "spearman [95% CI]"]


def test_layer_swap_is_the_chosen_candidate_and_the_mean_says_so(run_dir):
    """The paper's row is the swap the search chose (best search objective, as promotion picks
    it by default, the test split not choosing); the candidates' mean is a row of its own."""
    run = load_run(run_dir)
    vals = treatment_values(run)
    t1, t3 = treatment_tables(vals)
    prom = run.promotion[run.promotion["kind"] == "candidate"]
    objective = trial_by_recipe(run)["objective"]
    chosen = max(prom["recipe_id"].unique(), key=lambda r: objective[r])
    want = prom[prom["recipe_id"] == chosen].groupby("task")["value"].mean().mean()
    assert t1.loc["layer swap", "full"] == f"{want:.3f}"
    assert t3.loc["xa", "layer swap / full"] == f"{prom[(prom['recipe_id'] == chosen) & (prom['task'] == TASK)]['value'].iloc[0]:.3f}"  # fmt: skip
    n = prom["recipe_id"].nunique()
    mean_row = f"layer swap (mean of {n} promoted candidates)"
    assert t1.loc[mean_row, "full"] == f"{prom.groupby('task')['value'].mean().mean():.3f}"
    sec = treatments_section(run)
    assert any(f"candidate_{chosen}" in b for b in sec.blocks if isinstance(b, str))


def test_friedman_says_what_it_counts_and_summary_holds_it(run_dir):
    sec = treatments_section(load_run(run_dir))
    text = next(b for b in sec.blocks if isinstance(b, str) and b.startswith("Friedman"))
    # Test-split cells only: the registry's lora/mix/simultaneous/partial experts have dev
    # MGSM alone, and are named as left out.
    assert "over 2 conditions (base model × target language) × 3 treatments" in text, text
    assert "Left out as dev-split scores" in text and "data mixing / full (every condition)" in text
    f = json.loads(json.dumps(_strict(sec.data), allow_nan=False))["friedman"]
    assert f["conditions"] == 2 and f["treatments"] == 3 and f["df"] == 2
    assert isinstance(f["statistic"], float) and 0 <= f["p_value"] <= 1


def test_friedman_of_all_tied_scores_cannot_tell():
    f = friedman(np.full((3, 4), 0.5), ["a", "b", "c", "d"])
    assert np.isnan(f.statistic) and np.isnan(f.p_value)


def test_promoted_recipes_table_names_the_transition_weights(run_dir, tmp_path):
    run = _copy(run_dir, tmp_path)
    trials = pd.read_parquet(run / FILES[1])
    weighting = {0: "task=1,language=1", 1: "magnitude", 2: "task=0.7,language=0.3", 3: "magnitude"}
    trials["weights"] = [weighting[i % 4] for i in range(len(trials))]
    trials.to_parquet(run / FILES[1])
    sec = search_section(load_run(run))
    table = next(b.df for b in sec.blocks if isinstance(b, Table) and TASK in b.caption)
    assert "weights" in table.columns
    assert set(table["weights"]) == {"magnitude", "uniform", "explicit (task 0.7, language 0.3)"}


@pytest.fixture
def drawn(monkeypatch):
    """Every figure the helpers draw, before it is saved."""
    figs = []
    real = figures.to_png

    def keep(fig):
        fig.canvas.draw()
        figs.append(fig)
        return real(fig)

    monkeypatch.setattr(figures, "to_png", keep)
    monkeypatch.setattr(figures.plt, "close", lambda fig: None)  # keep it to inspect
    return figs


def test_heatmap_cells_that_differ_read_different(drawn):
    figures.heatmap(np.array([[0.744, 0.736], [0.5, np.nan]]), ["0", "1"], ["0", "1"], title="t",
                    annotate=True, counts=np.ones((2, 2)))  # fmt: skip
    cells = [t.get_text().split("\n")[0] for t in drawn[0].axes[0].texts]
    assert len(set(cells)) == 3, cells
    figures.heatmap(np.array([[0.7, 0.5]]), ["0", "1"], ["0"], title="t", annotate=True)
    assert [t.get_text() for t in drawn[1].axes[0].texts] == ["0.70", "0.50"]  # no clutter


def _outside(fig) -> list[str]:
    """The drawn texts (titles, axis labels, tick labels) that reach past the figure's edge."""
    r = fig.canvas.get_renderer()
    texts = []
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            texts += [t.label1 for t in axis._update_ticks()]
    out = []
    for t in texts:
        if isinstance(t, Text) and t.get_visible() and t.get_text().strip():
            bb = t.get_window_extent(r)
            if bb.x0 < -0.5 or bb.y0 < -0.5 or bb.x1 > fig.bbox.width + 0.5 or bb.y1 > fig.bbox.height + 0.5:  # fmt: skip
                out.append(t.get_text())
    return out


def test_long_labels_stay_inside_the_figure(drawn):
    """A Global-MMLU Brier indicator's name, negated, is the scatter's axis label and title."""
    ind = "language expert: global_mmlu_lite_brier_xa_dev (negated: lower is better)"
    x, y = np.array([0.1, 0.2, 0.3]), np.array([0.3, 0.2, 0.4])
    figures.scatter(x, y, title=f"{ind}\nSpearman +0.50", xlabel=ind, ylabel="target: mgsm_xa")
    figures.bars(["top", "bottom"], [0.7, 0.3], xlabel="importance",
                 title="fANOVA importance (a_long_experiment_name_for_the_world)")  # fmt: skip
    assert [_outside(f) for f in drawn] == [[], []]


def test_a_baseline_that_is_a_promoted_candidate_counts_once(run_dir, tmp_path):
    """The paper default is often also a top-k candidate (the search's first trial): promotion
    writes its rows under both names, and the correlations and the recipes table count it once."""
    from layerswap.analysis.indicators import indicator_table

    run = _copy(run_dir, tmp_path)
    before, _ = indicator_table(load_run(run), TASK)
    prom = pd.read_parquet(run / FILES[2])
    cand = prom[(prom["kind"] == "candidate") & (prom["task"] == TASK)].iloc[0]
    prom.loc[prom["model"] == "paper_default", "recipe_id"] = cand["recipe_id"]
    prom.loc[(prom["model"] == "paper_default") & (prom["task"] == TASK), "value"] = cand["value"]
    prom.to_parquet(run / FILES[2])
    after, _ = indicator_table(load_run(run), TASK)
    assert len(after) == len(before) and after["recipe_id"].is_unique
    sec = search_section(load_run(run))
    table = next(b.df for b in sec.blocks if isinstance(b, Table) and "Promoted recipes" in b.caption and TASK in b.caption)  # fmt: skip
    assert table["recipe_id"].is_unique and "paper_default" not in set(table["model"])
