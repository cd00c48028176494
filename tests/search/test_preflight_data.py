"""The search's data check (search/preflight_data.py): a task whose data is not in the local
cache fails `layerswap search` before anything runs, naming the task; world tasks pass.

Run: .venv/bin/python -m pytest -q tests/search/test_preflight_data.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from layerswap.search.preflight_data import searched_tasks, split_data_problems, uncached_problem
from tests.search.search_fixtures import experiment, make_experts


@pytest.fixture(scope="module")
def expert_pair(tiny_world, tmp_path_factory):
    return make_experts(tiny_world, tmp_path_factory.mktemp("pair"))


def test_world_tasks_read_offline(tiny_world, expert_pair):
    exp = experiment(tiny_world, expert_pair)
    assert uncached_problem(exp) is None


def test_no_promote_checks_only_the_proxies(tiny_world, expert_pair):
    exp = experiment(tiny_world, expert_pair, target="mgsm_direct_sw")
    assert "mgsm_direct_sw" not in searched_tasks(exp, promote=False)
    assert uncached_problem(exp, promote=False) is None


@pytest.mark.slow  # ~15-50 s: lm-eval indexes its ~10k built-in task YAMLs
def test_uncached_target_fails_the_search_before_it_runs(tiny_world, expert_pair, tmp_path):
    # The world's proxies are local files; the target is a built-in task whose dataset this
    # machine (offline, empty cache) does not have: before, the whole search ran and promotion
    # failed at its end.
    data = experiment(tiny_world, expert_pair, target="mgsm_direct_sw").model_dump(mode="json")
    cfg = tmp_path / "search.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "layerswap.cli", "search", str(cfg), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "mgsm_direct_sw" in err and "layerswap prefetch" in err, err
    assert "Traceback" not in err
    assert "world_" not in err  # the world's tasks are readable: only the target is named
    assert not out.exists(), sorted(p.name for p in out.iterdir())  # nothing ran, nothing written
    assert took < 120, took


# What every test task here scores (the dataset lines differ; braces doubled for .format).
_SCORED = """test_split: test
output_type: generate_until
doc_to_text: "{{{{q}}}}"
doc_to_target: "{{{{a}}}}"
metric_list:
  - metric: exact_match
    higher_is_better: true
"""
_TASK = (
    """task: {name}
dataset_path: layerswap-test/not-a-dataset
dataset_name: sw
"""
    + _SCORED
)


def test_a_proxy_reading_the_targets_test_split_is_said_beside_the_missing_data(tiny_world, expert_pair, tmp_path):  # fmt: skip
    # The proxy scores the target's test split under another name (as mgsm_native_cot_sw does
    # for target mgsm_direct_sw), and neither dataset is cached: the data error alone sent the
    # user to download data for a config the search refuses once the data is there.
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("leaky_proxy", "leaky_target"):
        (tasks / f"{name}.yaml").write_text(_TASK.format(name=name))
    exp = experiment(tiny_world, expert_pair, include_path=[str(tasks)], proxies=[{"task": "leaky_proxy"}], target="leaky_target")  # fmt: skip
    said = uncached_problem(exp)
    assert said is not None and "task data not in the local Hugging Face cache" in said
    assert "proxies[0].task 'leaky_proxy' scores dataset_path layerswap-test/not-a-dataset" in said
    assert "the test split of target 'leaky_target'" in said


_JSON_TASK = (
    """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    {split}: {file}
"""
    + _SCORED
)


def test_a_target_whose_test_split_is_missing_is_named_without_reading_it(tiny_world, expert_pair, tmp_path):  # fmt: skip
    # Promotion's tasks are checked from their configs (the test split is never opened, not
    # even here): a data file that is not there, and a dataset that has no test split.
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"q": "1+1", "a": "2"}\n')
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    gone = tmp_path / "gone" / "test.jsonl"
    (tasks / "t_gone.yaml").write_text(_JSON_TASK.format(name="t_gone", split="test", file=gone))
    (tasks / "t_nosplit.yaml").write_text(_JSON_TASK.format(name="t_nosplit", split="train", file=rows))  # fmt: skip
    for target, said in [
        ("t_gone", f"task 't_gone': Unable to find '{gone}'"),
        ("t_nosplit", "scores split 'test', which dataset_path json does not have (it has: train)"),
    ]:
        exp = experiment(tiny_world, expert_pair, include_path=[str(tasks)], target=target)
        problem = uncached_problem(exp)
        assert problem is not None and said in problem, problem
        assert uncached_problem(exp, promote=False) is None  # the proxies alone are fine


def test_dataset_kwargs_only_load_dataset_takes_are_accepted(tmp_path):
    """lm-eval passes a task's dataset_kwargs to `datasets.load_dataset`, which takes
    verification_mode (num_proc, ...); the split check's `load_dataset_builder` raised
    TypeError on them, refusing a search over a task lm-eval runs fine."""
    rows = tmp_path / "test.jsonl"
    rows.write_text('{"q": "1+1", "a": "2"}\n')
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    kwargs = {"data_files": {"test": str(rows)}, "verification_mode": "no_checks", "num_proc": 1}
    task = {
        "task": "vm_task",
        "dataset_path": "json",
        "test_split": "test",
        "dataset_kwargs": kwargs,
    }
    task |= {"output_type": "generate_until", "doc_to_text": "{{q}}", "doc_to_target": "{{a}}"}
    task |= {"metric_list": [{"metric": "exact_match"}]}
    (tasks / "vm.yaml").write_text(yaml.safe_dump(task))
    assert split_data_problems(["vm_task"], [str(tasks)], {}) == []
