"""The search never asks Ray for more trials at once than the cluster holds, and its reproducible
batches propose the same trials whatever that is.

A trial left pending is a placement-group request, which starts nodes on an autoscaling cluster:
with a batch larger than the cluster (a quarter of num_samples) the search used to ask for the
whole batch. Run: .venv/bin/python -m pytest -q tests/search/test_search_concurrency.py  (slow)
"""

from __future__ import annotations

import threading
import time

import pytest
from search_fixtures import experiment, make_experts

from layerswap.trainables.atomic import read_parquet

pytestmark = pytest.mark.slow

KEPT = ("trial_id", "recipe_id", "status", "objective", "fidelity", "items_scored")


def _table(run) -> list[tuple]:
    return [tuple(r[k] for k in KEPT) for r in read_parquet(run / "search" / "trials.parquet").to_pylist()]  # fmt: skip


def _search_watching_placement_groups(exp, out) -> set[str]:
    """Run the search; return every placement-group state seen while it ran."""
    import ray

    from layerswap.search.search import run_search

    seen, done = set(), threading.Event()

    def watch():
        while not done.is_set():
            seen.update(v["state"] for v in ray.util.placement_group_table().values())
            time.sleep(0.1)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        run_search(exp, out, progress=False)
    finally:
        done.set()
        t.join()
    return seen


def test_batches_larger_than_the_cluster_wait_for_slots_and_propose_the_same(
    tiny_world, tmp_path, ray_cluster
):
    paths = make_experts(tiny_world, tmp_path / "experts")
    # No max_concurrent: batches of a quarter of 8 = 2; a 1-CPU worker runs 1 at once.
    exp = experiment(tiny_world, paths, search={"num_samples": 8, "max_concurrent": None, "seed": 1})  # fmt: skip
    with ray_cluster(workers=1, cpus=1):
        states = _search_watching_placement_groups(exp, tmp_path / "small")
    assert "CREATED" in states and "PENDING" not in states, states
    with ray_cluster(workers=1, cpus=2):
        _search_watching_placement_groups(exp, tmp_path / "big")
    small = _table(tmp_path / "small")
    assert len(small) == 8 and small == _table(tmp_path / "big")
