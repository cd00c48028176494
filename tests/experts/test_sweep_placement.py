"""Where a sweep trial runs on a multi-node cluster: one that drives a nested TorchTrainer on
the head node (experts/scoring.trial_resources), so losing a worker node cannot take it.

Run: .venv/bin/python -m pytest -q tests/experts/test_sweep_placement.py   (slow: a Ray cluster)
"""

from __future__ import annotations

import pytest

from layerswap.experts.scoring import trial_resources
from layerswap.experts.sweep import SweepSetup
from layerswap.spaces.sweep import SweepConfig


def _setup(executor: str) -> SweepSetup:
    return SweepSetup(
        experiment={"scaling": {"use_gpu": True}},
        sweep=SweepConfig(),
        tasks=["t"], metric_task="t", include_path=None, int_params=set(),
        executor=executor, storage="unused",
    )  # fmt: skip


@pytest.mark.slow
def test_a_ray_train_sweep_trial_lands_on_a_cpu_less_head(ray_cluster, tmp_path):
    """From outside: the node a trial process runs on, on a cluster whose head has no CPUs
    (as `ray start --head --num-cpus=0` sets up) and one worker node."""
    import ray
    from ray import tune

    def trial(config):
        tune.report({"node": ray.get_runtime_context().get_node_id()})

    with ray_cluster(workers=1, cpus=2) as (cluster, nodes):
        resources = trial_resources(_setup("ray_train"))
        tuner = tune.Tuner(
            tune.with_resources(trial, resources),
            param_space={"i": tune.grid_search([0, 1, 2])},
            run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
        )
        ran_on = {r.metrics["node"] for r in tuner.fit()}
        head = cluster.head_node.node_id
    assert ran_on == {head} and head != nodes["w1"].node_id
