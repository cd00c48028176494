"""search/trial_fit.py and the search's trials-at-once: a trial is placed on one node, so what fits
and how many run at once is judged per node, never from the cluster's totals.

Run: .venv/bin/python -m pytest -q tests/search/test_trial_fit.py   (one slow test: a 3-node Ray)
"""

from __future__ import annotations

import pytest
from search_fixtures import experiment, make_experts

from layerswap.search.search import _trial_resources, run_search
from layerswap.search.trial_fit import check_trials_fit, trial_fit_problem
from layerswap.spaces.search_experiment import SearchSettings


def _node(cpu: float, gpu: float = 0, alive: bool = True) -> dict:
    return {"Alive": alive, "Resources": {"CPU": cpu} | ({"GPU": gpu} if gpu else {})}


@pytest.mark.parametrize(
    "search, nodes, says",
    [
        # The red team's cluster: 2 CPUs in total, but no node holds one trial.
        (
            {"cpus_per_trial": 2},
            [_node(1), _node(1)],
            "search.cpus_per_trial 2: no node of this Ray cluster holds one trial (the largest has 1 CPU; its nodes: 1 CPU; 1 CPU); lower it",
        ),
        (
            {"gpus_per_trial": 0.5},
            [_node(8)],
            "search.gpus_per_trial 0.5: no node of this Ray cluster holds one trial (the largest has 0 GPU; its nodes: 8 CPU); set it to 0 to search on CPUs",
        ),
        # Each setting fits some node, no node both: both are named.
        (
            {"cpus_per_trial": 4, "gpus_per_trial": 1},
            [_node(8), _node(2, 1)],
            "search.cpus_per_trial 4 and search.gpus_per_trial 1: no node",
        ),
        # A dead node holds nothing.
        (
            {"cpus_per_trial": 2},
            [_node(1), _node(8, alive=False)],
            "(the largest has 1 CPU; its nodes: 1 CPU)",
        ),
        ({}, [], "(the largest has 0 CPU; its nodes: none)"),
    ],
)
def test_a_trial_no_node_holds_is_named(search, nodes, says):
    problem = trial_fit_problem(SearchSettings(**search), nodes)
    assert problem is not None and says in "; ".join(problem), problem


def test_a_trial_some_node_holds_passes():
    assert trial_fit_problem(SearchSettings(cpus_per_trial=2), [_node(1), _node(2)]) is None
    assert trial_fit_problem(SearchSettings(gpus_per_trial=0.1), [_node(1, 1)]) is None


def test_trials_at_once_sum_each_nodes_room(tmp_path):
    paths = {k: tmp_path / k for k in ("base", "task", "language")}

    def at_once(nodes, **search):
        exp = experiment(tmp_path / "w", paths, search={"max_concurrent": None, "num_samples": 64} | search)  # fmt: skip
        return _trial_resources(exp, nodes)[0]

    # Two 3-CPU nodes hold one 2-CPU trial each: 2, not the totals' 6 // 2 = 3.
    assert at_once([_node(3), _node(3)], cpus_per_trial=2) == 2
    # Two 1-GPU nodes, 0.4 GPU a trial: 2 per node, not the totals' 2 / 0.4 = 5.
    assert at_once([_node(8, 1), _node(8, 1)], gpus_per_trial=0.4) == 4
    # Half a GPU a trial on an 8-CPU and a 1-CPU node of 1 GPU each: 2 + 1, not min(9, 2 / 0.5).
    assert at_once([_node(8, 1), _node(1, 1)], gpus_per_trial=0.5) == 3
    assert at_once([_node(16, 1, alive=False), _node(2)]) == 2


@pytest.mark.slow
def test_search_no_node_holds_is_refused_before_anything(
    tiny_world, tmp_path, ray_cluster, monkeypatch, capsys, nothing_written
):
    """Two 1-CPU worker nodes, 2 CPUs a trial: joined, it says what it waits for; on a Ray this
    command started (faked: a Cluster is always joined), the search is refused, RUN unwritten.
    Before, it waited in Tune's queue forever, saying '1 trial(s) at once'."""
    paths = make_experts(tiny_world, tmp_path / "experts")
    exp = experiment(tiny_world, paths, search={"cpus_per_trial": 2, "fidelity": {"screen": None}})
    with ray_cluster(workers=2, cpus=1):
        check_trials_fit(exp.search)
        err = capsys.readouterr().err
        assert "search.cpus_per_trial 2: no node of this Ray cluster holds one trial (the largest has 1 CPU" in err  # fmt: skip
        assert "waiting for the autoscaler to add a node that holds one trial" in err
        monkeypatch.setattr("layerswap.trainables.train.ray_capacity.started_here", lambda: True)
        with pytest.raises(ValueError, match=r"search\.cpus_per_trial 2: .*the largest has 1 CPU"):
            run_search(exp, tmp_path / "run", progress=False)
    nothing_written(tmp_path / "run")
