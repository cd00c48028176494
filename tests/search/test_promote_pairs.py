"""Promotion's merged baselines (soups, TIES, the paper's default swap) over the pool's expert
pairs: every (task, language) pair by default, as the ICLR paper reports them ("best config, 9
pairs", and the mean), each row naming its pair; the leaderboard gives each baseline's best pair
and mean; `analyze` counts the pairs under the baseline's own row. No model is loaded.

Run: .venv/bin/python -m pytest -q tests/search/test_promote_pairs.py
"""

from __future__ import annotations

import pandas as pd
import pytest
from pydantic import ValidationError

from layerswap.analysis.load import RunData
from layerswap.analysis.treatments import treatment_values
from layerswap.search import promote
from layerswap.search.leaderboard import leaderboard
from layerswap.search.promote import baselines
from layerswap.spaces.baselines import MERGED_BASELINES, one_pair
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool

TASKS, LANGS = ["m1", "m2"], ["l1", "l2", "l3"]
MERGED = ("soup_uniform", "soup_magnitude", "ties", "paper_default")


def _exp(tasks=TASKS, langs=LANGS, **promote) -> SearchExperiment:
    return SearchExperiment(
        language="xa", base="b", task_experts=tasks, language_experts=langs, promote=promote
    )


def _experts_of(recipe) -> tuple[str, str]:
    if hasattr(recipe, "models"):
        return tuple(recipe.models)
    return recipe.task_expert, recipe.language_expert


def test_every_merged_baseline_is_built_from_every_pair_and_named_by_it():
    exp = _exp()
    got = dict(baselines(exp, ExpertPool.from_paths(TASKS, LANGS, "b"), 32))
    for name in MERGED:
        pairs = {k: _experts_of(v) for k, v in got.items() if k.startswith(name + "_t")}
        assert pairs == {
            f"{name}_t{i + 1}_l{j + 1}": (t, lang)
            for i, t in enumerate(TASKS)
            for j, lang in enumerate(LANGS)
        }
        assert name not in got  # no unnamed pair beside them


def test_every_named_baseline_has_one_builder():
    assert tuple(promote.MERGED) == MERGED_BASELINES == MERGED  # one list of names, in order


def test_first_pair_only_when_asked_and_plain_names_for_one_pair():
    exp = _exp(baseline_pairs="first")
    got = dict(baselines(exp, ExpertPool.from_paths(TASKS, LANGS, "b"), 32))
    assert [k for k in got if k.startswith(MERGED)] == [f"{n}_t1_l1" for n in MERGED]
    assert _experts_of(got["ties_t1_l1"]) == ("m1", "l1")
    one = dict(baselines(_exp(["m1"], ["l1"]), ExpertPool.from_paths(["m1"], ["l1"], "b"), 32))
    assert [k for k in one if k.startswith(MERGED)] == list(MERGED)
    with pytest.raises(ValidationError, match="baseline_pairs"):
        _exp(baseline_pairs="some")


def test_promotion_and_the_analysis_name_one_pair_alike(tmp_path):
    """One rule (spaces.baselines.one_pair) says when names carry no pair: promotion's names
    and the analysis's map of them (treatment_modes.promoted_experts) agree, pool by pool."""
    from layerswap.analysis.treatment_modes import promoted_experts  # lazy: analysis side only

    assert [one_pair(t, lang) for t, lang in [(1, 1), (1, 2), (3, 1), (3, 3)]] == [True, False, False, False]  # fmt: skip
    for tasks, langs in [(["m1"], ["l1"]), (TASKS, LANGS)]:
        pool = ExpertPool.from_paths(tasks, langs, "b")
        named = {k for k, _ in baselines(_exp(tasks, langs), pool, 32) if k.startswith(MERGED)}
        (tmp_path / "search").mkdir(exist_ok=True)
        (tmp_path / "search/pool.json").write_text(pool.model_dump_json())
        assert named == {k for k in promoted_experts(RunData(root=tmp_path)) if k.startswith(MERGED)}  # fmt: skip


def test_leaderboard_gives_each_baseline_its_best_pair_and_mean():
    exp = _exp(baselines=["soup_uniform"])
    target = exp.target_task
    names = [f"soup_uniform_t{i}_l{j}" for i in (1, 2) for j in (1, 2, 3)]
    values = [0.10, 0.30, 0.20, 0.05, 0.15, 0.40]
    models = [(n, "baseline", "rid", None) for n in names]
    scores = {(n, target): v for n, v in zip(names, values, strict=True)}
    failed = {"soup_uniform_t2_l3": "boom"}  # its score is not counted
    board = leaderboard(exp, models, scores, None, {}, failed, {"t1": "m1", "l1": "l1"})
    row = next(x for x in board.splitlines() if x.startswith("| soup_uniform |"))
    assert row == "| soup_uniform | 5 of 6 | 0.1600 | soup_uniform_t1_l2 | 0.3000 |"
    assert "math_expert = t1: `m1`; language_expert = l1: `l1`" in board


def test_leaderboard_says_a_lora_pools_soups_are_not_rebuilt_by_merge():
    exp = _exp(baselines=["soup_uniform"])
    models = [("soup_uniform", "baseline", "rid", None)]
    assert "`layerswap merge` does not rebuild them" in leaderboard(exp, models, {}, None, {}, lora=True)  # fmt: skip
    assert "LoRA" not in leaderboard(exp, models, {}, None, {})  # a pool of full checkpoints


def test_analyze_counts_every_pair_under_its_baselines_row(tmp_path):
    target = "world_mgsm_direct_xa"
    rows = [
        dict(model=f"soup_uniform_t1_l{j}", kind="baseline", recipe_id=f"r{j}", task=target,
             split="test", value=v, n_items=250)
        for j, v in ((1, 0.2), (2, 0.4))
    ]  # fmt: skip
    vals = treatment_values(RunData(root=tmp_path, promotion=pd.DataFrame(rows)))
    soup = vals[vals["treatment"] == "model soup (uniform)"]
    assert sorted(soup["value"]) == [0.2, 0.4]
