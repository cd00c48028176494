"""The search driver's dev-only data check (search/trial.py `check_proxy_scales`): a proxy that
scores the target's test split under another task name stops the search before it writes
anything, however its name reads. Run: .venv/bin/python -m pytest -q tests/search/test_proxy_data_rule.py
"""

from __future__ import annotations

import pytest
import yaml

from layerswap.search.trial import check_proxy_scales
from layerswap.spaces.search_experiment import SearchExperiment

# lm-eval's MGSM shape: one Hub dataset, a subset per language, prompts differing per task.
MGSM = {"dataset_path": "hub/mgsm", "output_type": "generate_until", "doc_to_target": "x"}
SPLITS = {"training_split": "train", "test_split": "test"}
METRIC = [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}]


def _experiment(tmp_path, proxy: str) -> SearchExperiment:
    tasks = tmp_path / "tasks"
    tasks.mkdir(exist_ok=True)
    for name, lang in (("direct_sw", "sw"), ("native_cot_sw", "sw"), ("direct_en", "en")):
        cfg = {"task": name, **MGSM, "dataset_name": lang, **SPLITS, "metric_list": METRIC}
        (tasks / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return SearchExperiment(
        name="t",
        language="sw",
        base=str(tmp_path / "base"),
        task_experts=[str(tmp_path / "a")],
        language_experts=[str(tmp_path / "b")],
        include_path=[str(tasks)],
        proxies=[{"task": proxy}],
        target="direct_sw",
    )


def test_a_proxy_scoring_the_targets_test_split_is_refused_by_its_data(tmp_path):
    with pytest.raises(ValueError) as err:
        check_proxy_scales(_experiment(tmp_path, "native_cot_sw"))
    msg = str(err.value)
    assert "\n" not in msg
    for part in ("proxies[0].task 'native_cot_sw'", "target 'direct_sw'", "hub/mgsm", "sw", "split test"):  # fmt: skip
        assert part in msg, msg
    check_proxy_scales(_experiment(tmp_path, "direct_en"))  # English MGSM: another subset
