"""A resumed search refuses to continue once a pool checkpoint's generation settings changed
(its earlier trials decoded otherwise), naming the checkpoint and both digests, before Ray
starts; a run folder saved before the record existed resumes with one line saying so
(search/search_dir.py: pool_decoding, check_decoding). Run:
.venv/bin/python -m pytest -q tests/search/test_search_decoding.py
"""

from __future__ import annotations

import json

import pytest
from search_fixtures import RayWouldStart

from layerswap.search import search as search_mod
from layerswap.search.pool import resolve_pool
from layerswap.search.search_dir import (
    DECODING,
    check_decoding,
    pool_decoding,
    write_decoding,
)
from layerswap.trainables.outputs import OutputError


def test_a_resume_after_an_expert_decodes_otherwise_is_refused_by_name(started):
    exp, sdir, paths = started
    with pytest.raises(RayWouldStart):  # unchanged: the checks pass
        search_mod.run_search(exp, sdir.parent, resume=True, progress=False)
    before = json.loads((sdir / DECODING).read_text())["decoding"][str(paths["language"])]
    (paths["language"] / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "repetition_penalty": 1.05})
    )
    with pytest.raises(OutputError) as e:
        search_mod.run_search(exp, sdir.parent, resume=True, progress=False)
    now = pool_decoding(resolve_pool(exp))[str(paths["language"])]
    assert now != before
    said = str(e.value)
    assert f"{paths['language']}: decoding {before} when the search started, {now} now" in said
    assert str(paths["task"]) not in said  # the unchanged expert is not named


def test_a_run_without_the_record_resumes_saying_it_could_not_compare(started, capsys):
    exp, sdir, _ = started
    (sdir / DECODING).unlink()
    check_decoding(sdir, pool_decoding(resolve_pool(exp)), resume=True)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "decoding could not be compared" in err, err
    check_decoding(sdir, {"x": "y"}, resume=False)  # a new search compares nothing


@pytest.mark.parametrize("rule", [1, 2, 3])
def test_a_record_of_an_earlier_digest_rule_is_said_not_compared(started, capsys, rule):
    """Digests of an earlier rule (1: every setting hashed; 2: sampling fields of a greedy
    config and repeated eos ids too; 3: not contrastive search's top_k) differ for equal or
    differ for unequal settings: comparing them would refuse a resume for nothing or pass one
    wrongly, so the record is named, not compared."""
    exp, sdir, _ = started
    record = json.loads((sdir / DECODING).read_text())
    old = {"format": rule, "decoding": {ref: "0" * 16 for ref in record["decoding"]}}
    (sdir / DECODING).write_text(json.dumps(old))
    check_decoding(sdir, pool_decoding(resolve_pool(exp)), resume=True)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"digest rule {rule}, now 4" in err, err


def test_a_checkpoint_not_in_the_cache_at_the_start_is_said_not_compared(tmp_path, capsys):
    """A Hub id the first trial downloads had no settings here when the search started: its
    digest then (None) is no change, and the line names it."""
    sdir = tmp_path / "search"
    sdir.mkdir()
    (sdir / "experiment.json").write_text("{}")
    write_decoding(sdir, {"org/base-8b": None, "/e/task": "aa"})
    check_decoding(sdir, {"org/base-8b": "bb", "/e/task": "aa"}, resume=True)
    err = capsys.readouterr().err
    assert "org/base-8b could not be compared" in err and "/e/task" not in err, err
    with pytest.raises(OutputError, match="/e/task: decoding aa when the search started, cc now"):
        check_decoding(sdir, {"org/base-8b": "bb", "/e/task": "cc"}, resume=True)
