"""World task YAMLs: writing them opens no data file (the search writes them and must never open
a test split), and `layerswap eval --world` exits 2 on a damaged world, naming the file, without
a traceback.

Run: .venv/bin/python -m pytest -q tests/trainables/evaluate/test_tasks.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from layerswap.trainables.evaluate.tasks import write_world_tasks


@pytest.fixture
def damaged(tiny_world, tmp_path):
    """A copy of the tiny world whose xa MGSM test file ends in a line that is not JSON."""
    w = tmp_path / "w"
    shutil.copytree(tiny_world, w)
    test = w / "data/mgsm/xa/test.jsonl"
    line = test.read_bytes().count(b"\n") + 1
    with open(test, "ab") as f:
        f.write(b'{"question": "x", \n')
    return w, line


def test_writing_task_yamls_opens_no_data_file(damaged, tmp_path):
    w, _ = damaged
    opened, on = [], [True]

    def hook(event, args):
        if on[0] and event == "open":
            opened.append(str(args[0]))

    sys.addaudithook(hook)  # audit hooks cannot be removed: switched off below instead
    try:
        names = write_world_tasks(w, tmp_path / "tasks")
    finally:
        on[0] = False
    assert names and [f for f in opened if f.startswith(str(w / "data"))] == []


def test_cli_eval_exits_2_naming_the_file(damaged, tiny_world):
    w, _ = damaged
    args = ["eval", str(tiny_world / "base"), "--world", str(w), "--tasks", "world_mgsm_direct_xa"]
    run = subprocess.run(
        [sys.executable, "-m", "layerswap.cli", *args, "--limit", "1"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "data/mgsm/xa/test.jsonl: sha256 differs" in run.stderr


def test_a_task_family_added_to_the_table_gets_world_tasks(tmp_path, monkeypatch):
    """write_world_tasks reads spaces.task_families: a new family needs no edit here."""
    import yaml

    from layerswap.spaces import task_families as tf

    toy = tf.TaskFamily(
        name="toy",
        answer="choice",
        skill="language",
        shape=tf.TaskShape(items=7, prompt_tokens=3, choices=4, note="toy"),
        lm_eval_prefixes=("toy_",),
        world_stems={"world_toy": None, "world_toy_brier": tf.BRIER_METRICS},
        world_shape=tf.TaskShape(prompt_tokens=2, choices=4, note="toy world"),
        lm_eval_base="belebele/belebele_eng_Latn.yaml",
    )
    monkeypatch.setitem(tf.FAMILIES, "toy", toy)
    for split in ("dev", "test"):
        (tmp_path / toy.data_file("xa", split)).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / toy.data_file("xa", split)).write_text("")
    names = write_world_tasks(tmp_path)
    assert names == ["world_toy_brier_xa", "world_toy_brier_xa_dev", "world_toy_xa", "world_toy_xa_dev"]  # fmt: skip
    dev = yaml.safe_load((tmp_path / "tasks/world_toy_brier_xa_dev.yaml").read_text())
    assert dev["tag"] == ["world_toy_brier_dev"] and dev["fewshot_split"] == "dev"
    assert dev["metric_list"] == tf.BRIER_METRICS
    assert dev["dataset_kwargs"]["data_files"] == {"dev": str(tmp_path / toy.data_file("xa", "dev"))}  # fmt: skip
