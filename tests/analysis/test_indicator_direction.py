"""A lower-is-better indicator (a Brier score) is negated before it is ranked, at the expert level
as at the merge level, so that its correlations, top-k and regret read as for the others; and each
indicator's caption names the items its own proxy was scored on.

Run: .venv/bin/python -m pytest -q tests/analysis/test_indicator_direction.py
"""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from layerswap.analysis.indicators import indicators_section
from layerswap.analysis.load import load_run
from layerswap.analysis.sections import Figure, Table

TASK = "world_mgsm_direct_xa"
FILES = ("experts/registry.parquet", "search/trials.parquet", "promotion/results.parquet")


def _copy(run_dir, dest):
    for rel in FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(run_dir / rel, dest / rel)
    return dest


def _rows(run) -> dict[str, dict]:
    sec = indicators_section(load_run(run), n_resamples=50, seed=0)
    return {r["indicator"]: r for r in sec.data[TASK]}


def test_an_expert_level_brier_is_negated_like_a_merge_level_one(run_dir, tmp_path):
    """A registry Brier column that is 1 - the math experts' MGSM dev accuracy: the same ranking
    of the experts, pointing down. No experiment.json: the rule is the task's metric (brier_score). Its row is
    the accuracy's (Spearman, regret, top-k), labelled negated; it used to read inverted."""
    run = _copy(run_dir, tmp_path)
    reg = pd.read_parquet(run / FILES[0])
    reg["ind__world_belebele_brier_xa_dev"] = 1.0 - reg["ind__world_mgsm_direct_xa_dev"]
    reg.to_parquet(run / FILES[0])
    rows = _rows(run)
    acc = rows["math expert: mgsm_direct_xa_dev"]
    brier = rows["math expert: belebele_brier_xa_dev (negated: lower is better)"]
    assert abs(acc["spearman"]["estimate"]) > 0.1  # so that a flipped sign shows
    for key in ("spearman", "kendall", "pearson"):
        assert brier[key]["estimate"] == pytest.approx(acc[key]["estimate"])
    for key in ("regret", "top3_overlap", "top1_in_target_top3", "n"):
        assert brier[key] == pytest.approx(acc[key])
    assert "math expert: belebele_brier_xa_dev" not in rows


def test_each_indicator_names_the_dev_items_it_rests_on(run_dir, tmp_path):
    """Promotion scored the candidates on Belebele dev (100 items) and English MGSM dev (50):
    each row and scatter says its own count (the caption used to give whichever proxy was read
    last for all); an expert's comes from the registry's n_items__ column, else 'unknown'."""
    run = _copy(run_dir, tmp_path)
    prom = pd.read_parquet(run / FILES[2])
    cands = prom[(prom["kind"] == "candidate") & (prom["task"] == TASK)]
    values = [0.5 + 0.01 * i for i in range(len(cands))]
    dev = [
        cands.assign(task=t, split="dev", n_items=n, value=values)
        for t, n in (("world_belebele_xa_dev", 100), ("world_mgsm_direct_en_dev", 50))
    ]
    pd.concat([prom, *dev], ignore_index=True).to_parquet(run / FILES[2])
    sec = indicators_section(load_run(run), n_resamples=50, seed=0)
    table = next(b.df for b in sec.blocks if isinstance(b, Table)).set_index("indicator")
    assert table.loc["merge: belebele_xa_dev", "dev items"] == "100"
    assert table.loc["merge: mgsm_direct_en_dev", "dev items"] == "50"
    assert table.loc["language expert: belebele_xa_dev", "dev items"] == "50"
    assert table.loc["language expert: mgsm_direct_en_dev", "dev items"] == "unknown"
    rows = {r["indicator"]: r for r in sec.data[TASK]}
    assert rows["merge: belebele_xa_dev"]["dev_items"] == [100, 100]
    captions = {b.caption.split(" vs ")[0]: b.caption for b in sec.blocks if isinstance(b, Figure)}
    assert "the indicator on 100 dev items" in captions["merge: belebele_xa_dev"]
    assert "the indicator on 50 dev items" in captions["merge: mgsm_direct_en_dev"]
