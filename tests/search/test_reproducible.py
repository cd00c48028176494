"""A seed fixes the search: two runs whose concurrent trials finish in random order, the second
over copied experts in another run folder, write the same trial table (reproducible mode).

Run: .venv/bin/python -m pytest -q tests/search/test_reproducible.py   (slow: two tiny searches)
"""

from __future__ import annotations

import shutil

import pytest
from search_fixtures import experiment, make_experts

from layerswap.trainables.atomic import read_parquet

# What must repeat: which recipe each trial scored and what it scored (timings and hosts differ).
KEPT = ("trial_id", "recipe_id", "status", "objective", "fidelity", "items_scored", "rungs")


def _table(run) -> list[tuple]:
    rows = read_parquet(run / "search" / "trials.parquet").to_pylist()
    proxies = sorted(k for k in rows[0] if k.startswith("proxy__"))
    return [tuple(r[k] for k in (*KEPT, *proxies)) for r in rows]


@pytest.mark.slow
def test_jittered_concurrent_runs_and_a_copied_run_write_the_same_table(
    tiny_world, tmp_path, monkeypatch, ray_one_node
):
    from layerswap.search.search import run_search

    world = tiny_world  # the session's (only read here): a world build of its own costs more
    paths = make_experts(world, tmp_path / "experts")
    # Trials sleep up to 1.5 s (unseeded) before reporting: the finishing order varies.
    monkeypatch.setenv("LAYERSWAP_TRIAL_JITTER_S", "1.5")
    search = {"num_samples": 6, "max_concurrent": 2, "seed": 3, "fidelity": {"policy": "halving", "eta": 2}}  # fmt: skip
    exp = experiment(world, paths, search=search)
    # The same world and experts under other paths (content ids must not see the move).
    shutil.copytree(tmp_path / "experts", tmp_path / "moved" / "experts")
    shutil.copytree(world, tmp_path / "moved" / "world")
    moved = {k: tmp_path / "moved" / "experts" / p.name for k, p in paths.items() if k != "base"}
    moved["base"] = tmp_path / "moved" / "world" / "base"
    exp_moved = experiment(tmp_path / "moved" / "world", moved, search=search)
    with ray_one_node():
        run_search(exp, tmp_path / "a", progress=False)
        run_search(exp_moved, tmp_path / "moved" / "run", progress=False)
    a = _table(tmp_path / "a")
    assert len(a) == 6 and len({r[1] for r in a}) > 1
    assert _table(tmp_path / "moved" / "run") == a
