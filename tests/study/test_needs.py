"""study/needs.py: what `layerswap prefetch` downloads for the shipped configs, listed offline.

Run: .venv/bin/python -m pytest -q tests/study/test_needs.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from layerswap import spaces
from layerswap.study.needs import _hub_model, needs_of

EXAMPLES = Path(spaces.__file__).parent / "examples"


def test_the_papers_study_needs_its_base_four_datasets_and_seven_tasks():
    n = needs_of([EXAMPLES / "real_study.yaml"])
    assert set(n.models) == {"meta-llama/Llama-3.1-8B-Instruct"}
    assert set(n.datasets) == {("aya", "swh"), ("aya", "ben"), ("aya", "tel"), ("orca_math", None)}
    assert set(n.tasks) == {
        "mgsm_direct_en", "mgsm_direct_sw", "mgsm_direct_bn", "mgsm_direct_te",
        "belebele_swh_Latn", "belebele_ben_Beng", "belebele_tel_Telu",
    }  # fmt: skip
    assert all("real_study.yaml" in w for ws in n.models.values() for w in ws)


def test_single_configs_and_their_kinds():
    search = needs_of([EXAMPLES / "real_qwen25_7b_sw_search.yaml"])
    assert set(search.models) == {"Qwen/Qwen2.5-7B-Instruct"}
    assert set(search.tasks) == {"belebele_swh_Latn", "mgsm_direct_en", "mgsm_direct_sw"}
    train = needs_of([EXAMPLES / "real_llama31_8b_sw_full.yaml"])
    assert set(train.models) == {"meta-llama/Llama-3.1-8B-Instruct"} and set(train.datasets) == {("aya", "swh")}  # fmt: skip
    assert not train.tasks  # no sweep block: nothing is scored


def test_world_configs_need_nothing_from_the_hub(tiny_world, tmp_path):
    import yaml

    data = yaml.safe_load((EXAMPLES / "world_math_full.yaml").read_text())
    data["base"] = str(tiny_world / "base")
    data["datasets"] = [{"path": str(tiny_world / "data/sft/math_en.jsonl")}]
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump(data))
    assert len(needs_of([f])) == 0


def test_hub_ids_are_told_from_paths(tmp_path):
    assert _hub_model("meta-llama/Llama-3.1-8B-Instruct")
    assert (
        not _hub_model(str(tmp_path)) and not _hub_model("./runs/x") and not _hub_model("s3://b/k")
    )
    assert not _hub_model("a/b/c") and not _hub_model(None)


def test_a_file_of_no_known_kind_is_named(tmp_path):
    f = tmp_path / "cluster.yaml"
    f.write_text("cluster_name: x\n")
    with pytest.raises(ValueError, match=r"cluster.yaml: not a study .* config"):
        needs_of([f])
