"""Fixtures of the search tests: a search that recorded its start, whose --resume stops where
Ray would start (`started`). Run: .venv/bin/python -m pytest -q tests/search/test_search_contents.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from search_fixtures import RayWouldStart, experiment, make_experts

from layerswap.search import search as search_mod
from layerswap.search.pool import resolve_pool
from layerswap.search.search_dir import (
    pool_contents,
    pool_decoding,
    search_identity,
    write_contents,
    write_decoding,
)
from layerswap.trainables.outputs import write_marker


@pytest.fixture
def started(tiny_world, tmp_path, monkeypatch):
    """(experiment, RUN/search, experts) of a search that recorded its start, as run_search does;
    starting Ray raises RayWouldStart (every check before it has passed)."""
    made = make_experts(tiny_world, tmp_path / "made")
    paths = {k: Path(shutil.copytree(v, tmp_path / "experts" / k)) for k, v in made.items()}
    exp = experiment(tiny_world, paths)
    sdir = tmp_path / "run" / "search"
    sdir.mkdir(parents=True)
    write_marker(sdir, "search", search_identity(exp))
    (sdir / "experiment.json").write_text(exp.explicit().model_dump_json(indent=1))
    pool = resolve_pool(exp)
    write_decoding(sdir, pool_decoding(pool))
    write_contents(sdir, pool_contents(pool))

    def no_ray(*a, **kw):
        raise RayWouldStart

    monkeypatch.setattr(search_mod, "start_checked", no_ray)
    return exp, sdir, paths
