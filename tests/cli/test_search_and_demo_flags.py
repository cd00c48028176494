"""`layerswap search` / `layerswap demo` output switches: `--verbose` reaches the search (Ray's and
Tune's notices) and promotion (lm-eval's bars and log), off by default. The search and promotion
themselves are stubbed here; the real output of a run is checked by tests/demo/test_demo.py and
tests/cli/test_ray_output.py.

Run: .venv/bin/python -m pytest -q tests/cli/test_search_and_demo_flags.py
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from layerswap.cli import main


@pytest.fixture
def search_yaml(tiny_world, expert_pair, tmp_path) -> Path:
    from tests.search.search_fixtures import experiment

    f = tmp_path / "search.yaml"
    f.write_text(yaml.safe_dump(experiment(tiny_world, expert_pair).model_dump(mode="json")))
    return f


@pytest.mark.parametrize(("flags", "verbose"), [([], False), (["--verbose"], True)])
def test_search_verbose_reaches_promotion(search_yaml, tmp_path, monkeypatch, capsys, flags, verbose):  # fmt: skip
    from layerswap.search import promote as promote_mod
    from layerswap.search import search as search_mod

    seen = {}

    def run_search(exp, run_dir, resume=False, before_writing=None, **kw):
        seen["search"] = kw
        return SimpleNamespace(n_trials=6, trials_path="T", study_path="S")

    def promote(exp, run_dir, **kw):
        seen["promote"] = kw
        return SimpleNamespace(leaderboard="L", best_dir="B")

    monkeypatch.setattr(search_mod, "run_search", run_search)
    monkeypatch.setattr(promote_mod, "promote", promote)
    assert main(["search", str(search_yaml), "--out", str(tmp_path / "run"), *flags]) == 0
    # Ray's and Tune's notices in the search, lm-eval's bars in promotion (test_ray_output.py)
    assert seen == {"search": {"verbose": verbose}, "promote": {"verbose": verbose}}
    assert "[search] 6 trial(s) in T; study S" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "verbose"), [([], False), (["--verbose"], True)])
def test_demo_verbose_reaches_the_pipeline(tmp_path, monkeypatch, flags, verbose):
    from layerswap.demo import pipeline as demo_mod

    seen = {}
    monkeypatch.setattr(demo_mod, "run_demo", lambda out, **kw: seen.update(kw))
    assert main(["demo", "--out", str(tmp_path / "d"), *flags]) == 0
    assert seen["verbose"] is verbose
