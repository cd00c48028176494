"""Cloud storage end to end against a real S3 server (moto on loopback): Ray Train writes an
expert's checkpoints to s3://, the registry records their URIs, and both a merge search and
`layerswap merge` read the experts (and the base) from the bucket; so does training its data.

Run: .venv/bin/python -m pytest -q tests/trainables/test_storage_s3.py  (slow: one Ray Train fit
and one Tune search, ~1 min)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from layerswap.trainables import storage

pytestmark = pytest.mark.slow

MATH_IND = "world_mgsm_direct_en_dev"
LANG_IND = "world_belebele_xa_dev"


@pytest.fixture(scope="module")
def ray_s3(s3):
    """A 2-CPU local Ray started after `s3`: its raylet and workers inherit the AWS variables."""
    import shutil
    import tempfile

    import ray

    tmp = tempfile.mkdtemp(prefix="lss", dir="/tmp")
    ray.init(num_cpus=2, _temp_dir=tmp, include_dashboard=False, log_to_driver=False)
    yield s3
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def _experiment(world: Path, kind: str, **over):
    from layerswap.spaces.train_experiment import parse_train_experiment

    data = "math_en" if kind == "math" else "lang_xa"
    cfg = {
        "name": f"{kind}_s3",
        "base": str(world / "base"),
        "kind": kind,
        "language": "en" if kind == "math" else "xa",
        "datasets": [{"path": str(world / f"data/sft/{data}.jsonl")}],
        "mode": "full",
        "hyper": {"lr": 3e-3, "batch_size": 8, "max_steps": 4, "seq_len": 96, "seed": 0},
        "checkpoint_every_samples": 16,
    } | over
    return parse_train_experiment(cfg, source="test")


def _checkpoints(run: str) -> list[str]:
    """The checkpoint folders under a run URI (those holding a training manifest)."""
    from layerswap.trainables.train.state import MANIFEST

    return [f.removesuffix(f"/{MANIFEST}") for f in storage.list_files(run) if f.endswith(MANIFEST)]  # fmt: skip


def _register(exp, checkpoint: str, registry: Path, indicator: str, score: float) -> None:
    """One registry row for a checkpoint in the bucket (its manifest read from there)."""
    from layerswap.experts.registry import append_rows, expert_row
    from layerswap.spaces.train_experiment import experiment_json
    from layerswap.trainables.train.state import MANIFEST

    manifest = json.loads(storage.read_text(storage.join(checkpoint, MANIFEST)))
    cols = {f"ind__{indicator}": score, f"n_items__{indicator}": 8}
    append_rows(registry, [expert_row(experiment_json(exp), checkpoint, manifest, "t0", cols)])


def test_train_register_search_and_merge_through_s3(tiny_world, ray_s3, tmp_path, capsys):
    from layerswap.cli import main
    from layerswap.experts.registry import read_rows, registry_path
    from layerswap.search.preflight import preflight
    from layerswap.search.search import run_search
    from layerswap.spaces.search_experiment import SearchExperiment
    from layerswap.trainables.train import run_training
    from layerswap.trainables.train.run import train_expert

    bucket = ray_s3.bucket()
    train = storage.join(bucket, "train")

    # Ray Train writes the math expert's checkpoints to the bucket (its workers read the
    # dataset from there too); the result names the last checkpoint's URI.
    data = storage.join(bucket, "data", "math_en.jsonl")
    storage.upload_dir(tiny_world / "data" / "sft", storage.join(bucket, "data"))
    math = _experiment(tiny_world, "math", storage_path=train, datasets=[{"path": data}])
    last = train_expert(math, train)
    run = storage.join(train, math.name)
    math_ckpts = _checkpoints(run)
    assert [c.rsplit("/", 1)[1] for c in math_ckpts] == ["samples_000000016", "samples_000000032"]
    assert last == math_ckpts[-1] and storage.is_uri(last)

    # The language expert is trained here and uploaded (manifest last); the base goes up too.
    lang = _experiment(tiny_world, "language")
    res = run_training(lang, workdir=tmp_path / "lang")
    lang_ckpt = storage.upload_dir(res.final_checkpoint, storage.join(bucket, "lang", "final"))
    base = storage.upload_dir(tiny_world / "base", storage.join(bucket, "base"))

    # The registry records the checkpoints' URIs as such.
    reg = registry_path(tmp_path / "run")
    for i, ck in enumerate(math_ckpts):
        _register(math, ck, reg, MATH_IND, 0.1 * (i + 1))
    _register(lang, lang_ckpt, reg, LANG_IND, 0.5)
    assert sorted(r["path"] for r in read_rows(reg)) == sorted([*math_ckpts, lang_ckpt])

    # A merge search draws its experts (best math checkpoint: the last) from the bucket.
    exp = SearchExperiment.model_validate(
        {
            "name": "s3",
            "language": "xa",
            "base": base,
            "experts": {"registry": str(reg), "top_k": 1},
            "world": str(tiny_world),
            "proxy_eval": {"limit": 4, "max_gen_toks": 4},
            "space": {
                "bottom": {"low": 0, "high": 1},
                "top": {"low": 0, "high": 1},
                "bottom_transition": {"low": 0, "high": 0},
                "top_transition": {"low": 0, "high": 0},
            },
            "search": {"num_samples": 2, "max_concurrent": 1, "fidelity": {"screen": None}},
        }
    )
    checked = preflight(exp)
    assert checked.problems == [] and any("cloud storage" in u for u in checked.unchecked)
    found = run_search(exp, tmp_path / "run", progress=False)
    assert found.n_trials == 2 and {r["status"] for r in found.best} == {"ok"}
    pool = json.loads((tmp_path / "run" / "search" / "pool.json").read_text())
    assert [r["path"] for r in pool["task"]] == [math_ckpts[-1]] and pool["base"] == base

    # `layerswap merge` reads a recipe whose experts and base are URIs.
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "method": "layer_swap",
                "task_expert": math_ckpts[-1],
                "language_expert": lang_ckpt,
                "base": base,
                "bottom": 1,
                "top": 1,
            }
        )
    )
    out = tmp_path / "merged"
    assert main(["merge", str(recipe), "--out", str(out), "--quiet"]) == 0
    _check_swap(out, storage.local_copy(math_ckpts[-1]), res.final_checkpoint)
    assert "s3://" in (out / "layerswap_recipe.yaml").read_text()  # provenance keeps the URIs


def _check_swap(out: Path, task: Path, language: Path) -> None:
    """Layer 0 (bottom) is the language expert's, layer 1 (middle) the task expert's."""
    import torch
    from safetensors.torch import load_file

    merged, t, lang = (load_file(p / "model.safetensors") for p in (out, task, language))
    for name in ("model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"):
        want = lang[name] if ".layers.0." in name else t[name]
        assert torch.equal(merged[name], want), name
