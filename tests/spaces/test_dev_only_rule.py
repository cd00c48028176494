"""The one dev-only rule (spaces/task_families.py `require_dev_task`): no world test split and no
search target may guide a search or an expert sweep, as a proxy, an expert indicator or a sweep's
indicator/metric; real lm-eval tasks (`mgsm_direct_en`) stay allowed.

Run: .venv/bin/python -m pytest -q tests/spaces/test_dev_only_rule.py
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from layerswap import spaces
from layerswap.spaces import task_families
from layerswap.spaces.search_experiment import SearchExperiment, load_search_experiment
from layerswap.spaces.sweep import SweepConfig
from layerswap.spaces.train_experiment import load_train_experiment

EXAMPLES = Path(spaces.__file__).parent / "examples"
WORLD_TEST = "world_mgsm_direct_xa"  # the embedded world's default target, its test split


def _search(**experts) -> dict:
    return {"language": "xa", "base": "/b", "experts": {"registry": "r.parquet", **experts}}


def test_the_rule():
    for held_out in (WORLD_TEST, "ind__" + WORLD_TEST, "world_belebele_xa"):
        assert task_families.held_out_reason(held_out) is not None
    for allowed in ("world_mgsm_direct_xa_dev", "ind__world_belebele_xa_dev", "mgsm_direct_en"):
        assert task_families.held_out_reason(allowed) is None
        assert task_families.held_out_reason(allowed, target="mgsm_direct_sw") is None
    # A real task has no split in its name: only the target itself is held out, in both spellings.
    assert task_families.held_out_reason("mgsm_direct_sw", target="mgsm_direct_sw") is not None
    assert task_families.held_out_reason("ind__mgsm_direct_sw", target="mgsm_direct_sw") is not None
    with pytest.raises(ValueError) as e:
        task_families.require_dev_task("ind__" + WORLD_TEST, "experts.task_indicator")
    msg = str(e.value)
    assert msg.startswith(f"experts.task_indicator 'ind__{WORLD_TEST}'") and "\n" not in msg
    assert "validation (dev)" in msg and f"'{WORLD_TEST}_dev'" in msg


@pytest.mark.parametrize(
    "sweep, field",
    [
        ({"indicators": [WORLD_TEST], "metric": WORLD_TEST}, "sweep.indicators[0]"),
        ({"indicators": ["world_mgsm_direct_en_dev", "world_belebele_xa"]}, "sweep.indicators[1]"),
        ({"metric": WORLD_TEST}, "sweep.metric"),
    ],
)
def test_a_sweep_refuses_a_test_split(sweep, field):
    with pytest.raises(
        ValidationError, match=rf"{re.escape(field)} '.*': a world test split.*validation"
    ):
        SweepConfig.model_validate(sweep)


def test_a_sweep_yaml_on_a_test_split_is_refused_naming_the_file(tmp_path):
    data = yaml.safe_load((EXAMPLES / "world_math_sweep.yaml").read_text())
    data["sweep"]["indicators"] = ["world_mgsm_direct_en"]
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=r"(?s)sweep.yaml: .*sweep.indicators\[0\] 'world_mgsm_direct_en'"):  # fmt: skip
        load_train_experiment(path)
    # Its dev twin and a real lm-eval task (the documented math default) stay allowed.
    for ok in ("world_mgsm_direct_en_dev", "mgsm_direct_en"):
        data["sweep"]["indicators"], data["sweep"]["metric"] = [ok], ok
        path.write_text(yaml.safe_dump(data))
        assert load_train_experiment(path).sweep.indicators == [ok]


@pytest.mark.parametrize(
    "experts, field",
    [
        ({"language_indicator": WORLD_TEST}, "experts.language_indicator"),
        ({"task_indicator": "ind__" + WORLD_TEST}, "experts.task_indicator"),
        ({"language_indicator": "world_belebele_xa"}, "experts.language_indicator"),
    ],
)
def test_a_search_refuses_a_test_split_indicator(experts, field):
    with pytest.raises(
        ValidationError, match=rf"{re.escape(field)} '.*': a world test split.*validation"
    ):
        SearchExperiment.model_validate(_search(**experts))


def test_a_search_refuses_its_target_as_indicator():
    """A real target (`mgsm_direct_sw`) has no split in its name; it is refused as itself."""
    data = yaml.safe_load((EXAMPLES / "real_llama31_8b_sw_search.yaml").read_text())
    for spelling in ("mgsm_direct_sw", "ind__mgsm_direct_sw"):
        data["experts"]["task_indicator"] = spelling
        with pytest.raises(ValidationError, match=rf"experts.task_indicator '{spelling}': the search's target"):  # fmt: skip
            SearchExperiment.model_validate(data)
    # A dev twin and the shipped real indicators (mgsm_direct_en, target Belebele) stay allowed.
    dev = {"task_indicator": "ind__world_mgsm_direct_en_dev", "language_indicator": "world_belebele_xa_dev"}  # fmt: skip
    assert SearchExperiment.model_validate(_search(**dev)).experts.task_indicator == dev["task_indicator"]  # fmt: skip
    for path in sorted(EXAMPLES.glob("real_*_search.yaml")):
        assert load_search_experiment(path).experts.task_indicator == "mgsm_direct_en"
