"""A shipped world base: exported from a built world, reused by `world build` only for the world
it was pretrained for, byte for byte; every mismatch named, nothing half-written.

Run `.venv/bin/python -m pytest -q tests/world/test_world_prebuilt.py`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

import layerswap.world.prebuilt as prebuilt
from layerswap.cli import main
from layerswap.spaces.world import PrebuiltBase, load_variant, with_overrides, world_config
from layerswap.world import build_world
from layerswap.world.prebuilt import (
    CONFIG_FILE,
    ENTRY_FILE,
    MODEL_FILES,
    config_differences,
    export_base,
    preset_base_name,
)

SEED = 0  # the tiny_world fixture's


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def bases(tmp_path, monkeypatch) -> Path:
    """world/bases/ moved under tmp_path, for export and reuse alike."""
    d = tmp_path / "bases"
    monkeypatch.setattr(prebuilt, "BASES_DIR", d)
    return d


@pytest.fixture
def shipped(tiny_world, bases):
    """The tiny world's base exported as "tiny0"; its config entry."""
    return export_base(tiny_world, "tiny0")


def _with_entry(entry, seed=SEED):
    return with_overrides(world_config("tiny", seed), {"model": {"prebuilt": entry.model_dump()}}, "test")  # fmt: skip


def _no_pretraining(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("pretrain was called although the base is shipped")

    monkeypatch.setattr("layerswap.world.model.pretrain", refuse)


def test_export_copies_the_base_and_records_its_hashes(tiny_world, bases, shipped):
    folder = bases / "tiny0"
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == sorted([*shipped.files, ENTRY_FILE])  # fmt: skip
    assert PrebuiltBase.model_validate_json((folder / ENTRY_FILE).read_bytes()) == shipped
    for name in MODEL_FILES:
        assert (folder / name).read_bytes() == (tiny_world / "base" / name).read_bytes()
    manifest = json.loads((tiny_world / "world.json").read_text())
    for name, digest in shipped.files.items():
        assert digest == hashlib.sha256((folder / name).read_bytes()).hexdigest()
        if name != CONFIG_FILE:
            assert digest == manifest["sha256"][f"base/{name}"]
    assert shipped.tokenizer_files == {k.removeprefix("base/"): v for k, v in manifest["sha256"].items() if k.startswith("base/") and k.removeprefix("base/") not in MODEL_FILES}  # fmt: skip
    assert "tokenizer.json" in shipped.tokenizer_files
    assert shipped.corpus_sha256 == manifest["sha256"]["corpus/pretrain.txt"]
    assert json.loads((folder / CONFIG_FILE).read_text())["seed"] == SEED
    assert shipped.final_pretrain_loss == manifest["final_pretrain_loss"]


def test_build_reuses_it_without_pretraining_and_gives_the_same_world(tiny_world, shipped, tmp_path, monkeypatch):  # fmt: skip
    _no_pretraining(monkeypatch)
    out = build_world(tmp_path / "w", seed=SEED, size="tiny", config=_with_entry(shipped), progress=False)  # fmt: skip
    built, fresh = _files(tiny_world), _files(out)
    assert sorted(built) == sorted(fresh)
    # only the records differ: world.json names the shipped base, the marker its creation time
    assert [k for k in built if built[k] != fresh[k]] == [".layerswap.json", "world.json"]
    m = json.loads(fresh["world.json"])
    assert m["config"]["model"]["prebuilt"]["name"] == "tiny0"
    assert m["sha256"]["base/model.safetensors"] == shipped.files["model.safetensors"]


def test_the_preset_reuses_the_base_shipped_under_its_name_unless_told_to_pretrain(tiny_world, bases, tmp_path, monkeypatch):  # fmt: skip
    name = preset_base_name(world_config("tiny", SEED))
    assert name == "tiny-v4-seed0"
    export_base(tiny_world, name)
    calls = _Calls()
    monkeypatch.setattr("layerswap.world.model.pretrain", calls)
    out = build_world(tmp_path / "w", seed=SEED, size="tiny", progress=False)
    assert calls.n == 0
    assert (out / "base/model.safetensors").read_bytes() == (tiny_world / "base/model.safetensors").read_bytes()  # fmt: skip
    assert json.loads((out / "world.json").read_text())["config"]["model"]["prebuilt"]["name"] == name  # fmt: skip
    # --pretrain: the preset without the entry, pretrained here (the counted call fails on purpose)
    with pytest.raises(RuntimeError, match="pretrain called"):
        build_world(tmp_path / "p", seed=SEED, size="tiny", progress=False, pretrain=True)
    assert calls.n == 1 and not (tmp_path / "p").exists()
    # another seed has no shipped base: pretrained
    with pytest.raises(RuntimeError, match="pretrain called"):
        build_world(tmp_path / "s1", seed=1, size="tiny", progress=False)


def test_a_damaged_entry_file_is_named(tiny_world, bases, tmp_path):
    name = preset_base_name(world_config("tiny", SEED))
    export_base(tiny_world, name)
    (bases / name / ENTRY_FILE).write_text("{}")
    with pytest.raises(ValueError, match=f"{ENTRY_FILE}: not a shipped base's entry"):
        build_world(tmp_path / "w", seed=SEED, size="tiny", progress=False)
    assert not (tmp_path / "w").exists()


class _Calls:
    """A stand-in for world.model.pretrain that counts calls and stops the build."""

    def __init__(self):
        self.n = 0

    def __call__(self, *a, **k):
        self.n += 1
        raise RuntimeError("pretrain called")


def _refused(cfg, tmp_path, match):
    out = tmp_path / "w"
    with pytest.raises(ValueError, match=match):
        build_world(out, seed=cfg.seed, size="tiny", config=cfg, progress=False)
    assert not out.exists()  # nothing half-written
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".w")] == []


def test_another_world_config_is_refused_naming_the_fields(shipped, tmp_path, monkeypatch):
    _no_pretraining(monkeypatch)
    _refused(_with_entry(shipped, seed=1), tmp_path, "'tiny0' was pretrained for another world: seed: 1 here, 0 in the base")  # fmt: skip
    other = with_overrides(_with_entry(shipped), {"model": {"steps": 9}}, "test")
    _refused(other, tmp_path, "model.steps: 9 here, 8 in the base")


def test_config_differences_ignore_the_entry_itself(shipped):
    assert config_differences(_with_entry(shipped), world_config("tiny", SEED)) == []


def test_a_changed_corpus_or_tokenizer_is_refused(shipped, tmp_path, monkeypatch):
    _no_pretraining(monkeypatch)
    drifted = shipped.model_copy(update={"corpus_sha256": "0" * 64})
    _refused(_with_entry(drifted), tmp_path, "the corpus generated now differs")
    for tok in (
        dict(shipped.tokenizer_files, **{"tokenizer.json": "0" * 64}),  # trained otherwise
        dict(shipped.tokenizer_files, **{"vocab.txt": "0" * 64}),  # a file no longer written
        {"tokenizer.json": shipped.tokenizer_files["tokenizer.json"]},  # one written now, unlisted
    ):
        names = sorted(set(tok) ^ set(shipped.tokenizer_files)) or ["tokenizer.json"]
        _refused(_with_entry(shipped.model_copy(update={"tokenizer_files": tok})), tmp_path, "the tokenizer trained now differs from the base's in " + re.escape(", ".join(names)))  # fmt: skip


def test_a_missing_base_folder_is_named(shipped, bases, tmp_path):
    shutil.rmtree(bases / "tiny0")
    _refused(_with_entry(shipped), tmp_path, "no shipped base " + re.escape(str(bases / "tiny0")))


@pytest.mark.parametrize("name", [*MODEL_FILES, CONFIG_FILE])
def test_a_changed_or_missing_shipped_file_is_named(shipped, bases, tmp_path, monkeypatch, name):
    _no_pretraining(monkeypatch)
    path = bases / "tiny0" / name
    path.write_bytes(path.read_bytes() + b" ")
    _refused(
        _with_entry(shipped),
        tmp_path,
        re.escape(name) + " does not have the sha256 the entry records",
    )
    path.unlink()
    _refused(_with_entry(shipped), tmp_path, re.escape(name) + " is missing")


def test_export_refuses_a_damaged_world_a_large_base_a_bad_name_and_an_existing_base(tiny_world, bases, tmp_path, shipped):  # fmt: skip
    with pytest.raises(ValueError, match=r"over the 0\.01 MB"):
        export_base(tiny_world, "small", max_mb=0.01)
    with pytest.raises(ValueError, match=r"base name '\.\./x'"):
        export_base(tiny_world, "../x")
    with pytest.raises(ValueError, match="tiny0: already exists"):
        export_base(tiny_world, "tiny0")  # replaced only with overwrite
    assert export_base(tiny_world, "tiny0", overwrite=True) == shipped
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_world, damaged)
    (damaged / "base/model.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"base/model\.safetensors: sha256 differs"):
        export_base(damaged, "d")
    shutil.copytree(tiny_world, stray := tmp_path / "stray")
    (stray / "base/notes.txt").write_text("mine\n")  # not in world.json: never shipped unverified
    with pytest.raises(ValueError, match=r"base: notes\.txt not listed in world\.json"):
        export_base(stray, "s")
    assert sorted(p.name for p in bases.iterdir()) == ["tiny0"]


def test_cli_prints_the_worlds_variant_that_world_build_takes(tiny_world, bases, tmp_path, capsys, monkeypatch):  # fmt: skip
    assert main(["world", "export-base", str(tiny_world), "--name", "viacli"]) == 0
    text = capsys.readouterr().out
    variant = tmp_path / "v.yaml"
    variant.write_text(text)
    assert yaml.safe_load(text)["model"]["prebuilt"]["name"] == "viacli"
    _no_pretraining(monkeypatch)
    out = tmp_path / "w"
    assert main(["world", "build", "--out", str(out), "--size", "tiny", "--config", str(variant)]) == 0  # fmt: skip
    # the variant is the whole world: the same config as the preset's, the entry aside
    assert config_differences(load_variant(variant, "tiny", SEED), world_config("tiny", SEED)) == []
    assert load_variant(variant, "tiny", SEED).model.prebuilt.name == "viacli"
    assert (out / "base/model.safetensors").read_bytes() == (tiny_world / "base/model.safetensors").read_bytes()  # fmt: skip


def test_cli_pretrain_is_for_the_preset_only(tmp_path, capsys):
    variant = tmp_path / "v.yaml"
    variant.write_text("max_operand: 9\n")
    out = tmp_path / "w"
    assert main(["world", "build", "--out", str(out), "--size", "tiny", "--config", str(variant), "--pretrain"]) == 2  # fmt: skip
    assert "--pretrain applies to the preset" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("field", "table"),
    [
        ("files", {"../model.safetensors": "0" * 64}),
        ("files", {}),
        ("tokenizer_files", {"tokenizer.json": "abc"}),
        ("tokenizer_files", {"vocab.txt": "0" * 64}),
        ("tokenizer_files", {"tokenizer.json": "0" * 64, ".hidden": "0" * 64}),
    ],
)
def test_an_entry_with_bad_files_is_refused_by_name(shipped, field, table):
    with pytest.raises(ValueError, match=rf"prebuilt\.{field}"):
        _with_entry(shipped.model_copy(update={field: table}))
