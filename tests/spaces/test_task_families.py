"""The task-family table (spaces.task_families): names recognised, split twins, unknown families
refused with a clear message, and its readers (planner, analysis, search config) taking a family
added to the table without another edit.

Run: .venv/bin/python -m pytest -q tests/spaces/test_task_families.py
"""

from __future__ import annotations

import pytest

from layerswap.spaces import task_families as tf
from layerswap.spaces.world import WorldConfig


@pytest.mark.parametrize(
    ("task", "family", "answer"),
    [
        ("world_mgsm_direct_xa", "mgsm", "generate"),
        ("world_mgsm_direct_en_dev", "mgsm", "generate"),
        ("world_belebele_xa_dev", "belebele", "choice"),
        ("world_belebele_brier_xb", "belebele", "choice"),
        ("mgsm_direct_bn", "mgsm", "generate"),
        ("belebele_swh_Latn", "belebele", "choice"),
        ("global_mmlu_full_sw", "global_mmlu", "choice"),
    ],
)
def test_a_task_name_is_recognised(task, family, answer):
    fam = tf.family_of(task)
    assert fam.name == family and fam.answer == answer
    assert (fam.shape.choices > 0) == (answer == "choice")  # the shape agrees with the answer


def test_an_unknown_family_is_an_error_naming_the_task_and_the_known_ones():
    for task in ("world_toy_xa_dev", "gsm8k", "xmgsm_direct_en"):
        assert tf.find_family(task) is None
        with pytest.raises(ValueError, match=rf"task '{task}' belongs to no known task family \(mgsm: world_mgsm_direct_CODE\[_dev\], mgsm_\*; belebele: "):  # fmt: skip
            tf.family_of(task)
    with pytest.raises(ValueError, match=r"unknown task family 'toy'; known task families: mgsm, belebele, global_mmlu"):  # fmt: skip
        tf.family("toy")


def test_split_twins_are_one_rule():
    assert tf.dev_task("world_mgsm_direct_xa") == "world_mgsm_direct_xa_dev"
    assert tf.dev_task("world_mgsm_direct_xa_dev") == "world_mgsm_direct_xa_dev"
    assert tf.heldout_task("world_belebele_xa_dev") == "world_belebele_xa"
    assert tf.heldout_task("mgsm_direct_en") == "mgsm_direct_en"
    assert tf.task_split("world_belebele_xa_dev") == "dev" and tf.task_split("x") == "test"
    assert tf.split_task("a_dev", "test") == "a" and tf.split_task("a", "dev") == "a_dev"
    assert tf.task_language("world_mgsm_direct_xa_dev") == "xa"
    bele = tf.family("belebele")
    assert bele.world_task("xa", "dev", stem="world_belebele_brier") == "world_belebele_brier_xa_dev"  # fmt: skip
    with pytest.raises(ValueError, match="no world task stem 'world_bele'"):
        bele.world_task("xa", stem="world_bele")


def test_every_world_family_has_its_world_config_counts():
    cfg = WorldConfig()
    for fam in tf.world_families():
        for split in ("dev", "test"):
            assert getattr(cfg, fam.count_field(split)) >= 1
        assert fam.world_shape is not None and fam.lm_eval_base
        assert fam.data_file("xa", "dev") == f"data/{fam.name}/xa/dev.jsonl"


@pytest.fixture
def toy(monkeypatch):
    """A generation family `toy` (task skill) added to the table alone."""
    fam = tf.TaskFamily(
        name="toy",
        answer="generate",
        skill="task",
        shape=tf.TaskShape(items=7, prompt_tokens=3, note="toy"),
        lm_eval_prefixes=("toy_",),
        world_stems={"world_toy": None},
        world_shape=tf.TaskShape(prompt_tokens=2, note="toy world"),
        lm_eval_base="mgsm/direct/mgsm_direct_en.yaml",
        fewshot="train",
    )
    monkeypatch.setitem(tf.FAMILIES, "toy", fam)
    return fam


def test_a_family_added_to_the_table_reaches_its_readers(toy, tmp_path):
    from layerswap.analysis.load import is_target_family
    from layerswap.study.estimate import task_shape, world_items

    assert tf.family_of("world_toy_xa_dev") is toy
    # the planner: built-in shapes, and world item counts from the world folder
    assert task_shape("toy_en", {}).items == 7
    assert task_shape("world_toy_xa", {}).note == "toy world"
    (tmp_path / "data/toy/xa").mkdir(parents=True)
    (tmp_path / "data/toy/xa/dev.jsonl").write_text("{}\n{}\n")
    assert world_items("world_toy_xa_dev", str(tmp_path)) == 2
    # the analysis: a task-skill family's tasks are target tasks
    assert is_target_family("ind__world_toy_xa_dev") and not is_target_family("belebele_x")


def test_the_planner_refuses_a_world_task_of_no_family(tmp_path):
    """It used to count any world task that was not MGSM as Belebele."""
    from layerswap.study.estimate import task_shape, world_items

    assert task_shape("world_toy_xa_dev", {}) is None  # listed as unknown by the plan
    with pytest.raises(ValueError, match="'world_toy_xa_dev' belongs to no known task family"):
        world_items("world_toy_xa_dev", str(tmp_path))
