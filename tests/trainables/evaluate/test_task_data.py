"""The dev-only data rule (trainables/evaluate/task_data.py): a proxy that reads the target's test
data under another task name is refused, read from configs alone (the data files do not exist).
Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_task_data.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from layerswap.trainables.evaluate.lm_eval_api import task_index
from layerswap.trainables.evaluate.task_data import leaf_configs, require_own_data
from layerswap.trainables.evaluate.tasks import write_world_tasks

MGSM = {"dataset_path": "hub/mgsm", "training_split": "train", "test_split": "test"}
# name -> config: MGSM-like tasks of one Hub dataset, the target direct_sw among them.
TASKS = {
    "direct_sw": {**MGSM, "dataset_name": "sw"},
    "cot_sw": {**MGSM, "dataset_name": "sw", "doc_to_text": "{{question}} Step by step:"},
    "direct_en": {**MGSM, "dataset_name": "en"},  # English MGSM: allowed, the papers' indicator
    # scores another split, but draws its few-shot examples from the target's test split
    "shots_from_test": {
        **MGSM,
        "dataset_name": "sw",
        "test_split": "train",
        "fewshot_split": "test",
    },
    # no test split: lm-eval scores the validation split
    "val_only": {"dataset_path": "hub/mgsm", "dataset_name": "sw", "validation_split": "test"},
}
GROUP = {"group": "mgsm_all", "task": ["direct_en", {"task": "cot_sw", "num_fewshot": 0}]}


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("task_data")
    for name, cfg in TASKS.items():
        cfg = {"task": name, "output_type": "generate_until", "doc_to_target": "x", **cfg}
        (root / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    (root / "mgsm_all.yaml").write_text(yaml.safe_dump(GROUP))
    return root


def _refusal(proxy: str, target: str, paths: list) -> str | None:
    index = task_index([proxy, target], paths)
    try:
        require_own_data([("proxies[0].task", proxy)], target, index)
    except ValueError as e:
        return str(e)
    return None


def test_a_proxy_reading_the_targets_test_split_under_another_name_is_refused(tasks_dir):
    msg = _refusal("cot_sw", "direct_sw", [tasks_dir])
    assert msg is not None and "\n" not in msg
    for part in ("proxies[0].task", "'cot_sw'", "'direct_sw'", "hub/mgsm", "dataset_name sw", "split test"):  # fmt: skip
        assert part in msg, msg
    assert "validation_split" not in msg
    assert "scores" in _refusal("val_only", "direct_sw", [tasks_dir])
    assert "few-shot" in _refusal("shots_from_test", "direct_sw", [tasks_dir])


def test_english_mgsm_and_other_splits_are_allowed(tasks_dir):
    assert _refusal("direct_en", "direct_sw", [tasks_dir]) is None
    assert _refusal("direct_sw", "direct_en", [tasks_dir]) is None


def test_a_group_target_counts_each_member_and_its_overrides(tasks_dir):
    index = task_index(["mgsm_all"], [tasks_dir])
    leaves = dict(leaf_configs("mgsm_all", index))
    assert sorted(leaves) == ["cot_sw", "direct_en"] and leaves["cot_sw"]["num_fewshot"] == 0
    msg = _refusal("direct_sw", "mgsm_all", [tasks_dir])
    assert "'cot_sw' in it" in msg and "'mgsm_all'" in msg
    assert _refusal("direct_en", "mgsm_all", [tasks_dir]) is not None  # English is a member here


def test_world_tasks_compare_their_data_files(tmp_path, tasks_dir):
    """World tasks all read dataset_path json: the data file decides, not the loader."""
    world = tmp_path / "w"
    for fam in ("mgsm", "belebele"):
        for split in ("train", "dev", "test"):
            f = world / "data" / fam / "xa" / f"{split}.jsonl"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.touch()  # never read: the rule reads configs
    wtasks = tmp_path / "tasks"
    write_world_tasks(world, wtasks)
    test_file = str((world / "data/mgsm/xa/test.jsonl").resolve())
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "my_xa.yaml").write_text(
        yaml.safe_dump(
            {
                "task": "my_xa",
                "include": str(wtasks / "world_mgsm_direct_xa_dev.yaml"),
                "dataset_kwargs": {"data_files": {"eval": test_file}},
                "test_split": "eval",
            }
        )
    )
    paths = [wtasks, mine]
    target = "world_mgsm_direct_xa"
    for ok in ("world_mgsm_direct_xa_dev", "world_belebele_brier_xa_dev"):
        assert _refusal(ok, target, paths) is None, ok
    msg = _refusal("my_xa", target, paths)
    assert msg is not None and test_file in msg and "dataset_path json" in msg
