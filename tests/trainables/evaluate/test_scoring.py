"""The one scoring rule: first metric, preferred filter; the same answer from raw results, Task
objects and the proxy evaluator's aggregates."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from layerswap.trainables.evaluate.scoring import (
    aggregate_score,
    leaf_tasks,
    pooled_score,
    score_key,
    scoring_key,
    task_key,
    task_score,
)

MGSM = {
    "metric_list": [{"metric": "exact_match"}],
    "filter_list": [{"name": "strict-match"}, {"name": "flexible-extract"}],
}
BELE = {"metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]}


def _task(name: str, cfg: dict):
    return SimpleNamespace(config=SimpleNamespace(task=name, metric_list=cfg.get("metric_list"), filter_list=cfg.get("filter_list")))  # fmt: skip


def test_rule():
    assert scoring_key(MGSM["metric_list"], MGSM["filter_list"], "m") == ("exact_match", "flexible-extract")  # fmt: skip
    assert scoring_key(BELE["metric_list"], None, "b") == ("acc", "none")
    assert scoring_key([{"metric": "f1"}], [{"name": "x"}, {"name": "y"}], "t") == ("f1", "x")
    with pytest.raises(ValueError, match="'t': no metric_list"):
        scoring_key([], None, "t")


def test_raw_and_task_objects_agree():
    raw = {
        "configs": {"mgsm": MGSM, "bele": BELE},
        "results": {
            "mgsm": {"exact_match,flexible-extract": 0.25, "exact_match,strict-match": 0.1},
            "bele": {"acc,none": 0.5, "acc_norm,none": 0.4},
            "grp": {"acc,none": 0.75},
        },
        "group_subtasks": {"grp": ["bele"]},
    }
    for name, cfg in (("mgsm", MGSM), ("bele", BELE)):
        assert score_key(raw, name) == task_key(_task(name, cfg))
    assert task_score(raw, "mgsm") == 0.25
    assert leaf_tasks(raw, "bele") == ["bele"] and leaf_tasks(raw, "grp") == ["bele"]
    # A tag leaves no trace in lm-eval's results: its members come from the task index.
    assert leaf_tasks(raw, "tg", {"tg": ["grp", "mgsm"]}) == ["bele", "mgsm"]
    with pytest.raises(ValueError, match="'tg' not in these lm-eval results"):
        leaf_tasks(raw, "tg")
    with pytest.raises(ValueError, match="not in these results"):
        task_score(raw, "grp")
    agg = {"exact_match,flexible-extract": 0.5, "exact_match,strict-match": 0.0}
    assert aggregate_score(_task("mgsm", MGSM), agg) == 0.5
    with pytest.raises(ValueError, match="no 'acc,none'"):
        aggregate_score(_task("bele", BELE), agg)


def test_pooled_score_is_the_item_weighted_mean():
    assert pooled_score([(0.1, 49)]) == 0.1  # one task: its own number, not 0.1 * 49 / 49
    assert pooled_score([(0.5, 10), (1.0, 30)]) == 0.875
