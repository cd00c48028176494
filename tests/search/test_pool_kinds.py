"""Explicit experts (task_experts / language_experts) are typed by their folder, as registry
experts are: a LoRA adapter is "lora" in the pool (space.expert_kinds filters it), a search over
explicit adapters only passes the preflight (the depth comes from `base`), and two checkpoints
that share a folder name (every layerswap checkpoint is checkpoints/samples_<n>) get two ids.

Run: .venv/bin/python -m pytest -q tests/search/test_pool_kinds.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from search_fixtures import experiment, make_experts

from layerswap.search.pool import explicit_ids, model_depth, resolve_pool
from layerswap.search.preflight import check_search
from layerswap.spaces.search_space import _choices, expert_id


@pytest.fixture(scope="module")
def paths(tiny_world, tmp_path_factory) -> dict[str, Path]:
    return make_experts(tiny_world, tmp_path_factory.mktemp("kinds_experts"))


@pytest.fixture
def adapters(paths, tmp_path) -> list[str]:
    """Two PEFT LoRA adapter folders as `layerswap train` names them: same folder name."""
    out = []
    for run in ("math_lora", "lang_lora"):
        d = tmp_path / run / "checkpoints" / "samples_000000096"
        d.mkdir(parents=True)
        (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
        (d / "adapter_model.safetensors").write_bytes(b"")
        shutil.copyfile(paths["task"] / "tokenizer.json", d / "tokenizer.json")
        out.append(str(d))
    return out


def test_explicit_adapters_are_lora_with_distinct_ids(tiny_world, paths, adapters):
    exp = experiment(tiny_world, paths, task_experts=[adapters[0], str(paths["task"])],
                     language_experts=[adapters[1]])  # fmt: skip
    pool = resolve_pool(exp)
    assert [r.kind for r in pool.task] == ["lora", "full"]
    assert [r.kind for r in pool.language] == ["lora"]
    ids = [expert_id(pool, p) for p in (*adapters, str(paths["task"]))]
    assert ids == [
        "math_lora/checkpoints/samples_000000096",
        "lang_lora/checkpoints/samples_000000096",
        paths["task"].name,
    ]
    full_only = exp.space.model_copy(update={"expert_kinds": ["full"]})
    assert _choices(pool, "task", full_only) == ["1"]  # the adapter is not searched
    with pytest.raises(ValueError, match="no language expert of that kind"):
        _choices(pool, "language", full_only)


def test_a_search_over_explicit_adapters_only(tiny_world, paths, adapters):
    exp = experiment(tiny_world, paths, task_experts=[adapters[0]], language_experts=[adapters[1]],
                     space={"weighting": ["uniform"], "expert_kinds": ["lora"]})  # fmt: skip
    assert check_search(exp) == []
    base_depth = json.loads((paths["base"] / "config.json").read_text())["num_hidden_layers"]
    assert model_depth(resolve_pool(exp)) == base_depth
    full_only = exp.model_copy(update={"space": exp.space.model_copy(update={"expert_kinds": ["full"]})})  # fmt: skip
    problems = check_search(full_only)
    assert "(task experts: ['lora'])" in " ".join(problems), problems
    assert not any("taken as full" in p for p in problems), problems


def test_explicit_ids_tell_folders_apart():
    got = explicit_ids(["/r/a/samples_1", "/r/b/samples_1", "/w/base", "/w/base", "x/y", "/x/y"])
    assert got == {"/r/a/samples_1": "a/samples_1", "/r/b/samples_1": "b/samples_1",
                   "/w/base": "base", "x/y": "x/y", "/x/y": "/x/y"}  # fmt: skip
    assert len(set(got.values())) == len(got)
