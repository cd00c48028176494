"""`layerswap plan STUDY.yaml`: the papers' study plans offline with GPU-hours per stage and its
assumed figures marked; the world's study plans with the cpu profile; names that do not resolve
exit 2 naming them; `--json` follows the output policy (atomic, never replaces without
--overwrite, never replaces what is not a plan).

Run: .venv/bin/pytest -q tests/cli/test_plan_cli.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from layerswap import spaces
from layerswap.cli import main

EXAMPLES = Path(spaces.__file__).parent / "examples"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_real_study_plans_offline_with_gpu_hours_per_stage(capsys):
    assert main(["plan", str(EXAMPLES / "real_study.yaml")]) == 0
    out = capsys.readouterr().out
    for i, title in enumerate(("expert training", "indicator scoring", "merge search", "promotion"), 1):  # fmt: skip
        m = re.search(rf"^stage {i}: {title}.*: ([\d,.]+) GPU-h(; keeps [\d,.]+ [TGM]B on storage)?$", out, re.M)  # fmt: skip
        assert m and float(m.group(1).replace(",", "")) > 0, title
    assert re.search(r"^total: [\d,.]+ GPU-h", out, re.M)
    # what a step sends, what checkpoints keep, and the study's storage (issue 40 items 7, 8)
    assert "communication 54.4 GB = 151 ms (FSDP: bfloat16 weights all-gathered" in out
    assert "checkpoints: 16 x 16.1 GB weights (bfloat16: precision.checkpoint_dtype base; float32: 32.1 GB) + 96.4 GB resume state" in out  # fmt: skip
    assert re.search(r"^storage when the study ends: [\d.]+ TB \(train [\d.]+ TB, promotion [\d.]+ GB\)$", out, re.M)  # fmt: skip
    assert "every generation batch decoding max_gen_toks" in out
    assert "figures of profile h100 (0 of 12 measured)" in out
    assert "train_flops_per_s 3.96e+14 FLOP/s (assumed)" in out and "(measured)" not in out
    assert "built-in copy of meta-llama/Llama-3.1-8B-Instruct's config" in out
    for name in ("llama31_8b_ben_lora", "llama31_8b_tel_search", "mgsm_direct_te"):
        assert name in out
    assert "problems:" not in out


def _toy_study(root: Path, target: str = "mgsm_direct_sw") -> Path:
    (root / "base").mkdir(parents=True)
    config = {"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 32}  # fmt: skip
    (root / "base" / "config.json").write_text(json.dumps(config))
    search = {
        "language": "swh",
        "base": str(root / "base"),
        "task_experts": ["t"],
        "language_experts": ["l"],
        "proxies": [{"task": "belebele_swh_Latn", "chance": 0.25}, {"task": "mgsm_direct_en"}],
        "target": target,
        "search": {"num_samples": 2, "gpus_per_trial": 1},
    }
    study = root / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "toy", "searches": [{"experiment": search}]}))
    return study


def test_unresolved_task_exits_2_naming_it(tmp_path, capsys):
    study = _toy_study(tmp_path, target="mgsm_direct_zz_missing")
    out = tmp_path / "plan.json"
    assert main(["plan", str(study), "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown task mgsm_direct_zz_missing" in err and "1 problem(s)" in err
    assert not out.exists()  # a plan with problems is not written


def test_unknown_profile_exits_2(tmp_path, capsys):
    assert main(["plan", str(_toy_study(tmp_path)), "--profile", "tpu"]) == 2
    assert "profile 'tpu': unknown (known: cpu, h100, h200)" in capsys.readouterr().err


def test_bad_study_exits_2_naming_the_field(tmp_path, capsys):
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "x", "searches": [], "experts": [{"cfg": "a"}]}))
    assert main(["plan", str(study)]) == 2
    err = capsys.readouterr().err
    assert str(study) in err and "experts.0.cfg" in err


def test_json_is_atomic_and_follows_the_output_policy(tmp_path, capsys):
    study = _toy_study(tmp_path)
    out = tmp_path / "out" / "plan.json"
    out.parent.mkdir()
    assert main(["plan", str(study), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["layerswap_plan"] == 1 and data["profile"] == "h100"
    assert [s["key"] for s in data["stages"]] == ["train", "indicators", "search", "promotion"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["plan.json"]  # no temporary left
    capsys.readouterr()

    out.write_text(json.dumps({**data, "hours": -1}))
    assert main(["plan", str(study), "--json", str(out)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert json.loads(out.read_text())["hours"] == -1  # untouched

    assert main(["plan", str(study), "--json", str(out), "--overwrite"]) == 0
    assert json.loads(out.read_text())["hours"] == data["hours"]

    other = tmp_path / "notes.json"
    other.write_text('{"mine": 1}')
    assert main(["plan", str(study), "--json", str(other), "--overwrite"]) == 2
    assert "is not a layerswap plan JSON" in capsys.readouterr().err
    assert other.read_text() == '{"mine": 1}'

    assert main(["plan", str(study), "--json", str(study), "--overwrite"]) == 2  # an input
    assert yaml.safe_load(study.read_text())["name"] == "toy"


def test_world_study_plans_with_the_cpu_profile(tiny_world, tmp_path, monkeypatch, capsys):
    # The world study names runs/world, relative to the working folder, as the examples do.
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "world").symlink_to(tiny_world)
    monkeypatch.chdir(tmp_path)
    assert main(["plan", str(EXAMPLES / "world_study.yaml")]) == 0
    out = capsys.readouterr().out
    assert "profile cpu:" in out and "hours are CPU-thread-h" in out
    assert "train_flops_per_s 2.75e+10 FLOP/s (measured)" in out
    assert "world_math_full: runs 1, samples/run 4,800, tokens/run 206,880, steps/run 300, ckpts/run 3" in out  # fmt: skip
    assert "task world_belebele_xa_dev: the world's task YAMLs" in out
    assert "note: step per worker: compute" in out and "GPU" not in out  # CPU workers here


def test_cluster_says_which_node_types_declare_the_gpus(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    types = {
        "cpu_head": {"resources": {"CPU": 8}},
        "gpu_node": {"resources": {"CPU": 48, "GPU": 4, "accelerator_type:L40S": 1}},
        "auto": {"node_config": {}},
    }
    cluster.write_text(yaml.safe_dump({"available_node_types": types}))
    assert main(["plan", str(_toy_study(tmp_path)), "--cluster", str(cluster)]) == 0
    out = capsys.readouterr().out
    assert "node type gpu_node: 4 x L40S" in out
    assert "node type auto: GPUs not declared" in out
    assert re.search(r"^  search search: 1 x GPU per run -> gpu_node$", out, re.M)
