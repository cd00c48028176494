"""A shipped world base: exported from a built world, reused by `world build` only for the world
it was pretrained for, byte for byte; every mismatch named, nothing half-written.

Run `.venv/bin/python -m pytest -q tests/world/test_world_prebuilt.py`.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

import world.prebuilt as prebuilt
from cli import main
from spaces.world import load_variant, with_overrides, world_config
from world import build_world
from world.prebuilt import MODEL_FILES, config_sha256, export_base

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

    monkeypatch.setattr("world.model.pretrain", refuse)


def test_export_copies_the_base_and_records_its_hashes(tiny_world, bases, shipped):
    assert sorted(p.name for p in (bases / "tiny0").iterdir() if not p.name.startswith(".")) == sorted(shipped.files)  # fmt: skip
    for name in shipped.files:
        assert (bases / "tiny0" / name).read_bytes() == (tiny_world / "base" / name).read_bytes()
    manifest = json.loads((tiny_world / "world.json").read_text())
    assert shipped.files["model.safetensors"] == manifest["sha256"]["base/model.safetensors"]
    assert shipped.corpus_sha256 == manifest["sha256"]["corpus/pretrain.txt"]
    assert shipped.config_sha256 == config_sha256(world_config("tiny", SEED))
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


def _refused(cfg, tmp_path, match):
    out = tmp_path / "w"
    with pytest.raises(ValueError, match=match):
        build_world(out, seed=cfg.seed, size="tiny", config=cfg, progress=False)
    assert not out.exists()  # nothing half-written
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".w")] == []


def test_another_world_config_is_refused(shipped, tmp_path, monkeypatch):
    _no_pretraining(monkeypatch)
    _refused(_with_entry(shipped, seed=1), tmp_path, "'tiny0' was pretrained for another world config")  # fmt: skip
    other = with_overrides(_with_entry(shipped), {"model": {"steps": 9}}, "test")
    _refused(other, tmp_path, "another world config")


def test_a_changed_corpus_or_tokenizer_is_refused(shipped, tmp_path, monkeypatch):
    _no_pretraining(monkeypatch)
    drifted = shipped.model_copy(update={"corpus_sha256": "0" * 64})
    _refused(_with_entry(drifted), tmp_path, "the corpus generated now differs")
    files = dict(shipped.files, **{"tokenizer.json": "0" * 64})
    _refused(_with_entry(shipped.model_copy(update={"files": files})), tmp_path, r"tokenizer\.json trained now differs")  # fmt: skip


@pytest.mark.parametrize("name", MODEL_FILES)
def test_a_changed_or_missing_shipped_file_is_named(shipped, bases, tmp_path, monkeypatch, name):
    _no_pretraining(monkeypatch)
    path = bases / "tiny0" / name
    path.write_bytes(path.read_bytes() + b" ")
    _refused(_with_entry(shipped), tmp_path, re.escape(name) + " does not have the sha256")
    path.unlink()
    _refused(_with_entry(shipped), tmp_path, re.escape(name) + " is missing")


def test_export_refuses_a_damaged_world_a_large_base_a_bad_name_and_an_existing_base(tiny_world, bases, tmp_path, shipped):  # fmt: skip
    with pytest.raises(ValueError, match=r"over the 0\.01 MB"):
        export_base(tiny_world, "small", max_mb=0.01)
    with pytest.raises(ValueError, match=r"base name '\.\./x'"):
        export_base(tiny_world, "../x")
    with pytest.raises(ValueError, match="tiny0"):
        export_base(tiny_world, "tiny0")  # exists: replaced only with overwrite
    assert export_base(tiny_world, "tiny0", overwrite=True) == shipped
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_world, damaged)
    (damaged / "base/model.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"base/model\.safetensors: sha256 differs"):
        export_base(damaged, "d")
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
    assert config_sha256(load_variant(variant, "tiny", SEED)) == config_sha256(world_config("tiny", SEED))  # fmt: skip
    assert load_variant(variant, "tiny", SEED).model.prebuilt.name == "viacli"
    assert (out / "base/model.safetensors").read_bytes() == (tiny_world / "base/model.safetensors").read_bytes()  # fmt: skip


@pytest.mark.parametrize(
    "files",
    [{"../model.safetensors": "0" * 64}, {"model.safetensors": "abc"}, {}],
)
def test_an_entry_with_bad_files_is_refused_by_name(shipped, files):
    with pytest.raises(ValueError, match=r"prebuilt\.files"):
        _with_entry(shipped.model_copy(update={"files": files}))
