"""Checkpoint content ids and recipe ids by content (trainables.model_ids).

Run: .venv/bin/python -m pytest -q tests/trainables/test_model_ids.py
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from layerswap.spaces.recipe import dump_recipe, load_recipe, parse_recipe, recipe_id
from layerswap.trainables import model_ids
from layerswap.trainables.model_ids import content_recipe_id, model_content_id


def _checkpoint(folder: Path, seed: int) -> Path:
    """A tiny sharded checkpoint folder: two shards, its index, config and a tokenizer file."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    save_file({"a": rng.standard_normal((4, 4), dtype=np.float32)}, str(folder / "m-1.safetensors"))
    save_file({"b": rng.standard_normal((4,), dtype=np.float32)}, str(folder / "m-2.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    index = {"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "tokenizer_config.json").write_text("{}")
    return aged(folder)


def aged(folder: Path, seconds: int = 3600) -> Path:
    """Date every file of `folder` `seconds` back, as experts trained before a search are: a
    digest is kept only for files older than model_ids.RACY_NS."""
    for f in folder.iterdir():
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns - seconds * 1_000_000_000))
    return folder


@pytest.fixture
def experts(tmp_path) -> dict[str, Path]:
    return {k: _checkpoint(tmp_path / "run1" / k, seed) for seed, k in enumerate(("t", "l", "b"))}


def _swap(experts: dict[str, Path]):
    return parse_recipe(
        {
            "method": "layer_swap",
            "task_expert": str(experts["t"]),
            "language_expert": {"soup": [str(experts["l"]), str(experts["b"])]},
            "base": str(experts["b"]),
            "bottom": 1,
            "top": 0,
        }
    )


def test_a_copy_elsewhere_has_the_same_ids(experts, tmp_path):
    moved = {k: shutil.copytree(p, tmp_path / "machine2" / "store" / k) for k, p in experts.items()}
    for k in experts:
        assert model_content_id(str(moved[k])) == model_content_id(str(experts[k]))
        assert model_content_id(str(experts[k])).startswith("sha256:")
    here, there = _swap(experts), _swap(moved)
    assert recipe_id(here) != recipe_id(there)  # the paths differ ...
    assert content_recipe_id(here) == content_recipe_id(there)  # ... the content does not


def test_different_experts_different_ids(experts):
    assert len({model_content_id(str(p)) for p in experts.values()}) == 3


def test_one_changed_byte_changes_the_ids(experts):
    before, rid = model_content_id(str(experts["l"])), content_recipe_id(_swap(experts))
    shard = experts["l"] / "m-2.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor
    # File systems stamp mtimes at a clock tick (ms): a real rewrite of a hashed expert (a new
    # training run) comes later than the next tick, and so does this one.
    time.sleep(0.05)
    shard.write_bytes(bytes(data))
    assert model_content_id(str(experts["l"])) != before
    assert content_recipe_id(_swap(experts)) != rid


def test_the_config_counts_the_tokenizer_and_index_do_not(experts):
    before = model_content_id(str(experts["t"]))
    (experts["t"] / "tokenizer_config.json").write_text('{"padding_side": "left"}')
    (experts["t"] / "model.safetensors.index.json").write_text("{}")
    assert model_content_id(str(experts["t"])) == before
    (experts["t"] / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert model_content_id(str(experts["t"])) != before


@pytest.mark.parametrize("ref", ["org/model", "s3://bucket/experts/math", "hf://org/model"])
def test_a_hub_id_or_uri_stands_for_itself(ref):
    assert model_content_id(ref) == ref


def test_a_recipe_over_hub_ids_is_its_own_id():
    r = parse_recipe({"method": "soup", "models": ["org/a", "s3://b/c"]})
    assert content_recipe_id(r) == recipe_id(r, {"org/a": "org/a", "s3://b/c": "s3://b/c"})


def test_a_folder_with_nothing_to_hash_stands_for_itself(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("not a checkpoint")
    assert model_content_id(str(tmp_path / "empty")) == str(tmp_path / "empty")
    (tmp_path / "cfg").mkdir()  # a LoRA base read for its config only
    (tmp_path / "cfg" / "config.json").write_text("{}")
    assert model_content_id(str(tmp_path / "cfg")).startswith("sha256:")


def test_unchanged_files_are_read_once(experts, monkeypatch):
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file).startswith(str(experts["t"].parent)):
            opened.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    first = model_content_id(str(experts["t"]))
    assert sorted(opened) == ["config.json", "m-1.safetensors", "m-2.safetensors"]
    opened.clear()
    assert model_content_id(str(experts["t"])) == first
    content_recipe_id(_swap(experts))  # t again, and l, b for the first time (b only once)
    assert sorted(opened) == sorted(["config.json", "m-1.safetensors", "m-2.safetensors"] * 2)
    opened.clear()
    (experts["t"] / "config.json").write_text("{}")  # a changed file is read again, alone
    model_content_id(str(experts["t"]))
    assert opened == ["config.json"]


def test_the_yaml_keeps_the_paths_and_names_the_content_id(experts, tmp_path):
    r = _swap(experts)
    rid = content_recipe_id(r)
    path = tmp_path / "r.yaml"
    path.write_text(dump_recipe(r, rid))
    assert path.read_text().startswith(f"# layerswap recipe {rid}\n")
    assert load_recipe(path) == r and content_recipe_id(load_recipe(path)) == rid


def test_hashing_streams_in_chunks(experts, monkeypatch):
    monkeypatch.setattr(model_ids, "CHUNK", 7)  # far smaller than a shard: many reads
    model_ids._FILE_DIGESTS.clear()
    streamed = model_content_id(str(experts["b"]))
    monkeypatch.setattr(model_ids, "CHUNK", 1 << 30)
    model_ids._FILE_DIGESTS.clear()
    assert model_content_id(str(experts["b"])) == streamed


def test_nested_digest_blocks_each_save_their_own(experts, tmp_path, monkeypatch):
    """Two blocks open at once (their sets of used digests equal): each writes its file, and the
    inner one's end does not take the outer one's record (it raised in the outer `finally`)."""
    monkeypatch.setattr(model_ids, "_FILE_DIGESTS", {})
    outer, inner = tmp_path / "outer.json", tmp_path / "inner.json"
    with model_ids.saved_digests(outer):
        with model_ids.saved_digests(inner):
            pass
        model_content_id(str(experts["t"]))
    assert not inner.exists()  # the inner block hashed nothing
    saved = json.loads(outer.read_text())["files"]
    assert sorted(Path(f["path"]).name for f in saved) == ["config.json", "m-1.safetensors", "m-2.safetensors"]  # fmt: skip


def test_digests_that_cannot_be_saved_are_one_line_not_an_error(experts, tmp_path, monkeypatch, capsys):  # fmt: skip
    """The digest file is a cache: a refused write (here a folder in its place) is one line and
    the block's own work stands; an error the block raises is the one that comes out."""
    monkeypatch.setattr(model_ids, "_FILE_DIGESTS", {})
    blocked = tmp_path / "ids.json"
    blocked.mkdir()
    with model_ids.saved_digests(blocked):
        model_content_id(str(experts["t"]))
    assert f"layerswap: {blocked}: file digests not saved" in capsys.readouterr().err
    monkeypatch.setattr(model_ids, "_FILE_DIGESTS", {})
    with pytest.raises(KeyboardInterrupt), model_ids.saved_digests(blocked):
        model_content_id(str(experts["l"]))
        raise KeyboardInterrupt


def test_a_same_size_rewrite_within_one_timestamp_tick_is_not_missed(tmp_path, monkeypatch):
    """A file rewritten in place with the same size and mtime (what a coarse timestamp tick shows
    for two writes within it) keeps its cache key: its digest must not have been kept."""
    folder = _checkpoint(tmp_path / "fresh", 0)
    cfg = folder / "config.json"
    cfg.write_text('{"model_type": "llama", "num_hidden_layers": 2}')  # written just now
    first = model_content_id(str(folder))
    st, key = cfg.stat(), model_ids._file_key(cfg)
    with open(cfg, "r+") as f:  # same inode, same size, one byte changed
        f.write('{"model_type": "llama", "num_hidden_layers": 3}')
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same tick
    assert model_ids._file_key(cfg) == key  # path, size, mtime, inode: all as before
    assert model_content_id(str(folder)) != first
    # Once the file is older than the window, its digest is kept: read once more, then never.
    aged(folder)
    opened = []
    real = model_ids._file_sha256
    monkeypatch.setattr(model_ids, "_file_sha256", lambda p: opened.append(p) or real(p))
    ids = {model_content_id(str(folder)) for _ in range(3)}
    assert len(ids) == 1 and len(opened) == 3  # config.json and two shards, once each


def test_a_file_dated_in_the_future_is_still_read_once(tmp_path, monkeypatch):
    """A file server whose clock runs ahead dates every expert in the future: its digests are
    kept (never keeping them would re-read the experts for every recipe)."""
    folder = aged(_checkpoint(tmp_path / "ahead", 0), seconds=-7200)  # an hour ahead of now
    opened = []
    real = model_ids._file_sha256
    monkeypatch.setattr(model_ids, "_file_sha256", lambda p: opened.append(p) or real(p))
    assert len({model_content_id(str(folder)) for _ in range(3)}) == 1
    assert len(opened) == 3  # config.json and two shards, once each


def test_a_digest_file_from_before_the_racy_rule_is_not_trusted(experts, tmp_path, monkeypatch):
    """Format 1 was written before the RACY_NS rule, so it may hold a digest taken while its file
    was still being written: its entries are ignored, even for a key that matches today."""
    monkeypatch.setattr(model_ids, "_FILE_DIGESTS", {})
    truth = model_content_id(str(experts["t"]))
    monkeypatch.setattr(model_ids, "_FILE_DIGESTS", {})
    cfg = experts["t"] / "config.json"
    key = model_ids._file_key(cfg)
    stale = {"path": key[0], "size": key[1], "mtime_ns": key[2], "inode": key[3], "sha256": "0" * 64}  # fmt: skip
    ids = tmp_path / "model_ids.json"
    ids.write_text(json.dumps({"format": 1, "files": [stale]}))
    with model_ids.saved_digests(ids):
        assert model_content_id(str(experts["t"])) == truth
    saved = json.loads(ids.read_text())
    assert saved["format"] == model_ids.DIGESTS_FORMAT
    assert "0" * 64 not in {f["sha256"] for f in saved["files"]}
