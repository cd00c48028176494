"""A --resume of a changed experiment is refused naming each changed field with its old and new
value, beyond search/promote (search/search_dir.py: check_search_dir). Run:
.venv/bin/python -m pytest -q tests/search/test_search_changed_fields.py
"""

from __future__ import annotations

import pytest
from search_fixtures import RayWouldStart, experiment

from layerswap.search import search as search_mod
from layerswap.trainables.outputs import OutputError


def test_a_changed_experiment_is_refused_naming_each_field(started, tiny_world):
    exp, sdir, paths = started
    run = sdir.parent
    budget = exp.model_copy(update={"search": exp.search.model_copy(update={"num_samples": 9})})
    with pytest.raises(RayWouldStart):  # the budget may change
        search_mod.run_search(budget, run, resume=True, progress=False)
    other = experiment(tiny_world, {**paths, "task": paths["language2"]}, proxy_eval={"limit": 6})
    with pytest.raises(OutputError) as e:
        search_mod.run_search(other, run, resume=True, progress=False)
    said = str(e.value)
    assert f"task_experts[0] was '{paths['task']}', is now '{paths['language2']}'" in said, said
    assert "proxy_eval.limit was 8, is now 6" in said, said
    assert "search." not in said and "promote." not in said


def test_many_changed_fields_are_capped(started, tiny_world):
    _, sdir, paths = started
    space = {k: {"low": 0, "high": 0} for k in ("bottom", "top", "bottom_transition")}
    other = experiment(tiny_world, paths, name="u", proxy_eval={"limit": 6}, space=space)
    with pytest.raises(OutputError, match=r"; and \d+ more; "):
        search_mod.run_search(other, sdir.parent, resume=True, progress=False)
