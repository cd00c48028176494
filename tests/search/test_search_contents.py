"""A resumed search refuses to continue once a pool checkpoint's weights or configs changed on
disk (its earlier trials scored the old ones), naming the checkpoint and both content ids, before
Ray starts and writing nothing; a run folder saved before the record existed resumes with one
line saying so (search/search_dir.py: pool_contents, check_contents). Run:
.venv/bin/python -m pytest -q tests/search/test_search_contents.py
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from search_fixtures import RayWouldStart

from layerswap.search import search as search_mod
from layerswap.search.search_dir import CONTENTS, check_contents, write_contents
from layerswap.trainables.model_ids import model_content_id
from layerswap.trainables.outputs import OutputError


def _files(sdir):
    return {p.name: p.read_bytes() for p in sdir.iterdir()}


def test_a_resume_after_an_expert_changed_on_disk_is_refused_by_name(started):
    exp, sdir, paths = started
    with pytest.raises(RayWouldStart):  # unchanged: the checks pass
        search_mod.run_search(exp, sdir.parent, resume=True, progress=False)
    lang = str(paths["language"])
    before = json.loads((sdir / CONTENTS).read_text())["contents"][lang]
    assert before == model_content_id(lang)
    # As `train --overwrite` into the same folder does: another checkpoint's weights, same path.
    tmp = paths["language"] / ".model.safetensors.tmp"
    shutil.copyfile(paths["language2"] / "model.safetensors", tmp)
    os.replace(tmp, paths["language"] / "model.safetensors")
    written = _files(sdir)
    with pytest.raises(OutputError) as e:
        search_mod.run_search(exp, sdir.parent, resume=True, progress=False)
    now = model_content_id(lang)
    assert now != before
    said = str(e.value)
    assert f"{lang}: content {before} when the search started, {now} now" in said, said
    assert "--out" in said and "--overwrite" in said
    assert str(paths["task"]) not in said  # the unchanged expert is not named
    assert _files(sdir) == written  # refused before writing anything, model_ids.json included


def test_a_run_without_the_record_resumes_saying_it_could_not_compare(started, capsys):
    exp, sdir, _ = started
    (sdir / CONTENTS).unlink()
    with pytest.raises(RayWouldStart):
        search_mod.run_search(exp, sdir.parent, resume=True, progress=False)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "contents could not be compared" in err, err


def test_a_checkpoint_that_is_not_a_local_folder_is_said_not_compared(tmp_path, capsys):
    """A Hub id or URI is not hashed here (its content id is its name): None, not a change."""
    sdir = tmp_path / "search"
    sdir.mkdir()
    (sdir / "experiment.json").write_text("{}")
    write_contents(sdir, {"org/base-8b": None, "/e/task": "sha256:aa"})
    check_contents(sdir, {"org/base-8b": None, "/e/task": "sha256:aa"}, resume=True)
    err = capsys.readouterr().err
    assert "org/base-8b could not be compared" in err and "/e/task" not in err, err
    with pytest.raises(OutputError, match="/e/task: content sha256:aa when the search started, sha256:bb now"):  # fmt: skip
        check_contents(sdir, {"org/base-8b": None, "/e/task": "sha256:bb"}, resume=True)
    check_contents(sdir, {"/e/task": "sha256:bb"}, resume=False)  # a new search compares nothing
