"""The local paths each experiment kind's Ray workers read (spaces/local_inputs.py): Hub ids and
URIs are left out, each path is listed once under the field that names it.

Run: .venv/bin/python -m pytest -q tests/spaces/test_local_inputs.py
"""

from __future__ import annotations

from pathlib import Path

from layerswap.spaces.local_inputs import search_inputs, train_inputs
from layerswap.spaces.search_experiment import SearchExperiment
from layerswap.spaces.search_space import ExpertPool, ExpertRef
from layerswap.spaces.train_experiment import parse_train_experiment
from tests.trainables.train.train_helpers import make_exp


def _train(**over):
    data = make_exp(Path("/w"), "mix").model_dump(mode="json")
    data["base"] = "/m/base"
    data["datasets"] = [{"path": "/d/math.jsonl"}, {"source": "orca_math", "data_files": ["/d/a.parquet", "s3://b/x.parquet"]}]  # fmt: skip
    return parse_train_experiment({**data, **over})


def test_train_inputs_list_the_base_and_every_local_dataset_file():
    assert train_inputs(_train()) == [
        ("base", "/m/base"),
        ("datasets[0].path", "/d/math.jsonl"),
        ("datasets[1].data_files[0]", "/d/a.parquet"),
    ]
    assert train_inputs(_train(base="meta-llama/Llama-3.1-8B"))[0] == ("datasets[0].path", "/d/math.jsonl")  # fmt: skip
    assert train_inputs(_train(base="s3://bucket/base"))[0][0] == "datasets[0].path"


def test_a_sweep_also_lists_its_world(tmp_path):
    (tmp_path / "world.json").write_text("{}")
    sweep = {"num_samples": 2, "params": {"hyper.lr": {"low": 1e-4, "high": 1e-3}}, "world": str(tmp_path)}  # fmt: skip
    assert train_inputs(_train(sweep=sweep))[-1] == ("sweep.world", str(tmp_path))


def test_search_inputs_name_explicit_experts_or_registry_ids_and_skip_uris():
    exp = SearchExperiment(language="xa", base="/m/base", task_experts=["/e/math"], language_experts=["gs://b/lang"], world="/w", include_path=["/tasks", "/w"])  # fmt: skip
    pool = ExpertPool.from_paths(exp.task_experts, exp.language_experts, exp.base)
    assert search_inputs(exp, pool) == [
        ("base", "/m/base"),
        ("task_experts[0]", "/e/math"),
        ("world", "/w"),
        ("include_path[0]", "/tasks"),  # /w again: listed once
    ]
    reg = SearchExperiment(language="xa", experts={"registry": "/r/registry.parquet"}, space={"weighting": ["uniform"]})  # fmt: skip
    pool = ExpertPool(task=[ExpertRef(path="/r/m1", expert_id="m1")], language=[ExpertRef(path="/r/l1", expert_id="l1")], base="/m/base")  # fmt: skip
    assert search_inputs(reg, pool) == [
        ("experts.registry (base)", "/m/base"),
        ("experts.registry (m1)", "/r/m1"),
        ("experts.registry (l1)", "/r/l1"),
    ]
