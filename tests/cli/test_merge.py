"""The `layerswap` CLI: merges from a recipe file, errors exit non-zero and write nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from layerswap.cli import main
from layerswap.cli.merge import parse_size
from layerswap.spaces.recipe import load_recipe, recipe_id
from layerswap.trainables.merge.checkpoint import Checkpoint
from layerswap.trainables.model_ids import content_recipe_id
from layerswap.world.tiny import make_tiny_family


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> dict[str, Path]:
    return make_tiny_family(tmp_path_factory.mktemp("cli"), num_layers=6, with_tokenizer=False)


def _recipe(tmp_path: Path, family: dict[str, Path], **over) -> Path:
    data = {
        "method": "layer_swap",
        "task_expert": str(family["task"]),
        "language_expert": str(family["language"]),
        "bottom": 1,
        "top": 1,
        "bottom_transition": 1,
        "top_transition": 0,
    }
    data.update(over)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_merge_writes_model_and_recipe(tmp_path, family, capsys):
    recipe = _recipe(tmp_path, family)
    assert main(["merge", str(recipe), "--out", str(tmp_path / "m"), "-q"]) == 0
    rid = content_recipe_id(load_recipe(recipe))  # the one id the command and the folder name
    assert f"recipe {rid} -> " in capsys.readouterr().out
    assert (
        (tmp_path / "m" / "layerswap_recipe.yaml")
        .read_text()
        .startswith(f"# layerswap recipe {rid}\n")
    )
    out = Checkpoint.open(tmp_path / "m")
    task = Checkpoint.open(family["task"])
    name = "model.layers.3.mlp.up_proj.weight"  # layer 3 of 6 with b=1,t_b=1,u=1: task
    assert torch.equal(out.read(name), task.read(name))
    assert recipe_id(load_recipe(tmp_path / "m" / "layerswap_recipe.yaml")) == recipe_id(
        load_recipe(recipe)
    )


def test_refuses_existing_output_then_overwrites(tmp_path, family, capsys):
    recipe = _recipe(tmp_path, family)
    (tmp_path / "m").mkdir()
    assert main(["merge", str(recipe), "--out", str(tmp_path / "m"), "-q"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert list((tmp_path / "m").iterdir()) == []
    assert main(["merge", str(recipe), "--out", str(tmp_path / "m"), "-q", "--overwrite"]) == 0
    assert (tmp_path / "m" / "model.safetensors").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"bottom": 4, "top": 2}, "exceeds the model's 6 layers"),
        ({"bottom": -1}, "bottom"),
        ({"bottm": 2}, "bottm"),
        ({"non_layer": "median"}, "non_layer"),
    ],
)
def test_bad_recipe_exits_2_and_writes_nothing(tmp_path, family, capsys, override, message):
    recipe = _recipe(tmp_path, family, **override)
    assert main(["merge", str(recipe), "--out", str(tmp_path / "m"), "-q"]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]


def test_export_mergekit_only(tmp_path, family):
    recipe = _recipe(tmp_path, family)
    assert main(["merge", str(recipe), "--export-mergekit", str(tmp_path / "mk.yaml")]) == 0
    config = yaml.safe_load((tmp_path / "mk.yaml").read_text())
    assert "slices" in config or "merge_method" in config


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("2MiB") == 2 * 2**20
    assert parse_size("123") == 123
    with pytest.raises(Exception, match="invalid size"):
        parse_size("lots")


def test_help_runs_as_console_script():
    proc = subprocess.run(
        [sys.executable, "-m", "layerswap.cli", "merge", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    assert "--export-mergekit" in proc.stdout


def test_demo_end_to_end(tmp_path, capsys):
    assert main(["demo", "--merge-only", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "MISMATCH" not in out
    assert (tmp_path / "demo" / "merged" / "layerswap_recipe.yaml").exists()
    # Its line says what it merges: the paper's default zones (which have no transitions) plus
    # the 1-layer magnitude transitions its recipe has; it had called that "paper default".
    recipe = yaml.safe_load((tmp_path / "demo" / "recipe.yaml").read_text())
    assert (recipe["bottom_transition"], recipe["top_transition"]) == (1, 1)
    assert recipe["transition_weights"] == "magnitude"
    line = next(x for x in out.splitlines() if x.startswith("[2/4]"))
    assert "the paper's default zones" in line and "plus 1-layer magnitude transitions" in line


def test_eval_subcommand_is_wired():
    proc = subprocess.run(
        [sys.executable, "-m", "layerswap.cli", "eval", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    assert "--world" in proc.stdout and "MODEL_DIR" in proc.stdout


def test_world_build_tiny_via_cli(tmp_path, capsys):
    assert main(["world", "build", "--out", str(tmp_path / "w"), "--size", "tiny"]) == 0
    manifest = (tmp_path / "w" / "world.json").read_text()
    assert '"size": "tiny"' in manifest


def test_the_merged_recipe_names_relative_checkpoints_absolutely(tmp_path, family):
    """docs/guides/merge.md: relative checkpoint paths, resolved against the recipe's folder, are
    written into the merged folder's YAML as absolute paths, so the copy rebuilds from anywhere
    (a red-team read 'keeps the paths as written' and found absolute ones)."""
    here = tmp_path / "recipes"
    here.mkdir()
    rel = {k: os.path.relpath(family[k], here) for k in ("task", "language")}
    recipe = here / "r.yaml"
    recipe.write_text(yaml.safe_dump({"method": "layer_swap", "task_expert": rel["task"], "language_expert": rel["language"], "bottom": 1, "top": 1}))  # fmt: skip
    assert main(["merge", str(recipe), "--out", str(tmp_path / "m")]) == 0
    written = yaml.safe_load((tmp_path / "m" / "layerswap_recipe.yaml").read_text())
    for field, k in (("task_expert", "task"), ("language_expert", "language")):
        assert written[field] == str(family[k].resolve()), (field, written[field])
    # the copy, read from its own folder, names the same checkpoints: the same recipe id
    assert recipe_id(load_recipe(tmp_path / "m" / "layerswap_recipe.yaml")) == recipe_id(load_recipe(recipe))  # fmt: skip
