"""A resumed promotion whose every model is kept loads no weights and leaves RUN/best/ as it is,
unless best/ no longer holds the chosen recipe complete: an expert retrained in place, a best/
of another recipe or with a file missing is merged again (search/promote.py,
search/promote_best.py).

Run: .venv/bin/python -m pytest -q tests/search/test_promote_resume_cost.py   (about 50 s)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import transformers
from audit_hook import sitecustomize as audit
from search_fixtures import experiment, make_experts, one_trial_run

from layerswap.search.promote import promote
from layerswap.spaces.recipe import LayerSwapRecipe
from layerswap.trainables.merge import live
from layerswap.trainables.merge.api import merge
from layerswap.trainables.model_ids import content_recipe_id
from layerswap.trainables.outputs import read_marker

pytestmark = pytest.mark.usefixtures("one_thread")

PROXY = [{"task": "world_belebele_xa_dev", "chance": 0.25}]


@pytest.fixture
def run(tiny_world, tmp_path):
    """(experiment, RUN, experts) after one full promotion of RUN that wrote RUN/best/."""
    made = make_experts(tiny_world, tmp_path / "made")
    paths = {k: Path(shutil.copytree(v, tmp_path / "experts" / k)) for k, v in made.items()}
    run_dir, _ = one_trial_run(tmp_path, paths)
    exp = experiment(tiny_world, paths, proxies=PROXY, promote={"top_k": 1, "limit": 2, "max_gen_toks": 4, "baselines": ["base"], "num_fewshot": 0, "write_best": True})  # fmt: skip
    assert promote(exp, run_dir, progress=False).best_dir == run_dir / "best"
    return exp, run_dir, paths


def _stats(folder: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of a folder and of every file in it: a rewrite changes them."""
    return {str(p): (p.stat().st_ino, p.stat().st_mtime_ns) for p in [folder, *folder.rglob("*")]}


def _no_loading(monkeypatch) -> None:
    """Make building the live model, loading a state dict or a tokenizer an error."""

    def refuse(*a, **kw):
        raise AssertionError("a promotion that keeps every model loaded something")

    monkeypatch.setattr(live, "LiveModel", refuse)
    monkeypatch.setattr(live, "_load_state", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)


def _best_id(run_dir: Path) -> str:
    return read_marker(run_dir / "best")["identity"]


def test_a_promotion_keeping_every_model_loads_nothing_and_keeps_best(run, monkeypatch, capsys):
    exp, run_dir, paths = run
    before = _stats(run_dir / "best")
    _no_loading(monkeypatch)
    log = run_dir.parent / "audit"
    log.mkdir()
    audit.start(log, [run_dir.parent / "experts", paths["base"], run_dir / "best"])
    try:
        res = promote(exp, run_dir, progress=True)
    finally:
        audit.stop()
    weights = [p for _, _, p in audit.read_log(log) if p.endswith(".safetensors")]
    assert weights == [], weights  # an outside record: no weight file opened, even for hashing
    assert _stats(run_dir / "best") == before  # not merged again, not rewritten
    assert res.best_dir == run_dir / "best"
    out = capsys.readouterr().out
    assert f"best/: kept, recipe {_best_id(run_dir)} already merged" in out, out


def _retrain(folder: Path) -> None:
    """The expert's weights changed in place, same file name and size (new content, new mtime)."""
    f = folder / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-8:] = bytes(8)  # the last tensor's last values: zeros
    f.write_bytes(bytes(data))


def test_an_expert_retrained_in_place_merges_best_again(run, capsys):
    exp, run_dir, paths = run
    old = _best_id(run_dir)
    _retrain(paths["language"])
    promote(exp, run_dir, progress=True)
    new = _best_id(run_dir)
    assert new != old
    recipe = (run_dir / "best" / "layerswap_recipe.yaml").read_text()
    assert new in recipe and old not in recipe  # the whole folder, not only its marker
    out = capsys.readouterr().out
    assert f"best/: merging recipe {new}" in out and "already merged" not in out, out


def test_a_best_of_another_recipe_is_merged_again(run, monkeypatch, capsys):
    exp, run_dir, paths = run
    want = _best_id(run_dir)
    other = LayerSwapRecipe(method="layer_swap", task_expert=str(paths["task"]), language_expert=str(paths["language"]), base=str(paths["base"]), bottom=0, top=0)  # fmt: skip
    merge(other, run_dir / "best", overwrite=True, fold=True)
    assert _best_id(run_dir) == content_recipe_id(other) != want
    _no_loading(monkeypatch)  # the models are still kept: only best/ is written
    promote(exp, run_dir, progress=True)
    assert _best_id(run_dir) == want
    out = capsys.readouterr().out
    assert f"best/: merging recipe {want}" in out and "already merged" not in out, out


def test_a_best_missing_a_file_is_merged_again(run, capsys):
    exp, run_dir, _ = run
    want = _best_id(run_dir)
    os.remove(run_dir / "best" / "model.safetensors")
    promote(exp, run_dir, progress=True)
    assert (run_dir / "best" / "model.safetensors").is_file() and _best_id(run_dir) == want
    assert f"best/: merging recipe {want}" in capsys.readouterr().out


def test_a_best_with_a_foreign_marker_is_merged_again(run, capsys):
    """A marker naming the right recipe but no file list (hand-made, or another writer's) is
    not taken as a complete merge."""
    exp, run_dir, _ = run
    want = _best_id(run_dir)
    mark = run_dir / "best" / ".layerswap.json"
    m = json.loads(mark.read_text())
    del m["files"]
    mark.write_text(json.dumps(m))
    promote(exp, run_dir, progress=True)
    assert "files" in read_marker(run_dir / "best")
    assert f"best/: merging recipe {want}" in capsys.readouterr().out
